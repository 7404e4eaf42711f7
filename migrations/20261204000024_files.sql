-- Files a tenant uploaded (`POST /v1/files`), addressed by their content's
-- SHA-256. The bytes live in the object store under tenants/<tenant>/<sha256>;
-- this row, written once the object is stored, says they are there and what
-- they are. The same bytes uploaded again by the same tenant are the same file.
CREATE TABLE files (
    tenant_id    uuid        NOT NULL REFERENCES tenants (id),
    sha256       text        NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size         bigint      NOT NULL CHECK (size > 0),
    content_type text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, sha256)
);
