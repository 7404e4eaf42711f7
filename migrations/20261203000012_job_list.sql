-- Listing a tenant's jobs a page at a time (GET /v1/extractions), newest
-- first by id (a UUIDv7: creation time to the millisecond). A page walks
-- (tenant_id, status, id) from its cursor once per status it lists (all five
-- when it names none), merges the walks in id order, and reads only the rows
-- it returns (or, with filters no index answers, at most its scan budget).
--
-- Two partial indexes rather than one whole: a status change is never a HOT
-- update, so every version of a job's row adds an entry to every index that
-- covers it. The open jobs' index was there already, keyed on the tenant
-- alone (the submit's cap on open jobs counts through it, and still can);
-- it gains the status and id. The finished jobs' index takes only the
-- versions after the end (the success and the bbox refinement's steps), not
-- the queued and running ones as well.
--
-- (Built without CONCURRENTLY, as migrations run in a transaction: on a
-- large table, apply this migration while submits can wait.)
DROP INDEX ix_extractions_tenant_open;
CREATE INDEX ix_extractions_tenant_open
    ON extractions (tenant_id, status, id) WHERE status IN ('queued', 'running');
CREATE INDEX ix_extractions_tenant_finished
    ON extractions (tenant_id, status, id) WHERE status IN ('succeeded', 'failed', 'cancelled');
