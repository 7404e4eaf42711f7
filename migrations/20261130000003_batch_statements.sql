-- Batched transitions (issue 5) must find their rows by primary key, in the
-- order of their sorted id arrays (that order is what keeps two batches over
-- the same rows from deadlocking).
--
-- The (status, submitted_at) index served no query, and the planner preferred
-- it for "status = 'succeeded' AND id IN (…)", walking every succeeded row per
-- batch; every update also paid for maintaining it.
DROP INDEX IF EXISTS ix_extractions_status_submitted;

-- The open-bbox index was keyed on the bbox status, so a batch that names its
-- rows AND says "bbox status = 'pending'" walked every pending entry (and,
-- under load, every dead one) instead of looking its ids up. Keyed on id, it
-- still gives the bbox reaper its small set of open rows, and a batch that uses
-- it looks its ids up like the primary key would.
DROP INDEX IF EXISTS ix_extractions_bbox_open;
CREATE INDEX ix_extractions_bbox_open
    ON extractions (id)
    WHERE status = 'succeeded'
      AND post_processing->'bbox_refinement'->>'status' IN ('pending', 'running');

-- A job row is rewritten about seven times in its life: vacuum the table after
-- 1% of it changed instead of 20%, without the cost-based pauses, so dead row
-- versions do not pile up under a sustained load.
ALTER TABLE extractions SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);
