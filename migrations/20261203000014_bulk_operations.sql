-- Bulk actions (POST /v1/extractions/actions): cancel or retry many of a
-- tenant's jobs, named by ids or by the list's filter.
--
-- An operation walks its jobs newest first in batches. Each batch is one
-- short transaction: it moves the operation's cursor (only from where the
-- runner found it, so two runners never both apply a batch), makes the
-- batch's transitions, and writes one outcome row per job. Nothing is held
-- between batches, so an operation over 100,000 jobs never holds a lock or
-- a transaction for its length; a runner that dies leaves the cursor where
-- its last batch committed, and another takes the operation over once its
-- lease ran out.
CREATE TABLE bulk_operations (
    id            uuid        PRIMARY KEY,
    tenant_id     uuid        NOT NULL REFERENCES tenants (id),
    -- A repeat with the same key is the same operation (a no-op).
    operation_key text        NOT NULL,
    action        text        NOT NULL CHECK (action IN ('cancel', 'retry')),
    -- As the client gave it: {"ids": [...]} or {"filter": {"status": "failed", ...}}.
    selection     jsonb       NOT NULL,
    -- The walk goes on below this id (NULL: from the top).
    cursor        uuid,
    done          bigint      NOT NULL DEFAULT 0,
    refused       bigint      NOT NULL DEFAULT 0,
    not_found     bigint      NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    -- Until when its runner holds it; past it, any serving process resumes it.
    lease_until   timestamptz NOT NULL,
    UNIQUE (tenant_id, operation_key)
);

CREATE INDEX ix_bulk_operations_unfinished
    ON bulk_operations (lease_until) WHERE finished_at IS NULL;

CREATE TABLE bulk_outcomes (
    operation_id  uuid         NOT NULL REFERENCES bulk_operations (id) ON DELETE CASCADE,
    extraction_id uuid         NOT NULL,
    outcome       text         NOT NULL CHECK (outcome IN ('done', 'refused', 'not_found')),
    -- The job's state after the action (NULL when not found).
    status        text,
    -- Why it was refused.
    reason        text,
    PRIMARY KEY (operation_id, extraction_id)
);
