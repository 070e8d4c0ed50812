-- Processes and connections: instances of catalog service versions on nodes, and the links
-- between their interfaces (dEF-Pi). Keep in step with migrations/postgres/0007_services.sql.
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

-- A connection from one process's interface to another's, made only by the orchestrator once the
-- interfaces agreed on `version` (whose message schema's digest is `interface_id`). Deleting
-- either process deletes it first (the application does, to re-deliver the peer's
-- configuration); deleting the environment deletes it with the processes.
CREATE TABLE connections (
    environment_id TEXT    NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    id             TEXT    NOT NULL,
    from_process   TEXT NOT NULL,
    from_interface TEXT NOT NULL,
    to_process     TEXT NOT NULL,
    to_interface   TEXT NOT NULL,
    version        TEXT    NOT NULL,
    interface_id   TEXT    NOT NULL,
    created_by     TEXT,
    created_at     INTEGER  NOT NULL,
    PRIMARY KEY (environment_id, id),
    UNIQUE (environment_id, from_process, from_interface, to_process, to_interface)
);
