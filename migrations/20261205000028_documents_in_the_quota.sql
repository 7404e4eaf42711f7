-- The document a job keeps of its file (`extraction_documents`) is its
-- tenant's storage as much as the file is, and often many times larger (a
-- PDF's words, each with its box): it counts against the tenant's quota of
-- files. Each row says whose it is and how large it is (its JSON's bytes).
ALTER TABLE extraction_documents
    ADD COLUMN tenant_id uuid,
    ADD COLUMN size bigint NOT NULL DEFAULT 0 CHECK (size >= 0);

UPDATE extraction_documents d
   SET tenant_id = e.tenant_id, size = octet_length(d.document::text)
  FROM extractions e
 WHERE e.id = d.id;

-- A document of no job is read by nobody: its job's erase or purge missed it.
DELETE FROM extraction_documents WHERE tenant_id IS NULL;

ALTER TABLE extraction_documents ALTER COLUMN tenant_id SET NOT NULL;
CREATE INDEX ix_extraction_documents_tenant_id ON extraction_documents (tenant_id);
