-- Revisions, and a lookup.
--
-- A cluster's revision: it counts the changes of its row and is the cluster's ETag. Every write
-- of a cluster's row names the revision it read, and a write naming another is refused, so two
-- operations that both found the cluster idle cannot both start (the lost update of stop 18's
-- review). Keep in step with migrations/postgres/0008_revisions.sql.

ALTER TABLE clusters ADD COLUMN revision INTEGER NOT NULL DEFAULT 1 CHECK (revision > 0);

-- A process's connections are read by either end: the unique key serves `from_process`, this
-- serves `to_process`.
CREATE INDEX connections_by_to ON connections (environment_id, to_process);
