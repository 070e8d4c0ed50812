//! Console sessions (`console_sessions`): what a browser's cookie stands for, kept here so that
//! every replica knows every session and the loss of one signs no one out.

use super::error::{backend, backend_with};
use super::{Millis, Result, Store, TokenId, parse_id};

/// One signed-in browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSession {
    /// The sha256 (hex) of the cookie's secret.
    pub key: String,
    /// The sha256 (hex) of the token the session acts with.
    pub token_hash: String,
    /// The token a password sign-in made for the session: revoked when it ends.
    pub own_token: Option<TokenId>,
    pub csrf: String,
    pub last_used: Millis,
}

type Row = (String, String, Option<String>, String, Millis);

fn session(row: Row) -> Result<ConsoleSession> {
    let (key, token_hash, own_token, csrf, last_used) = row;
    Ok(ConsoleSession {
        key,
        token_hash,
        own_token: own_token.map(|t| parse_id(&t, "token")).transpose()?,
        csrf,
        last_used,
    })
}

impl Store {
    /// Records `session`, then forgets the sessions unused since `idle_before` and, past `max`,
    /// the least recently used.
    pub async fn start_console_session(&self, session: &ConsoleSession, idle_before: Millis, max: i64) -> Result<()> {
        let context = "starting a console session";
        on_pool!(self, pool => {
            sqlx::query("INSERT INTO console_sessions (key, token_hash, own_token, csrf, last_used) VALUES ($1, $2, $3, $4, $5)")
                .bind(&session.key)
                .bind(&session.token_hash)
                .bind(session.own_token.map(|t| t.to_string()))
                .bind(&session.csrf)
                .bind(session.last_used)
                .execute(pool)
                .await
                .map_err(backend(context))?;
            sqlx::query(
                "DELETE FROM console_sessions WHERE last_used < $1 OR key IN \
                 (SELECT key FROM console_sessions ORDER BY last_used DESC LIMIT 1000000000 OFFSET $2)",
            )
            .bind(idle_before)
            .bind(max)
            .execute(pool)
            .await
            .map_err(backend(context))?;
        });
        Ok(())
    }

    /// The session whose cookie hashes to `key`, if it is known.
    pub async fn find_console_session(&self, key: &str) -> Result<Option<ConsoleSession>> {
        let row: Option<Row> = on_pool!(self, pool => {
            sqlx::query_as("SELECT key, token_hash, own_token, csrf, last_used FROM console_sessions WHERE key = $1")
                .bind(key)
                .fetch_optional(pool)
                .await
                .map_err(backend("reading a console session"))?
        });
        row.map(session).transpose()
    }

    /// Notes that session `key` was used at `at`.
    pub async fn touch_console_session(&self, key: &str, at: Millis) -> Result<()> {
        on_pool!(self, pool => {
            sqlx::query("UPDATE console_sessions SET last_used = $2 WHERE key = $1 AND last_used < $2")
                .bind(key)
                .bind(at)
                .execute(pool)
                .await
                .map_err(backend("noting a console session's use"))?;
        });
        Ok(())
    }

    /// Ends session `key`; the session it was, if it was known.
    pub async fn end_console_session(&self, key: &str) -> Result<Option<ConsoleSession>> {
        let context = || "ending a console session".to_string();
        let row: Option<Row> = on_pool!(self, pool => {
            sqlx::query_as("DELETE FROM console_sessions WHERE key = $1 RETURNING key, token_hash, own_token, csrf, last_used")
                .bind(key)
                .fetch_optional(pool)
                .await
                .map_err(backend_with(context))?
        });
        row.map(session).transpose()
    }
}
