-- Replicas and ownership (store/ownership.rs). SQLite serves one process (its data directory is
-- locked), which owns every environment; the same rows keep each environment's epoch, so that a
-- write made under an epoch an earlier start held is refused the same way. Times are the one
-- process's clock, in milliseconds. Keep in step with migrations/postgres/0011_ownership.sql.

CREATE TABLE replicas (
    id           TEXT    NOT NULL PRIMARY KEY,
    address      TEXT    NOT NULL,
    version      TEXT    NOT NULL,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    draining     BOOLEAN NOT NULL DEFAULT FALSE
);

CREATE TABLE env_leases (
    environment_id TEXT    NOT NULL PRIMARY KEY REFERENCES environments (id) ON DELETE CASCADE,
    holder         TEXT,
    expires_at     INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE env_fences (
    environment_id TEXT    NOT NULL PRIMARY KEY REFERENCES environments (id) ON DELETE CASCADE,
    epoch          INTEGER NOT NULL DEFAULT 0,
    holder         TEXT
);
