-- The job row. Every change of `status` (and of the bbox_refinement sub-state inside
-- `post_processing`) is made by one conditional UPDATE in src/store/transitions.rs.
CREATE TABLE extractions (
    id               uuid        PRIMARY KEY,
    status           text        NOT NULL
                     CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    -- Client-chosen key that makes a submit safe to retry; NULL when the client sent none.
    idempotency_key  text,
    -- SHA-256 of the canonical request JSON: a replay with a different body is refused.
    request_hash     text        NOT NULL,
    -- The whole request: document, field specs, optional webhook_url and metadata.
    request          jsonb       NOT NULL,
    result           jsonb,
    error            text,
    -- Number of claims so far; the current value is the fencing token of the holder.
    attempts         integer     NOT NULL DEFAULT 0,
    -- Until when the current claim is held (database clock); NULL unless running.
    lease_expires_at timestamptz,
    submitted_at     timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    -- {"bbox_refinement": {"status", "attempts", "requested_at", "started_at",
    --                      "lease_expires_at", "finished_at", "result", "error"}}
    post_processing  jsonb       NOT NULL DEFAULT '{}'::jsonb
);

CREATE UNIQUE INDEX uq_extractions_idempotency_key
    ON extractions (idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE INDEX ix_extractions_status_submitted ON extractions (status, submitted_at);

-- One row per transition that won. Written by the same statement as the transition
-- (a data-modifying CTE), so the log and the row can never disagree. It is the audit
-- trail operators read and the evidence the fault tests count.
CREATE TABLE extraction_transitions (
    seq            bigserial   PRIMARY KEY,
    extraction_id  uuid        NOT NULL REFERENCES extractions (id) ON DELETE CASCADE,
    transition     text        NOT NULL,
    -- The fencing token the transition ran under (attempt number), when it has one.
    token          integer,
    at             timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX ix_extraction_transitions_extraction ON extraction_transitions (extraction_id);
