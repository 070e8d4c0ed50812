-- User-triggered deploys and repairs, answered 202 with the id of a row here; the row is
-- completed with the outcome once the scheduler has settled. Keep in step with
-- migrations/postgres/0002_operations.sql.

CREATE TABLE operations (
    id             TEXT    NOT NULL PRIMARY KEY,
    environment_id TEXT    NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    kind           TEXT    NOT NULL CHECK (kind IN ('deploy', 'repair')),
    status         TEXT    NOT NULL CHECK (status IN ('running', 'done', 'interrupted')),
    created_at     INTEGER NOT NULL,
    finished_at    INTEGER,
    -- JSON text, once finished.
    result         TEXT
);

CREATE INDEX operations_by_environment ON operations (environment_id, created_at);
