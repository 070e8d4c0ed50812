-- Requests relayed to the replica that runs their environment (store/commands.rs): the replica
-- a client reached writes the request here and waits; the owner claims it, runs it and writes
-- the answer. A row is claimed once (`claimed_by`), so a request runs at most once. Times are
-- the writing replica's clock in milliseconds (only old rows are judged by them). Keep in step
-- with migrations/postgres/0012_commands.sql. On SQLite (one process) nothing is relayed: the
-- table stays empty.

CREATE TABLE commands (
    id             TEXT    NOT NULL PRIMARY KEY,
    -- No foreign key: deleting an environment (itself a relayed request) keeps the row its
    -- answer goes to; rows are forgotten once answered, or when old.
    environment_id TEXT    NOT NULL,
    -- The request: method, path and query, its headers (a JSON array of [name, value]), body,
    -- and the hash of the caller's token (what the owner checks the caller by again).
    method         TEXT    NOT NULL,
    target         TEXT    NOT NULL,
    headers        TEXT    NOT NULL,
    body           BLOB    NOT NULL,
    credential     TEXT    NOT NULL,
    submitted_by   TEXT    NOT NULL,
    submitted_at   INTEGER NOT NULL,
    claimed_by     TEXT,
    -- The answer: status, headers, body and the error code it carries.
    status         INTEGER,
    answer_headers TEXT,
    answer_body    BLOB,
    code           TEXT,
    answered_at    INTEGER
);

CREATE INDEX commands_waiting ON commands (environment_id, submitted_at) WHERE claimed_by IS NULL;
