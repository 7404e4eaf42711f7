-- Review: a person corrects a value the extraction read (most often one
-- OCR was unsure of, flagged `needs_review`). A correction is stored beside
-- the extracted value, never over it: the job's result stays as the
-- extractor gave it, and each correction is a row of its own, with who made
-- it (the key, and the name the reviewer gave) and when. The latest
-- correction of a field is its value now.
--
-- Like the job's other side tables, it has no foreign key: the job's erase
-- and purge delete its corrections (`store::retention`).
ALTER TYPE api_scope ADD VALUE 'review';
ALTER TYPE extraction_transition ADD VALUE 'correct_field';

CREATE TABLE field_corrections (
    id            bigserial   PRIMARY KEY,
    extraction_id uuid        NOT NULL,
    tenant_id     uuid        NOT NULL,
    field         text        NOT NULL,
    -- The right value; NULL: the document does not hold the field.
    value         text,
    key_id        uuid        NOT NULL,
    reviewer      text,
    corrected_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ix_field_corrections_job ON field_corrections (extraction_id, field, id);
-- A tenant's corrections, newest first: the ground truth it exports.
CREATE INDEX ix_field_corrections_tenant ON field_corrections (tenant_id, id);
