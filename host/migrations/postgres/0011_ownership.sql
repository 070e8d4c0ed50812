-- Replicas on one database, and which of them owns each environment (store/ownership.rs).
-- A replica is an incarnation of an `orc-host serve` process: a new id at every start. Its
-- lease on an environment is a heartbeat row judged by the database's clock (`now()`), never a
-- replica's; the fence is a row of its own whose epoch changes only when another replica takes
-- the environment over, so renewals never wait on the owner's own `FOR SHARE` locks. Rows are
-- made by the first claim. Keep in step with migrations/sqlite/0011_ownership.sql.

CREATE TABLE replicas (
    id           TEXT        NOT NULL PRIMARY KEY,
    address      TEXT        NOT NULL,
    version      TEXT        NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    draining     BOOLEAN     NOT NULL DEFAULT FALSE
);

CREATE TABLE env_leases (
    environment_id TEXT        NOT NULL PRIMARY KEY REFERENCES environments (id) ON DELETE CASCADE,
    -- The replica holding it, or that held it last.
    holder         TEXT,
    expires_at     TIMESTAMPTZ NOT NULL DEFAULT '-infinity'
);

CREATE TABLE env_fences (
    environment_id TEXT   NOT NULL PRIMARY KEY REFERENCES environments (id) ON DELETE CASCADE,
    epoch          BIGINT NOT NULL DEFAULT 0,
    holder         TEXT
);
