-- One table for the environment's background jobs: user deploys and repairs (`operations`)
-- and dryruns, which had twin tables. A job is created `running`, finished once with its
-- result (JSON text), or ended `failed` / `interrupted` when the host stopped first. A dryrun
-- names the version it reads; that version must exist. Keep in step with
-- migrations/postgres/0005_jobs.sql.

CREATE TABLE jobs (
    id             TEXT    NOT NULL PRIMARY KEY,
    environment_id TEXT    NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    kind           TEXT    NOT NULL CHECK (kind IN ('deploy', 'repair', 'dryrun')),
    version        INTEGER,
    status         TEXT    NOT NULL CHECK (status IN ('running', 'done', 'failed', 'interrupted')),
    created_at     INTEGER NOT NULL,
    finished_at    INTEGER,
    result         TEXT,
    CHECK ((kind = 'dryrun') = (version IS NOT NULL)),
    FOREIGN KEY (environment_id, version) REFERENCES intent_versions (environment_id, version) ON DELETE CASCADE
);

CREATE INDEX jobs_by_environment ON jobs (environment_id, kind, created_at);

INSERT INTO jobs (id, environment_id, kind, version, status, created_at, finished_at, result)
    SELECT id, environment_id, kind, NULL, status, created_at, finished_at, result FROM operations;
INSERT INTO jobs (id, environment_id, kind, version, status, created_at, finished_at, result)
    SELECT id, environment_id, 'dryrun', version, status, created_at, finished_at, report FROM dryruns;

DROP TABLE operations;
DROP TABLE dryruns;
