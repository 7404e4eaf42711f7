-- A submit is one statement, one round trip, whatever its tenant's quotas.
--
-- Before, a batch with a capped tenant (and every tenant has a cap by
-- default) ran BEGIN, the tenants' quota locks, the INSERT and COMMIT: four
-- round trips. With 500 ms of latency between docstream and Postgres a
-- submit then took 2 s or more and was answered 503, and the client's
-- retries made it worse.
--
-- The quota lock must be taken before the statement that counts the
-- tenant's open jobs takes its snapshot: otherwise that statement would not
-- see a batch another process committed while this one waited for the lock,
-- and the cap would not be exact. So the lock and the INSERT are two
-- statements of this function. In READ COMMITTED a VOLATILE PL/pgSQL
-- function takes a new snapshot for each statement it runs, and the
-- transaction-level lock is held until the calling statement's transaction
-- ends. PL/pgSQL keeps the INSERT's plan for the session, as a prepared
-- statement would.
--
-- The arguments: job ids, idempotency keys (NULL for none), request hashes
-- (NULL without a key), requests as JSON text, whether each names a webhook,
-- tenants, and each tenant's cap on open jobs (NULL for none). Each created
-- job's row comes back; a job whose key its tenant already used, or whose
-- tenant's cap left no room, is left out.
CREATE FUNCTION submit_jobs(p_ids uuid[], p_keys text[], p_hashes text[], p_requests text[],
                            p_webhooks boolean[], p_tenants uuid[], p_caps int8[])
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
        SELECT * FROM unnest(p_ids, p_tenants, p_keys, p_hashes, p_requests, p_webhooks, p_caps)
               WITH ORDINALITY AS new(id, tenant_id, key, hash, request, webhook, cap, ord)),
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
        INSERT INTO extractions (id, tenant_id, status, webhook)
        SELECT requested.id, requested.tenant_id, 'queued', admitted.webhook
          FROM requested JOIN admitted ON admitted.id = requested.id
        RETURNING *),
    logged AS (
        INSERT INTO extraction_transitions (extraction_id, transition, token)
        SELECT id, 'submit', NULL FROM created)
    SELECT created.* FROM created;
END
$$;
