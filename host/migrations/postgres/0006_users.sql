-- Users, their roles per environment, tokens owned by users, and the audit trail. The admin
-- tokens of earlier versions become tokens of a user `admin` (server-wide admin, no password).
-- Keep in step with migrations/sqlite/0006_users.sql.

CREATE TABLE users (
    id            TEXT    NOT NULL PRIMARY KEY,
    name          TEXT    NOT NULL UNIQUE,
    -- The argon2id PHC string; NULL: the user cannot sign in with a password (tokens only).
    password_hash TEXT,
    admin         BOOLEAN NOT NULL DEFAULT FALSE,
    publisher     BOOLEAN NOT NULL DEFAULT FALSE,
    disabled      BOOLEAN NOT NULL DEFAULT FALSE,
    created_at    BIGINT  NOT NULL
);

CREATE TABLE memberships (
    user_id        TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    environment_id TEXT NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    role           TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'owner')),
    PRIMARY KEY (user_id, environment_id)
);

CREATE INDEX memberships_by_environment ON memberships (environment_id);

CREATE TABLE tokens (
    id          TEXT    NOT NULL PRIMARY KEY,
    -- Lowercase hex of the sha256 of the token; the token itself is never stored.
    token_hash  TEXT    NOT NULL UNIQUE,
    user_id     TEXT    NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    -- JSON of the narrower set of roles the token carries; NULL: all of its user's roles.
    scope       TEXT,
    description TEXT    NOT NULL DEFAULT '',
    created_at  BIGINT  NOT NULL
);

CREATE INDEX tokens_by_user ON tokens (user_id);

INSERT INTO users (id, name, password_hash, admin, publisher, disabled, created_at)
    SELECT '00000000-0000-4000-8000-000000000001', 'admin', NULL, TRUE, FALSE, FALSE, (SELECT MIN(created_at) FROM admin_tokens)
    WHERE EXISTS (SELECT 1 FROM admin_tokens);
INSERT INTO tokens (id, token_hash, user_id, scope, description, created_at)
    SELECT id, token_hash, '00000000-0000-4000-8000-000000000001', NULL, '', created_at FROM admin_tokens;
DROP TABLE admin_tokens;

-- Every state-changing request: who, what, when, and the outcome. Ids are time-ordered.
CREATE TABLE audit (
    id          TEXT    NOT NULL PRIMARY KEY,
    at          BIGINT  NOT NULL,
    -- NULL when the request carried no credential the host knows.
    user_id     TEXT,
    user_name   TEXT,
    token_id    TEXT,
    method      TEXT    NOT NULL,
    -- The route as the API document names it, and the path as requested.
    route       TEXT    NOT NULL,
    path        TEXT    NOT NULL,
    environment TEXT,
    status      INTEGER NOT NULL,
    -- The error's `code` when the answer was an error.
    code        TEXT
);

CREATE INDEX audit_by_user ON audit (user_name, id);
CREATE INDEX audit_by_environment ON audit (environment, id);

-- Who made each intent version, deploy, repair and dryrun, and who last changed each node (a
-- user's name); NULL: the host itself (a cluster watcher, a lease), or made before users.
ALTER TABLE intent_versions ADD COLUMN author TEXT;
ALTER TABLE jobs ADD COLUMN author TEXT;
ALTER TABLE nodes ADD COLUMN changed_by TEXT;
