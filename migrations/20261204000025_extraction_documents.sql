-- The document of a job whose request names a file (`document.object`), as
-- its extraction read it: the PDF's words with their boxes, or the text
-- file's text. Written by the claim's holder before its success, so bbox
-- refinement grounds the values in the words they were found in. Like the
-- other side tables it has no foreign key: the job's erase and purge delete
-- it with the job.
CREATE TABLE extraction_documents (
    id       uuid PRIMARY KEY,
    document json COMPRESSION lz4 NOT NULL
) WITH (toast_tuple_target = 128);
ALTER TABLE extraction_documents ALTER COLUMN document SET STORAGE MAIN;
