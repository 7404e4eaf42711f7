-- A narrow job row (issue 12). The transitions rewrite `extractions` about
-- six times per job; until now each rewrite copied the whole request, the
-- result and a jsonb bbox sub-state, and changed indexed columns, so none was
-- a HOT update. From here on:
--
-- * `extractions` holds only what the transitions change: the status, the
--   attempts, the lease, the timestamps, and the bbox sub-state in real columns.
-- * What is written once lives in rows of its own: the request (with the
--   idempotency key) in `extraction_requests`, written by the submit; each
--   result in `extraction_results`, written by the statement of the transition
--   that produced it.
-- * No index mentions a "published" stamp, so stamping is a HOT update, and
--   the fill factor leaves room on each page for the new row versions.
-- * The request and the results are `json`, not `jsonb`: the database only
--   stores and returns them (a webhook reads two keys of the request), so
--   parsing them into jsonb on every insert bought nothing. Large ones are
--   compressed with lz4 and kept in the row.
-- * The transition log keeps one row per won transition, written by the same
--   statement, but without a foreign key (whose check locked the job row once
--   per log row), without a sequence number (a job's rows are ordered by
--   `at`, then by the enum, whose order is the order of a job's life, for
--   the two transitions one statement logs), with the transition's name as
--   an enum, and with a BRIN
--   index on the job id: job ids are time-ordered (UUIDv7) and log rows are
--   appended as jobs move, so a job's rows sit in a few block ranges, and
--   keeping the index costs next to nothing per row.
--
-- The side tables carry no foreign key for the same reason: they are only ever
-- written by the statement that writes (or already wrote) the job row.

CREATE TABLE extraction_requests (
    id               uuid  PRIMARY KEY,
    -- Client-chosen key that makes a submit safe to retry; NULL when the client sent none.
    idempotency_key  text,
    -- SHA-256 of the canonical request JSON, for a request with a key: a
    -- replay of the key with a different body is refused. NULL without a key.
    request_hash     text,
    -- The whole request: document, field specs, optional webhook_url and metadata.
    request          json  COMPRESSION lz4 NOT NULL
) WITH (toast_tuple_target = 128);
-- Compressed in the row rather than moved to the TOAST table: one tuple, one
-- index entry.
ALTER TABLE extraction_requests ALTER COLUMN request SET STORAGE MAIN;

INSERT INTO extraction_requests (id, idempotency_key, request_hash, request)
SELECT id, idempotency_key, request_hash, request::json FROM extractions;

CREATE UNIQUE INDEX uq_extraction_requests_idempotency_key
    ON extraction_requests (idempotency_key) WHERE idempotency_key IS NOT NULL;

-- One row per stage that produced a result: 'extraction' (the extracted values)
-- and 'bbox_refinement' (the grounded boxes).
CREATE TYPE extraction_stage AS ENUM ('extraction', 'bbox_refinement');

CREATE TABLE extraction_results (
    id      uuid             NOT NULL,
    stage   extraction_stage NOT NULL,
    result  json             COMPRESSION lz4 NOT NULL,
    PRIMARY KEY (id, stage)
) WITH (toast_tuple_target = 128);
ALTER TABLE extraction_results ALTER COLUMN result SET STORAGE MAIN;

INSERT INTO extraction_results (id, stage, result)
SELECT id, 'extraction', result::json FROM extractions WHERE result IS NOT NULL;
INSERT INTO extraction_results (id, stage, result)
SELECT id, 'bbox_refinement', (post_processing->'bbox_refinement'->'result')::json
  FROM extractions
 WHERE jsonb_typeof(post_processing->'bbox_refinement'->'result') IN ('object', 'array');

ALTER TABLE extractions
    -- Whether the request named a webhook_url: a terminal transition looks the
    -- URL up only then.
    ADD COLUMN webhook               boolean NOT NULL DEFAULT false,
    -- The bbox refinement sub-state; NULL until the extraction succeeded.
    ADD COLUMN bbox_status           text
               CHECK (bbox_status IN ('pending', 'running', 'succeeded', 'failed')),
    -- Bbox claims so far; the current value is the bbox holder's fencing token.
    ADD COLUMN bbox_attempts         integer NOT NULL DEFAULT 0,
    -- When the bbox request was made (the extraction's success).
    ADD COLUMN bbox_requested_at     timestamptz,
    -- When the broker acknowledged the bbox request (see published_at).
    ADD COLUMN bbox_published_at     timestamptz,
    ADD COLUMN bbox_started_at       timestamptz,
    ADD COLUMN bbox_lease_expires_at timestamptz,
    ADD COLUMN bbox_finished_at      timestamptz,
    ADD COLUMN bbox_error            text,
    ADD COLUMN bbox_republished_at   timestamptz,
    ADD COLUMN bbox_orphaned_at      timestamptz,
    ADD COLUMN bbox_last_recovery_s  double precision;

UPDATE extractions
   SET webhook = (request->>'webhook_url') IS NOT NULL,
       bbox_status = post_processing->'bbox_refinement'->>'status',
       bbox_attempts = COALESCE((post_processing->'bbox_refinement'->>'attempts')::int, 0),
       bbox_requested_at = (post_processing->'bbox_refinement'->>'requested_at')::timestamptz,
       bbox_published_at = (post_processing->'bbox_refinement'->>'published_at')::timestamptz,
       bbox_started_at = (post_processing->'bbox_refinement'->>'started_at')::timestamptz,
       bbox_lease_expires_at = (post_processing->'bbox_refinement'->>'lease_expires_at')::timestamptz,
       bbox_finished_at = (post_processing->'bbox_refinement'->>'finished_at')::timestamptz,
       bbox_error = post_processing->'bbox_refinement'->>'error',
       bbox_republished_at = (post_processing->'bbox_refinement'->>'republished_at')::timestamptz,
       bbox_orphaned_at = (post_processing->'bbox_refinement'->>'orphaned_at')::timestamptz,
       bbox_last_recovery_s = (post_processing->'bbox_refinement'->>'last_recovery_s')::float8;

DROP INDEX ix_extractions_queued_unpublished;
DROP INDEX ix_extractions_bbox_open;
DROP INDEX uq_extractions_idempotency_key;

ALTER TABLE extractions
    DROP COLUMN idempotency_key,
    DROP COLUMN request_hash,
    DROP COLUMN request,
    DROP COLUMN result,
    DROP COLUMN post_processing;

-- The reapers' sets. Neither mentions a published stamp, so the stamps (and
-- the heartbeats of the bbox lease) leave every index alone.
CREATE INDEX ix_extractions_queued
    ON extractions ((COALESCE(next_attempt_at, submitted_at))) WHERE status = 'queued';
CREATE INDEX ix_extractions_bbox_open
    ON extractions (id) WHERE bbox_status IN ('pending', 'running');

-- Room on each page for the new versions of its rows, so updates that change
-- no indexed column stay on the page (HOT) and write no index entries.
ALTER TABLE extractions SET (fillfactor = 70);

-- A transition's name as an enum: four bytes in each log row instead of up
-- to thirty. Compared with a quoted name it reads like text; cast it
-- (`transition::text`) to read it as text or compare it with a parameter.
CREATE TYPE extraction_transition AS ENUM (
    'submit', 'mark_running', 'mark_succeeded', 'mark_failed', 'requeue_for_retry',
    'mark_cancelled', 'request_cancel', 'start_bbox_refinement',
    'mark_bbox_refinement_running', 'mark_bbox_refinement_succeeded',
    'mark_bbox_refinement_failed', 'requeue_bbox_refinement');

ALTER TABLE extraction_transitions
    DROP CONSTRAINT extraction_transitions_extraction_id_fkey,
    DROP CONSTRAINT extraction_transitions_pkey,
    DROP COLUMN seq,
    ALTER COLUMN transition TYPE extraction_transition USING transition::extraction_transition;
DROP INDEX ix_extraction_transitions_extraction;
CREATE INDEX ix_extraction_transitions_extraction
    ON extraction_transitions USING brin (extraction_id) WITH (pages_per_range = 8, autosummarize = on);

-- The whole job, as the API, the operator recipes and the tests read it.
CREATE VIEW extraction_rows AS
SELECT e.*, q.idempotency_key, q.request_hash, q.request,
       r.result, b.result AS bbox_result
  FROM extractions e
  JOIN extraction_requests q ON q.id = e.id
  LEFT JOIN extraction_results r ON r.id = e.id AND r.stage = 'extraction'
  LEFT JOIN extraction_results b ON b.id = e.id AND b.stage = 'bbox_refinement';
