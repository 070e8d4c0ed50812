//! Admin tokens, stored only as the sha256 of the secret ([`hash_token`]).

use super::error::{backend, backend_with};
use super::{AdminToken, Result, Store, StoreError, TokenId, now_ms, parse_id};

/// The hash under which a token is stored and looked up: lowercase hex of its sha256.
pub fn hash_token(token: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

impl Store {
    /// Stores a token by its hash (lowercase hex sha256 of the secret).
    pub async fn insert_admin_token(&self, token_hash: &str) -> Result<AdminToken> {
        let token = AdminToken {
            id: TokenId::random(),
            created_at: now_ms(),
        };
        let inserted = on_pool!(self, pool => {
            sqlx::query("INSERT INTO admin_tokens (id, token_hash, created_at) VALUES ($1, $2, $3)")
                .bind(token.id.to_string())
                .bind(token_hash)
                .bind(token.created_at)
                .execute(pool)
                .await
                .map(|done| done.rows_affected())
                .map_err(backend("storing an admin token"))
        });
        match inserted {
            Err(e) if e.is_unique_violation() => Err(StoreError::Conflict {
                what: "an admin token with this hash already exists".to_string(),
            }),
            Err(e) => Err(e),
            Ok(_) => Ok(token),
        }
    }

    /// The token whose hash is `token_hash`, if any.
    pub async fn find_admin_token(&self, token_hash: &str) -> Result<Option<AdminToken>> {
        let row: Option<(String, i64)> = on_pool!(self, pool => {
            sqlx::query_as("SELECT id, created_at FROM admin_tokens WHERE token_hash = $1")
                .bind(token_hash)
                .fetch_optional(pool)
                .await
                .map_err(backend("looking up an admin token"))?
        });
        row.map(|(id, created_at)| {
            Ok(AdminToken {
                id: parse_id(&id, "admin token")?,
                created_at,
            })
        })
        .transpose()
    }

    pub async fn count_admin_tokens(&self) -> Result<i64> {
        on_pool!(self, pool => {
            sqlx::query_scalar("SELECT COUNT(*) FROM admin_tokens")
                .fetch_one(pool)
                .await
                .map_err(backend("counting admin tokens"))
        })
    }

    /// Every token (ids and creation times; the secrets are not stored), oldest first.
    pub async fn list_admin_tokens(&self) -> Result<Vec<AdminToken>> {
        let rows: Vec<(String, i64)> = on_pool!(self, pool => {
            sqlx::query_as("SELECT id, created_at FROM admin_tokens ORDER BY created_at, id")
                .fetch_all(pool)
                .await
                .map_err(backend("listing admin tokens"))?
        });
        rows.into_iter()
            .map(|(id, created_at)| {
                Ok(AdminToken {
                    id: parse_id(&id, "admin token")?,
                    created_at,
                })
            })
            .collect()
    }

    pub async fn delete_admin_token(&self, id: &TokenId) -> Result<()> {
        let deleted = on_pool!(self, pool => {
            sqlx::query("DELETE FROM admin_tokens WHERE id = $1")
                .bind(id.to_string())
                .execute(pool)
                .await
                .map_err(backend_with(|| format!("deleting admin token {id}")))?
                .rows_affected()
        });
        if deleted == 0 {
            return Err(StoreError::not_found(format!("admin token {id}")));
        }
        Ok(())
    }

    /// Deletes a token unless it is the last one (the host would lock everyone out): that is a
    /// [`StoreError::Conflict`].
    pub async fn delete_admin_token_keeping_one(&self, id: &TokenId) -> Result<()> {
        let deleted = on_pool!(self, pool => {
            sqlx::query("DELETE FROM admin_tokens WHERE id = $1 AND (SELECT COUNT(*) FROM admin_tokens) > 1")
                .bind(id.to_string())
                .execute(pool)
                .await
                .map_err(backend_with(|| format!("deleting admin token {id}")))?
                .rows_affected()
        });
        if deleted == 1 {
            return Ok(());
        }
        match self.list_admin_tokens().await?.iter().any(|t| t.id == *id) {
            true => Err(StoreError::Conflict {
                what: format!("admin token {id} is the last one; create another before deleting it"),
            }),
            false => Err(StoreError::not_found(format!("admin token {id}"))),
        }
    }
}
