-- Console sessions (console/session.rs), kept in the database so that every replica knows them
-- and a replica's loss signs no one out. `key` is the sha256 of the cookie's secret; the
-- session acts with the token whose hash is `token_hash` (`own_token`: the one a password
-- sign-in made for it, revoked when it ends). `last_used` is in milliseconds, by the clock of
-- the replica that last wrote it. Keep in step with migrations/sqlite/0013_console_sessions.sql.

CREATE TABLE console_sessions (
    key        TEXT    NOT NULL PRIMARY KEY,
    token_hash TEXT    NOT NULL,
    own_token  TEXT,
    csrf       TEXT    NOT NULL,
    last_used  BIGINT  NOT NULL
);

CREATE INDEX console_sessions_by_use ON console_sessions (last_used);
