-- Tenants and API keys (issue 14). Many teams share one deployment: every job
-- belongs to one tenant, every request is made with one of that tenant's API
-- keys, and an idempotency key is unique within its tenant only.
--
-- * A tenant is never removed, only marked deleted: its jobs keep their owner,
--   its keys stop working, and its name (which names its export groups) is
--   never given to another tenant.
-- * A key is stored as the SHA-256 of its text. Keys are 256 random bits, so a
--   slow password hash would buy nothing: nobody guesses one, and a stolen
--   hash cannot be turned back into a key. The first characters of the key
--   (`prefix`) are kept in the clear, so people can tell their keys apart.
-- * Rows written before this migration belong to the tenant `default`: an
--   operator gives it a key (`docstream keys create default`) to reach them.
-- * Each tenant has quotas (a submit rate and a cap on open jobs), which fall
--   back to the deployment's settings.
-- * Each tenant signs its webhooks with a secret of its own (the Standard
--   Webhooks `whsec_…` form). A rotation keeps the previous secret valid for
--   an overlap, during which every delivery carries both signatures.

CREATE TABLE tenants (
    id          uuid        PRIMARY KEY,
    -- Lower-case letters, digits, '-' and '_': it appears in export group names.
    name        text        NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz,
    -- The webhook signing secret, and during a rotation the one before it,
    -- which signs too until webhook_previous_until.
    webhook_secret          text NOT NULL CHECK (starts_with(webhook_secret, 'whsec_')),
    webhook_secret_previous text CHECK (starts_with(webhook_secret_previous, 'whsec_')),
    webhook_previous_until  timestamptz,
    -- Quotas of this tenant; NULL takes the deployment's setting, 0 means no
    -- limit. Submits per second per serve process (a token bucket holding
    -- submit_burst), and jobs queued or running at once.
    submit_rate_per_s       double precision CHECK (submit_rate_per_s >= 0),
    submit_burst            integer CHECK (submit_burst >= 1),
    max_open_jobs           integer CHECK (max_open_jobs >= 0)
);

-- The tenant default's secret: 32 random bytes (two version-4 UUIDs' worth).
INSERT INTO tenants (id, name, webhook_secret)
VALUES ('00000000-0000-0000-0000-000000000000', 'default',
        'whsec_' || encode(decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'), 'base64'));

CREATE TYPE api_scope AS ENUM ('submit', 'read', 'cancel', 'export', 'admin');

CREATE TABLE api_keys (
    id           uuid        PRIMARY KEY,
    tenant_id    uuid        NOT NULL REFERENCES tenants (id),
    -- SHA-256 of the whole key.
    secret_hash  bytea       NOT NULL UNIQUE,
    -- The key's first characters, shown by `keys list`.
    prefix       text        NOT NULL,
    scopes       api_scope[] NOT NULL CHECK (cardinality(scopes) > 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);
CREATE INDEX ix_api_keys_tenant ON api_keys (tenant_id);

-- Every job carries its tenant: the request row (where the idempotency key is
-- unique per tenant) and the job row (which the scoped reads and the operator
-- recipes filter). Written once, by the submit; no index on the job row yet.
ALTER TABLE extraction_requests
    ADD COLUMN tenant_id uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000';
ALTER TABLE extraction_requests ALTER COLUMN tenant_id DROP DEFAULT;
ALTER TABLE extractions
    ADD COLUMN tenant_id uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000';
ALTER TABLE extractions ALTER COLUMN tenant_id DROP DEFAULT;

-- A tenant's open jobs, which its cap counts (at most the cap's worth per
-- submit statement).
CREATE INDEX ix_extractions_tenant_open
    ON extractions (tenant_id) WHERE status IN ('queued', 'running');

DROP INDEX uq_extraction_requests_idempotency_key;
CREATE UNIQUE INDEX uq_extraction_requests_tenant_idempotency_key
    ON extraction_requests (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- The whole job, now with its tenant (a view's `e.*` is expanded when it is
-- made, so it is made again).
DROP VIEW extraction_rows;
CREATE VIEW extraction_rows AS
SELECT e.*, q.idempotency_key, q.request_hash, q.request,
       r.result, b.result AS bbox_result
  FROM extractions e
  JOIN extraction_requests q ON q.id = e.id
  LEFT JOIN extraction_results r ON r.id = e.id AND r.stage = 'extraction'
  LEFT JOIN extraction_results b ON b.id = e.id AND b.stage = 'bbox_refinement';
