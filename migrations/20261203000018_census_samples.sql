-- The console's overview: each census turn (one process per deployment per
-- census_interval_s) also writes a sample of the queue, one row per tenant
-- with jobs open or submitted since the previous turn and one for the whole
-- deployment (tenant_id NULL). A tenant without a row at a turn had nothing
-- open and submitted nothing. Samples are kept for an hour; they are counts,
-- never content, so an erasure has nothing to remove here.
CREATE TABLE census_samples (
    taken_at        timestamptz NOT NULL,
    tenant_id       uuid,
    queued          bigint      NOT NULL,
    running         bigint      NOT NULL,
    bbox_pending    bigint      NOT NULL,
    bbox_running    bigint      NOT NULL,
    -- Seconds the oldest due queued job had waited.
    oldest_queued_s float8      NOT NULL,
    -- Jobs submitted since the previous turn.
    submitted       bigint      NOT NULL,
    -- Jobs that left queued/running since the previous turn, net of those
    -- that came back (a retry of a failed job): submitted less the growth of
    -- the open jobs, never below 0.
    finished        bigint      NOT NULL,
    -- The deployment's row: open orphans by class ({"1": 3}).
    orphans         jsonb
);
CREATE INDEX ix_census_samples ON census_samples (tenant_id, taken_at);

-- The deployment's operators: every tenant's queue, quotas and keys.
-- Never in a first key's scopes; a key is given it on purpose.
ALTER TYPE api_scope ADD VALUE 'operator';
