-- The address each audited request came from, so that failed sign-ins (kept under the name
-- they gave) say where they came from too. NULL for entries recorded before, and for requests
-- whose transport did not say. Keep in step with migrations/postgres/0010_audit_source.sql.

ALTER TABLE audit ADD COLUMN source TEXT;
