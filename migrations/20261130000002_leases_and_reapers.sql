-- Crash safety: heartbeated leases, retries with a stored due time, cooperative
-- cancel, and the bookkeeping the reapers need to revive orphans exactly once per
-- threshold and to report how long recovery took.
ALTER TABLE extractions
    -- When a requeued job is due again.
    ADD COLUMN next_attempt_at     timestamptz,
    -- When the event of the current queued attempt was acknowledged by the
    -- broker (cleared by a requeue). A queued row without it, past its due time
    -- plus the threshold, is an orphan (class 1 or 3); a queued row with it is
    -- merely waiting in a backlog, and is left alone.
    ADD COLUMN published_at        timestamptz,
    -- Set by a cancel of a running job; the holder sees it at its next heartbeat.
    ADD COLUMN cancel_requested_at timestamptz,
    -- Last time a reaper republished this job's event: no second republish
    -- before the class's threshold passes again.
    ADD COLUMN republished_at      timestamptz,
    -- Since when the job has been an orphan (lease expiry, or due time plus
    -- threshold), kept until the next claim measures the recovery.
    ADD COLUMN orphaned_at         timestamptz,
    -- Seconds from orphaning (or lease expiry) to the claim that recovered it.
    ADD COLUMN last_recovery_s     double precision;

CREATE INDEX ix_extractions_running_lease
    ON extractions (lease_expires_at) WHERE status = 'running';
CREATE INDEX ix_extractions_queued_unpublished
    ON extractions ((COALESCE(next_attempt_at, submitted_at)))
    WHERE status = 'queued' AND published_at IS NULL;
CREATE INDEX ix_extractions_bbox_open
    ON extractions ((post_processing->'bbox_refinement'->>'status'))
    WHERE status = 'succeeded'
      AND post_processing->'bbox_refinement'->>'status' IN ('pending', 'running');
