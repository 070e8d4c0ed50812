-- A covering index of the processes' heads.
--
-- The releaser and the port check read every process's head (name, revision, times) to decode
-- only the documents that changed (`Store::list_process_heads`). In the table a head's revision
-- and times sit after the document, so reading them walked each document's overflow pages: at
-- 100 processes, a third of a second of the services benchmark. The index answers the read
-- alone (PostgreSQL keeps large documents out of line, but an index-only scan still reads less).
-- Keep in step with migrations/sqlite/0009_process_heads.sql.

CREATE INDEX processes_heads ON processes (environment_id, name, revision, created_at, updated_at);
