-- Coopr-style clusters: versioned cluster templates and the clusters made from them. Keep in step
-- with migrations/postgres/0004_clusters.sql.
--
-- The store never looks inside either document: a template's is the pinned template JSON, a
-- cluster's is the cluster manager's (layout, tasks, config…).

CREATE TABLE cluster_templates (
    environment_id TEXT    NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    name           TEXT    NOT NULL,
    -- 1, 2, 3… per name and environment; a version is immutable once stored.
    version        INTEGER NOT NULL CHECK (version > 0),
    document       TEXT    NOT NULL,
    created_at     INTEGER NOT NULL,
    PRIMARY KEY (environment_id, name, version)
);

CREATE TABLE clusters (
    environment_id   TEXT    NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    name             TEXT    NOT NULL,
    template         TEXT    NOT NULL,
    template_version INTEGER NOT NULL,
    status           TEXT    NOT NULL,
    document         TEXT    NOT NULL,
    -- When the cluster's lease ends; NULL: no lease.
    lease_expires_at INTEGER,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    PRIMARY KEY (environment_id, name),
    -- No ON DELETE action: deleting a template version a cluster uses fails. Deleting the
    -- environment removes both sides in one statement, which the check (at the end of the
    -- statement) accepts.
    FOREIGN KEY (environment_id, template, template_version)
        REFERENCES cluster_templates (environment_id, name, version)
);

-- The lease reaper's lookup, across environments.
CREATE INDEX clusters_by_lease ON clusters (lease_expires_at) WHERE lease_expires_at IS NOT NULL;
-- The foreign key's check when a template is deleted.
CREATE INDEX clusters_by_template ON clusters (environment_id, template, template_version);
