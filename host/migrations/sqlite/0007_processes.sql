-- Processes: instances of a catalog service version on a node (dEF-Pi). Keep in step with
-- migrations/postgres/0007_processes.sql.
--
-- The store never looks inside the document (the process manager's: service, node, config,
-- the last configuration that ran, tasks…). `revision` counts the changes of a row: it is the
-- process's ETag, and an update naming another revision is refused.

CREATE TABLE processes (
    environment_id TEXT    NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    name           TEXT NOT NULL,
    state          TEXT    NOT NULL,
    document       TEXT    NOT NULL,
    revision       INTEGER  NOT NULL CHECK (revision > 0),
    created_at     INTEGER  NOT NULL,
    updated_at     INTEGER  NOT NULL,
    PRIMARY KEY (environment_id, name)
);
