-- The dead letters that belong to a tenant: intake records refused after
-- their key named the tenant (invalid requests, a reused key, a full
-- queue). The letter itself is on extraction.dlq, for operators; this row
-- lets the tenant list its own letters over the API (GET /v1/dead-letters)
-- without reading the topic. Written before the letter is produced, once
-- per record (a record retried after a failed produce finds its row).
-- Purged with the tenant's retention.
CREATE TABLE tenant_dead_letters (
    id               bigserial   PRIMARY KEY,
    tenant_id        uuid        NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    source_topic     text        NOT NULL,
    source_partition integer     NOT NULL,
    source_offset    bigint      NOT NULL,
    idempotency_key  text,
    error_kind       text        NOT NULL,
    error            text        NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (source_topic, source_partition, source_offset)
);
CREATE INDEX ix_tenant_dead_letters_tenant ON tenant_dead_letters (tenant_id, id);
