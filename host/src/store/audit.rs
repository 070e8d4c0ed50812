//! The audit trail: one row per state-changing request (who, what, when, the outcome), written
//! by the API's authorization layer after the answer is known, listed newest first.

use sqlx::QueryBuilder;

use super::error::{backend, backend_with};
use super::{AuditFilter, AuditId, AuditRecord, BeginWrite, Result, Store, page_size, parse_id, sqlite_rows_per_statement};

type Row = (
    String,
    i64,
    Option<String>,
    Option<String>,
    Option<String>,
    String,
    String,
    String,
    Option<String>,
    i32,
    Option<String>,
    Option<String>,
);

impl Store {
    /// Appends `entries` in one transaction, in their order.
    pub async fn insert_audit(&self, entries: &[AuditRecord]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let context = || format!("writing {} entries to the audit trail", entries.len());
        let rows: Vec<(String, Option<String>, Option<String>, &AuditRecord)> = entries
            .iter()
            .map(|e| {
                (
                    e.id.to_string(),
                    e.user_id.map(|u| u.to_string()),
                    e.token_id.map(|t| t.to_string()),
                    e,
                )
            })
            .collect();
        on_pool!(self, pool => {
            let mut tx = pool.begin_write().await.map_err(backend_with(context))?;
            // SQLite's bound on parameters is the lower of the two.
            for chunk in rows.chunks(sqlite_rows_per_statement(12)) {
                let mut q = QueryBuilder::new(
                    "INSERT INTO audit (id, at, user_id, user_name, token_id, method, route, path, environment, status, code, source) ",
                );
                q.push_values(chunk, |mut row, (id, user_id, token_id, e)| {
                    row.push_bind(id)
                        .push_bind(e.at)
                        .push_bind(user_id)
                        .push_bind(e.user.as_deref())
                        .push_bind(token_id)
                        .push_bind(&e.method)
                        .push_bind(&e.route)
                        .push_bind(&e.path)
                        .push_bind(e.environment.as_deref())
                        .push_bind(i32::from(e.status))
                        .push_bind(e.code.as_deref())
                        .push_bind(e.source.as_deref());
                });
                // Not cached: the text varies with the batch's size.
                q.build().persistent(false).execute(&mut *tx).await.map_err(backend_with(context))?;
            }
            tx.commit().await.map_err(backend_with(context))?;
        });
        Ok(())
    }

    /// The entries `filter` selects, newest first, and the cursor of the next page if any.
    pub async fn list_audit(&self, filter: &AuditFilter) -> Result<(Vec<AuditRecord>, Option<AuditId>)> {
        let limit = page_size(filter.limit);
        // Stored entries hold no NUL (the layer replaces it), and PostgreSQL cannot be asked.
        if [&filter.user, &filter.environment].into_iter().flatten().any(|t| t.contains('\0')) {
            return Ok((Vec::new(), None));
        }
        let rows: Vec<Row> = on_pool!(self, pool => {
            sqlx::query_as(
                "SELECT id, at, user_id, user_name, token_id, method, route, path, environment, status, code, source FROM audit \
                 WHERE ($1 IS NULL OR user_name = $1) AND ($2 IS NULL OR environment = $2) \
                   AND ($3 IS NULL OR at >= $3) AND ($4 IS NULL OR at <= $4) \
                   AND ($5 IS NULL OR (status >= 400) = $5) AND ($6 IS NULL OR id < $6) \
                 ORDER BY id DESC LIMIT $7",
            )
            .bind(filter.user.as_deref())
            .bind(filter.environment.as_deref())
            .bind(filter.since)
            .bind(filter.until)
            .bind(filter.failed)
            .bind(filter.before.map(|b| b.to_string()))
            .bind(i64::from(limit) + 1)
            .fetch_all(pool)
            .await
            .map_err(backend("reading the audit trail"))?
        });
        let mut items = rows
            .into_iter()
            .map(
                |(id, at, user_id, user, token_id, method, route, path, environment, status, code, source)| {
                    Ok(AuditRecord {
                        id: parse_id(&id, "audit entry")?,
                        at,
                        user_id: user_id.map(|u| parse_id(&u, "user")).transpose()?,
                        user,
                        token_id: token_id.map(|t| parse_id(&t, "token")).transpose()?,
                        method,
                        route,
                        path,
                        environment,
                        status: u16::try_from(status).unwrap_or_default(),
                        code,
                        source,
                    })
                },
            )
            .collect::<Result<Vec<_>>>()?;
        let next = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items.last().map(|e| e.id)
        } else {
            None
        };
        Ok((items, next))
    }
}
