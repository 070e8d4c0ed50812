//! API tokens, each owned by a user and stored only as the sha256 of its secret
//! ([`hash_token`]), with the narrower scope it may carry (JSON). A token is looked up with its
//! user in one query ([`Store::find_credential`]).

use super::BeginWrite as _;
use super::error::{backend, backend_with};
use super::users::guarded;
use super::{Result, Store, StoreError, TokenId, TokenRecord, UserId, now_ms, parse_id};
use crate::access::{Account, Scope};

/// The hash under which a token is stored and looked up: lowercase hex of its sha256.
pub fn hash_token(token: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

type TokenRow = (String, String, String, Option<String>, String, i64);

const TOKEN_COLUMNS: &str = "t.id, t.user_id, u.name, t.scope, t.description, t.created_at";

fn token(row: TokenRow) -> Result<TokenRecord> {
    let (id, user_id, user, scope, description, created_at) = row;
    Ok(TokenRecord {
        id: parse_id(&id, "token")?,
        user_id: parse_id(&user_id, "user")?,
        user,
        scope: scope.as_deref().map(parse_scope).transpose()?,
        description,
        created_at,
    })
}

fn parse_scope(text: &str) -> Result<Scope> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
        what: format!("a token's scope: {e}"),
    })
}

fn scope_text(scope: Option<&Scope>) -> Option<String> {
    scope.map(|s| serde_json::to_string(s).unwrap_or_default())
}

impl Store {
    /// Stores a token of `user` by its hash (lowercase hex sha256 of the secret).
    pub async fn insert_token(&self, token_hash: &str, user: &UserId, scope: Option<&Scope>, description: &str) -> Result<TokenRecord> {
        let id = TokenId::random();
        let inserted = on_pool!(self, pool => {
            sqlx::query(
                "INSERT INTO tokens (id, token_hash, user_id, scope, description, created_at) \
                 SELECT $1, $2, id, $4, $5, $6 FROM users WHERE id = $3",
            )
            .bind(id.to_string())
            .bind(token_hash)
            .bind(user.to_string())
            .bind(scope_text(scope))
            .bind(description)
            .bind(now_ms())
            .execute(pool)
            .await
            .map(|done| done.rows_affected())
            .map_err(backend("storing a token"))
        });
        match inserted {
            Err(e) if e.is_unique_violation() => Err(StoreError::Conflict {
                what: "a token with this hash already exists".to_string(),
            }),
            Err(e) => Err(e),
            Ok(0) => Err(StoreError::not_found(format!("user {user}"))),
            Ok(_) => self.get_token(&id).await,
        }
    }

    pub async fn get_token(&self, id: &TokenId) -> Result<TokenRecord> {
        let row: Option<TokenRow> = on_pool!(self, pool => {
            sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {TOKEN_COLUMNS} FROM tokens t JOIN users u ON u.id = t.user_id WHERE t.id = $1")))
                .bind(id.to_string())
                .fetch_optional(pool)
                .await
                .map_err(backend_with(|| format!("reading token {id}")))?
        });
        token(row.ok_or_else(|| StoreError::not_found(format!("token {id}")))?)
    }

    /// The token whose hash is `token_hash`, with its user: what a request's credential is.
    pub async fn find_credential(&self, token_hash: &str) -> Result<Option<(TokenId, Option<Scope>, Account)>> {
        type Row = (String, Option<String>, String, String, bool, bool, bool);
        let row: Option<Row> = on_pool!(self, pool => {
            sqlx::query_as(
                "SELECT t.id, t.scope, u.id, u.name, u.admin, u.publisher, u.disabled \
                 FROM tokens t JOIN users u ON u.id = t.user_id WHERE t.token_hash = $1",
            )
            .bind(token_hash)
            .fetch_optional(pool)
            .await
            .map_err(backend("looking up a token"))?
        });
        let Some((token_id, scope, user_id, name, admin, publisher, disabled)) = row else {
            return Ok(None);
        };
        let account = Account {
            id: parse_id(&user_id, "user")?,
            name,
            admin,
            publisher,
            disabled,
        };
        Ok(Some((
            parse_id(&token_id, "token")?,
            scope.as_deref().map(parse_scope).transpose()?,
            account,
        )))
    }

    pub async fn count_tokens(&self) -> Result<i64> {
        on_pool!(self, pool => {
            sqlx::query_scalar("SELECT COUNT(*) FROM tokens")
                .fetch_one(pool)
                .await
                .map_err(backend("counting tokens"))
        })
    }

    /// Every token (of `user`, if given), oldest first. The secrets are not stored.
    pub async fn list_tokens(&self, user: Option<&UserId>) -> Result<Vec<TokenRecord>> {
        let rows: Vec<TokenRow> = on_pool!(self, pool => {
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT {TOKEN_COLUMNS} FROM tokens t JOIN users u ON u.id = t.user_id \
                 WHERE $1 IS NULL OR t.user_id = $1 ORDER BY t.created_at, t.id"
            )))
            .bind(user.map(|u| u.to_string()))
            .fetch_all(pool)
            .await
            .map_err(backend("listing tokens"))?
        });
        rows.into_iter().map(token).collect()
    }

    /// Deletes a token, unless no way in that can act as admin would remain (see
    /// [`guarded!`]): that is a [`StoreError::Conflict`].
    pub async fn delete_token(&self, id: &TokenId) -> Result<()> {
        let deleted = guarded!(self, tx => {
            sqlx::query("DELETE FROM tokens WHERE id = $1")
                .bind(id.to_string())
                .execute(&mut *tx)
                .await
                .map_err(backend_with(|| format!("deleting token {id}")))?
                .rows_affected()
        }, format!("token {id} is the last way in that can act as admin; {}", super::users::MAKE_ONE));
        if deleted == 0 {
            return Err(StoreError::not_found(format!("token {id}")));
        }
        Ok(())
    }
}
