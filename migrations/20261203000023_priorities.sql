-- Priorities and tenants' weights, for the worker's scheduler.
--
-- A job's priority (`high`, `normal`, `low`) is kept on its row, so every
-- record that hands the job to its workers again (a retry, a reaper's
-- republish, the bbox refinement) carries it, and the census can count the
-- waiting work of each priority. A tenant's weight is its share of the
-- workers when several tenants have work waiting (default 1).
ALTER TABLE extractions ADD COLUMN priority text NOT NULL DEFAULT 'normal'
    CHECK (priority IN ('high', 'normal', 'low'));
ALTER TABLE tenants ADD COLUMN weight integer NOT NULL DEFAULT 1
    CHECK (weight BETWEEN 1 AND 1000);

-- The view's `e.*` was expanded when it was made: make it again.
DROP VIEW extraction_rows;
CREATE VIEW extraction_rows AS
SELECT e.*, q.idempotency_key, q.request_hash, q.request,
       r.result, b.result AS bbox_result
  FROM extractions e
  JOIN extraction_requests q ON q.id = e.id
  LEFT JOIN extraction_results r ON r.id = e.id AND r.stage = 'extraction'
  LEFT JOIN extraction_results b ON b.id = e.id AND b.stage = 'bbox_refinement';

-- submit_jobs takes each job's priority as one more array (see migration 9
-- for the rest of what it does).
DROP FUNCTION submit_jobs(uuid[], text[], text[], text[], boolean[], uuid[], int8[]);
CREATE FUNCTION submit_jobs(p_ids uuid[], p_keys text[], p_hashes text[], p_requests text[],
                            p_webhooks boolean[], p_tenants uuid[], p_caps int8[],
                            p_priorities text[])
RETURNS SETOF extractions
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
BEGIN
    -- The quota lock of each capped tenant, in one order, so two batches
    -- never deadlock: submits of one capped tenant run one statement at a
    -- time, those of different tenants side by side.
    PERFORM pg_advisory_xact_lock(1146, hashtext(t::text))
       FROM (SELECT DISTINCT t FROM unnest(p_tenants, p_caps) AS c(t, cap)
              WHERE cap IS NOT NULL ORDER BY t) capped;

    -- First the caps: a capped tenant gets only as many new jobs as it has
    -- room for, in the order given; its open jobs are counted up to the cap,
    -- never further. A request whose key its tenant has used already takes
    -- no room and is left out (the caller then reads the key's job). Then the
    -- request row: a request with a key is inserted only if no other request
    -- holds its key (a speculative insert, which costs more, so requests
    -- without a key skip it), and only the requests inserted get a job row
    -- and a log row.
    RETURN QUERY
    WITH new AS (
        SELECT * FROM unnest(p_ids, p_tenants, p_keys, p_hashes, p_requests, p_webhooks, p_caps,
                            p_priorities)
               WITH ORDINALITY AS new(id, tenant_id, key, hash, request, webhook, cap, priority, ord)),
    capped AS (
        SELECT c.tenant_id, c.cap,
               (SELECT count(*) FROM (SELECT 1 FROM extractions e
                                       WHERE e.tenant_id = c.tenant_id
                                         AND e.status IN ('queued', 'running')
                                       LIMIT c.cap) o) AS open
          FROM (SELECT tenant_id, min(cap) AS cap FROM new WHERE cap IS NOT NULL
                 GROUP BY tenant_id) c),
    admitted AS (
        SELECT * FROM (
            SELECT new.*, capped.cap AS room_of, capped.open,
                   row_number() OVER (PARTITION BY new.tenant_id ORDER BY new.ord) AS place
              FROM new LEFT JOIN capped ON capped.tenant_id = new.tenant_id
             WHERE new.key IS NULL OR NOT EXISTS (
                   SELECT 1 FROM extraction_requests q
                    WHERE q.tenant_id = new.tenant_id AND q.idempotency_key = new.key)) ranked
         WHERE room_of IS NULL OR open + place <= room_of),
    keyed AS (
        INSERT INTO extraction_requests (id, tenant_id, idempotency_key, request_hash, request)
        SELECT id, tenant_id, key, hash, request::json FROM admitted WHERE key IS NOT NULL
        ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING id, tenant_id),
    unkeyed AS (
        INSERT INTO extraction_requests (id, tenant_id, idempotency_key, request_hash, request)
        SELECT id, tenant_id, NULL, NULL, request::json FROM admitted WHERE key IS NULL
        RETURNING id, tenant_id),
    requested AS (
        SELECT * FROM keyed UNION ALL SELECT * FROM unkeyed),
    created AS (
        INSERT INTO extractions (id, tenant_id, status, webhook, priority)
        SELECT requested.id, requested.tenant_id, 'queued', admitted.webhook, admitted.priority
          FROM requested JOIN admitted ON admitted.id = requested.id
        RETURNING *),
    logged AS (
        INSERT INTO extraction_transitions (extraction_id, transition, token)
        SELECT id, 'submit', NULL FROM created)
    SELECT created.* FROM created;
END
$$;
