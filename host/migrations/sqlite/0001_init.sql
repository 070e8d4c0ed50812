-- orc-host schema, SQLite. Keep in step with migrations/postgres/0001_init.sql: same tables, same
-- columns, same meaning. Timestamps are milliseconds since the Unix epoch; JSON is stored as text.

CREATE TABLE environments (
    id               TEXT    NOT NULL PRIMARY KEY,
    name             TEXT    NOT NULL UNIQUE,
    settings         TEXT    NOT NULL,
    halted           INTEGER NOT NULL DEFAULT 0 CHECK (halted IN (0, 1)),
    -- The last version number handed out; incremented under the row's write lock.
    latest_version   INTEGER NOT NULL DEFAULT 0,
    released_version INTEGER,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);

CREATE TABLE intent_versions (
    environment_id TEXT    NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    version        INTEGER NOT NULL CHECK (version > 0),
    document       TEXT    NOT NULL,
    created_at     INTEGER NOT NULL,
    released_at    INTEGER,
    PRIMARY KEY (environment_id, version)
);

CREATE TABLE resource_states (
    environment_id   TEXT    NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    resource_id      TEXT    NOT NULL,
    resource_type    TEXT    NOT NULL,
    node             TEXT    NOT NULL,
    desired_hash     TEXT    NOT NULL,
    deployed_hash    TEXT,
    status           TEXT    NOT NULL
        CHECK (status IN ('available', 'deploying', 'deployed', 'failed', 'skipped', 'unavailable')),
    version          INTEGER NOT NULL,
    last_deploy_at   INTEGER,
    last_verified_at INTEGER,
    attempts         INTEGER NOT NULL DEFAULT 0,
    error_code       TEXT,
    error_message    TEXT,
    next_retry_at    INTEGER,
    updated_at       INTEGER NOT NULL,
    PRIMARY KEY (environment_id, resource_id)
) WITHOUT ROWID;

-- Deliberately no index on `status`: it changes two or three times per deploy of every resource,
-- and an index on it doubles the cost of those batch updates (on PostgreSQL it also rules out HOT
-- updates). Status filters, counts and crash recovery scan the environment's primary-key range.

CREATE TABLE actions (
    -- Insertion order: the log's order and its pagination cursor.
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    id             TEXT    NOT NULL UNIQUE,
    environment_id TEXT    NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    resource_id    TEXT    NOT NULL,
    kind           TEXT    NOT NULL CHECK (kind IN ('deploy', 'repair', 'dryrun', 'read', 'delete')),
    version        INTEGER,
    started_at     INTEGER NOT NULL,
    finished_at    INTEGER NOT NULL,
    outcome        TEXT    NOT NULL,
    changes        TEXT    NOT NULL,
    messages       TEXT    NOT NULL,
    error_code     TEXT,
    error_message  TEXT
);

CREATE INDEX actions_by_resource ON actions (environment_id, resource_id, seq);
CREATE INDEX actions_by_environment ON actions (environment_id, seq);

CREATE TABLE dryruns (
    id             TEXT    NOT NULL PRIMARY KEY,
    environment_id TEXT    NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    version        INTEGER NOT NULL,
    status         TEXT    NOT NULL CHECK (status IN ('running', 'done', 'failed')),
    created_at     INTEGER NOT NULL,
    finished_at    INTEGER,
    report         TEXT,
    -- A dryrun is always of an existing version.
    FOREIGN KEY (environment_id, version) REFERENCES intent_versions (environment_id, version) ON DELETE CASCADE
);

CREATE INDEX dryruns_by_environment ON dryruns (environment_id, created_at);

CREATE TABLE admin_tokens (
    id         TEXT    NOT NULL PRIMARY KEY,
    -- Lowercase hex of the sha256 of the token; the token itself is never stored.
    token_hash TEXT    NOT NULL UNIQUE,
    created_at INTEGER NOT NULL
);

CREATE TABLE plugin_kv (
    scope      TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    value      BLOB    NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
