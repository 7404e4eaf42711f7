-- Erasure and retention.
--
-- DELETE /v1/extractions/{id} erases a finished job's content at once: its
-- request and results, its webhook deliveries (whose payloads carry the
-- result and metadata) and its error texts. The job row and its request
-- row stay as a tombstone without content (`erased_at`): the key still
-- names the job, so a replay of it answers 410 Gone instead of making the
-- job again. The erasure is logged as the transition `erase`.
--
-- Retention purges finished jobs whole (every row of theirs, in every
-- table) once they have been finished longer than their tenant's
-- retention: `retention_s`, or the deployment's default when NULL; 0 keeps
-- them for ever.
ALTER TYPE extraction_transition ADD VALUE 'erase';
ALTER TYPE api_scope ADD VALUE 'delete';

ALTER TABLE extractions ADD COLUMN erased_at timestamptz;
ALTER TABLE extraction_requests ALTER COLUMN request DROP NOT NULL;
ALTER TABLE tenants ADD COLUMN retention_s bigint CHECK (retention_s >= 0);

-- The view's `e.*` was expanded when it was made: make it again.
DROP VIEW extraction_rows;
CREATE VIEW extraction_rows AS
SELECT e.*, q.idempotency_key, q.request_hash, q.request,
       r.result, b.result AS bbox_result
  FROM extractions e
  JOIN extraction_requests q ON q.id = e.id
  LEFT JOIN extraction_results r ON r.id = e.id AND r.stage = 'extraction'
  LEFT JOIN extraction_results b ON b.id = e.id AND b.stage = 'bbox_refinement';

-- The smallest UUIDv7 of `at`'s millisecond: every job submitted before
-- `at` has a smaller id (ids are UUIDv7, time first), so a walk of ids
-- below it reads no job submitted later.
CREATE FUNCTION uuid_floor(at timestamptz) RETURNS uuid
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN (lpad(to_hex(floor(extract(epoch FROM at) * 1000)::bigint), 12, '0')
            || '70000000000000000000')::uuid;

-- An erasure and a purge delete a job's webhook deliveries by its id.
CREATE INDEX ix_webhook_deliveries_extraction ON webhook_deliveries (extraction_id);
