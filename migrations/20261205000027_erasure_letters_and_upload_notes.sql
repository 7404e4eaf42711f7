-- Two promises of erasure and collection.
--
-- Erasing a job blanks the excerpt and reason of the tenant's dead letters
-- of its idempotency key (`store::retention::erase`): they are found by
-- tenant and key.
CREATE INDEX ix_tenant_dead_letters_key
    ON tenant_dead_letters (tenant_id, idempotency_key)
 WHERE idempotency_key IS NOT NULL;

-- An upload stores its bytes before their row (`files`) is written. It
-- notes here first that it is about to, and clears the note once the row
-- is written. A note left behind (the insert failed, the process died
-- between the two) names bytes no row describes: the collection deletes
-- them once the note is older than the files' grace. No foreign key: the
-- bytes of a deleted tenant are collected all the same.
CREATE TABLE file_uploads (
    tenant_id  uuid        NOT NULL,
    sha256     text        NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, sha256)
);
CREATE INDEX ix_file_uploads_started_at ON file_uploads (started_at);
