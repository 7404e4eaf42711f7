-- A failed job sent back to the queue on request (POST
-- /v1/extractions/{id}/retry): failed -> queued with a fresh attempt
-- budget. The fencing token (`attempts`) keeps counting up, so that a holder
-- of an attempt before the retry can never pass for one after it; the
-- budget of the job's current run starts at `attempts_base`.
ALTER TYPE extraction_transition ADD VALUE 'retry_failed';
ALTER TABLE extractions ADD COLUMN attempts_base integer NOT NULL DEFAULT 0;

-- The view's `e.*` was expanded when it was made: make it again.
DROP VIEW extraction_rows;
CREATE VIEW extraction_rows AS
SELECT e.*, q.idempotency_key, q.request_hash, q.request,
       r.result, b.result AS bbox_result
  FROM extractions e
  JOIN extraction_requests q ON q.id = e.id
  LEFT JOIN extraction_results r ON r.id = e.id AND r.stage = 'extraction'
  LEFT JOIN extraction_results b ON b.id = e.id AND b.stage = 'bbox_refinement';
