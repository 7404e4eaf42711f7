-- Webhook URLs are indexed by their SHA-256, never by their text.
--
-- `webhook_endpoints.url` was the primary key, and a btree entry must fit in a
-- third of a page (2,704 bytes, after compression): a 410 Gone from a longer
-- URL could not be recorded, so its delivery was never finished and was
-- revived and sent again, past `DOCSTREAM_WEBHOOK_MAX_ATTEMPTS`. The URL stays
-- (any length the request validation admits); the key is now its digest, 32
-- bytes whatever the URL.
--
-- `webhook_deliveries.url` has no index (deliveries are found by id and by due
-- time), so it needs no change; the claim looks its endpoint up by the digest.

-- The digest of a URL's UTF-8 bytes. `convert_to` is only STABLE (it reads
-- the database encoding), but a database's encoding never changes, so the
-- result depends on the argument alone: IMMUTABLE is true, and lets the digest
-- be a generated column that every writer gets right without computing it.
CREATE FUNCTION webhook_url_sha256(url text) RETURNS bytea
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT pg_catalog.sha256(pg_catalog.convert_to(url, 'UTF8')) $$;

-- Adding a stored generated column rewrites the table, computing the digest of
-- every endpoint already recorded (a table of the few endpoints that said 410).
ALTER TABLE webhook_endpoints
    ADD COLUMN url_sha256 bytea GENERATED ALWAYS AS (webhook_url_sha256(url)) STORED;

ALTER TABLE webhook_endpoints
    DROP CONSTRAINT webhook_endpoints_pkey,
    ADD CONSTRAINT webhook_endpoints_pkey PRIMARY KEY (url_sha256);
