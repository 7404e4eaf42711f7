-- Webhooks: an outbox of deliveries, and the endpoints that asked to hear no more.
--
-- A delivery row is written by the same statement as the terminal transition it
-- announces (src/store/transitions.rs), so a crash right after the state change
-- cannot lose its webhook. Its id is the `webhook-id` header: one per job and
-- event, the same on every attempt, so a receiver can drop repeats.
CREATE TABLE webhook_deliveries (
    id               text        PRIMARY KEY,
    extraction_id    uuid        NOT NULL REFERENCES extractions (id) ON DELETE CASCADE,
    -- extraction.succeeded, extraction.failed or extraction.cancelled.
    event_type       text        NOT NULL,
    url              text        NOT NULL,
    -- The body, fixed at the state change: every attempt sends the same bytes.
    payload          jsonb       NOT NULL,
    status           text        NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'delivered', 'failed', 'disabled')),
    -- Attempts so far; the current value fences the holder of the attempt.
    attempts         integer     NOT NULL DEFAULT 0,
    -- When the next attempt is due (a retry's backoff).
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    -- Until when the current attempt is held; NULL between attempts.
    lease_expires_at timestamptz,
    last_status_code integer,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    -- Orphan class 6: the last time a reaper handed it to a dispatcher, and
    -- since when nobody was working on it.
    revived_at       timestamptz,
    orphaned_at      timestamptz
);

CREATE INDEX ix_webhook_deliveries_pending
    ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';

-- An endpoint that answered 410 Gone: no delivery is attempted to it again.
CREATE TABLE webhook_endpoints (
    url          text        PRIMARY KEY,
    disabled_at  timestamptz NOT NULL DEFAULT now(),
    reason       text        NOT NULL
);
