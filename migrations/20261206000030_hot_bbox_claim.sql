-- A bbox claim as a HOT update.
--
-- PostgreSQL writes an update in place on its page, without a new entry in
-- any index (a HOT update), only when no column an index reads changes: not
-- a key, not an expression, not a partial index's predicate. The open-bbox
-- index read `bbox_status` in its predicate, so the bbox claim (pending to
-- running), its lease renewals and a requeue each wrote a new entry in every
-- index of the table, and left the old ones for vacuum.
--
-- The set it indexes is the same when told by columns those updates leave
-- alone: a job's bbox refinement is open from the extraction's success until
-- the refinement's end (`bbox_finished_at`). The queries that look for open
-- refinements name both conditions, so the planner can use the index.
DROP INDEX ix_extractions_bbox_open;
CREATE INDEX ix_extractions_bbox_open
    ON extractions (id) WHERE status = 'succeeded' AND bbox_finished_at IS NULL;
