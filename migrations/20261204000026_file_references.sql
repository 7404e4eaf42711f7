-- Which jobs name which file, so that a file no job names can be deleted
-- (`store::files::collect`) and one a job still needs never is. A row is
-- written when a job naming the file is made, and deleted with the job (its
-- purge, its erase). `last_used_at` is the file's last upload or job: a file
-- is deleted only once nothing has named it for the grace period.
ALTER TABLE files ADD COLUMN last_used_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX ix_files_last_used_at ON files (last_used_at);

CREATE TABLE file_jobs (
    tenant_id     uuid NOT NULL,
    sha256        text NOT NULL,
    extraction_id uuid NOT NULL,
    PRIMARY KEY (tenant_id, sha256, extraction_id)
);
CREATE INDEX ix_file_jobs_extraction_id ON file_jobs (extraction_id);

INSERT INTO file_jobs (tenant_id, sha256, extraction_id)
SELECT e.tenant_id, r.request -> 'document' ->> 'object', e.id
  FROM extractions e JOIN extraction_requests r ON r.id = e.id
 WHERE r.request -> 'document' ->> 'object' IS NOT NULL
ON CONFLICT DO NOTHING;
