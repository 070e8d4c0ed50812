-- Nodes reached over SSH, shared by the environments allowed to use them. Keep in step with
-- migrations/postgres/0003_nodes.sql.
--
-- The credential lives in its own table, encrypted with the host's secret key
-- (ChaCha20-Poly1305, the node's name as associated data): no query that lists or shows nodes
-- reads it.

CREATE TABLE nodes (
    name               TEXT    NOT NULL PRIMARY KEY,
    address            TEXT    NOT NULL,
    port               INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
    ssh_user           TEXT    NOT NULL,
    credential_kind    TEXT    NOT NULL CHECK (credential_kind IN ('private_key', 'password')),
    -- JSON object of string labels.
    labels             TEXT    NOT NULL DEFAULT '{}',
    -- Private to this environment; NULL: public. A private node goes with its environment.
    environment_id     TEXT    REFERENCES environments (id) ON DELETE CASCADE,
    status             TEXT    NOT NULL
        CHECK (status IN ('unidentified', 'public', 'private', 'unreachable', 'auth_failed', 'host_key_changed')),
    -- The pinned host key (`SHA256:…`): given at registration or learned at the first verification.
    host_key           TEXT,
    -- A key the node presented that differs from the pinned one, until an operator accepts it.
    presented_host_key TEXT,
    -- JSON text of the facts gathered at the last verification.
    facts              TEXT,
    last_error         TEXT,
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL,
    verified_at        INTEGER
);

CREATE TABLE node_credentials (
    node       TEXT NOT NULL PRIMARY KEY REFERENCES nodes (name) ON DELETE CASCADE,
    nonce      BLOB NOT NULL,
    ciphertext BLOB NOT NULL
);
