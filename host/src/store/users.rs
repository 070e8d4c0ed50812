//! Users (local accounts; the password only as its argon2id hash) and their roles per
//! environment (memberships). Changes that could lock every admin out — deleting, disabling or
//! demoting a user, removing a password, deleting a token — run in a transaction that is rolled
//! back when no way in that can act as admin would remain ([`guarded!`]).

use super::error::{backend, backend_with};
use super::{
    BeginWrite as _, EnvironmentId, Membership, Result, Store, StoreError, TokenId, UserId, UserRecord, now_ms, parse_id, parse_name,
};
use crate::access::Role;

/// The ways in that can act as admin without any scope to check: an enabled admin's password,
/// or an unscoped token of one.
pub(super) const PLAIN_WAYS_IN: &str = "SELECT COUNT(*) FROM users u WHERE u.admin AND NOT u.disabled \
     AND (u.password_hash IS NOT NULL OR EXISTS (SELECT 1 FROM tokens t WHERE t.user_id = u.id AND t.scope IS NULL))";

/// The scopes of the scoped tokens of enabled admins: a way in if one carries `admin`.
pub(super) const SCOPED_WAYS_IN: &str = "SELECT t.scope FROM tokens t JOIN users u ON u.id = t.user_id \
     WHERE u.admin AND NOT u.disabled AND t.scope IS NOT NULL";

/// The advisory lock (PostgreSQL) every change that could remove an admin's way in takes first,
/// so that two such changes never both see the other's way in still there and both commit.
/// SQLite's write transactions already take turns.
pub(super) const ACCESS_LOCK: i64 = 0x6f72_635f_6163_6373; // "orc_accs"

/// Whether a scope (a token's, as stored) lets its admin act as admin.
pub(super) fn scope_acts_as_admin(text: &str) -> bool {
    serde_json::from_str::<crate::access::Scope>(text).is_ok_and(|scope| scope.admin)
}

/// Runs `$body` (statements on `&mut *$tx`) in a transaction that first takes its turn at
/// [`ACCESS_LOCK`] and commits only if a way in that can act as admin remains afterwards: an
/// enabled admin with a password, or a token of an enabled admin that is unscoped or whose
/// scope includes `admin`. Otherwise it rolls back and answers `Conflict { what: $refusal }`.
///
/// Architecture invariant: every change that can remove such a way in (deleting a token,
/// disabling, demoting or deleting a user, removing a password) runs through here.
macro_rules! guarded {
    ($store:expr, $tx:ident => $body:expr, $refusal:expr) => {
        on_pool!($store, pool => {
            let mut $tx = pool
                .begin_serialized($crate::store::users::ACCESS_LOCK)
                .await
                .map_err(backend("starting a change of users or tokens"))?;
            let out = $body;
            let plain: i64 = sqlx::query_scalar($crate::store::users::PLAIN_WAYS_IN)
                .fetch_one(&mut *$tx)
                .await
                .map_err(backend("counting the ways in that can act as admin"))?;
            let remains = plain > 0 || {
                let scopes: Vec<String> = sqlx::query_scalar($crate::store::users::SCOPED_WAYS_IN)
                    .fetch_all(&mut *$tx)
                    .await
                    .map_err(backend("reading the scopes of admins' tokens"))?;
                scopes.iter().any(|s| $crate::store::users::scope_acts_as_admin(s))
            };
            if !remains {
                $tx.rollback().await.map_err(backend("rolling back a refused change"))?;
                return Err(StoreError::Conflict { what: $refusal });
            }
            $tx.commit().await.map_err(backend("committing a change of users or tokens"))?;
            out
        })
    };
}
pub(super) use guarded;

/// What a refusal says to do instead.
pub(super) const MAKE_ONE: &str = "make another first (an admin with a password, or an admin's token carrying `admin`)";

type UserRow = (String, String, bool, bool, bool, bool, i64);

const USER_COLUMNS: &str = "id, name, admin, publisher, disabled, password_hash IS NOT NULL, created_at";

fn user(row: UserRow) -> Result<UserRecord> {
    let (id, name, admin, publisher, disabled, has_password, created_at) = row;
    Ok(UserRecord {
        id: parse_id(&id, "user")?,
        name,
        admin,
        publisher,
        disabled,
        has_password,
        created_at,
    })
}

/// What a change of a user sets; `None` leaves a field as it is. `password_hash: Some(None)`
/// removes the password.
#[derive(Debug, Clone, Default)]
pub struct UserChange {
    pub password_hash: Option<Option<String>>,
    pub admin: Option<bool>,
    pub publisher: Option<bool>,
    pub disabled: Option<bool>,
}

impl Store {
    pub async fn insert_user(&self, name: &str, password_hash: Option<&str>, admin: bool, publisher: bool) -> Result<UserRecord> {
        let id = UserId::random();
        let inserted = on_pool!(self, pool => {
            sqlx::query(
                "INSERT INTO users (id, name, password_hash, admin, publisher, disabled, created_at) \
                 VALUES ($1, $2, $3, $4, $5, FALSE, $6)",
            )
            .bind(id.to_string())
            .bind(name)
            .bind(password_hash)
            .bind(admin)
            .bind(publisher)
            .bind(now_ms())
            .execute(pool)
            .await
            .map(|_| ())
            .map_err(backend_with(|| format!("storing user `{name}`")))
        });
        match inserted {
            Err(e) if e.is_unique_violation() => Err(StoreError::Conflict {
                what: format!("a user named `{name}` already exists"),
            }),
            Err(e) => Err(e),
            Ok(_) => self
                .find_user(name)
                .await?
                .ok_or_else(|| StoreError::not_found(format!("user `{name}`"))),
        }
    }

    /// On a database with no user yet: the user `admin` (server-wide admin, no password) and a
    /// token for it whose hash is `token_hash`, in one transaction that takes its turn at
    /// [`ACCESS_LOCK`] first; `false` if a user exists. However many replicas start together on
    /// an empty database, one of them makes the admin.
    pub async fn create_first_admin(&self, token_hash: &str) -> Result<bool> {
        let context = "making the first admin";
        let (user, token) = (UserId::random(), TokenId::random());
        on_pool!(self, pool => {
            let mut tx = pool.begin_serialized(ACCESS_LOCK).await.map_err(backend(context))?;
            let users: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM users")
                .fetch_one(&mut *tx)
                .await
                .map_err(backend(context))?;
            if users > 0 {
                return Ok(false);
            }
            sqlx::query(
                "INSERT INTO users (id, name, password_hash, admin, publisher, disabled, created_at) \
                 VALUES ($1, 'admin', NULL, TRUE, FALSE, FALSE, $2)",
            )
            .bind(user.to_string())
            .bind(now_ms())
            .execute(&mut *tx)
            .await
            .map_err(backend(context))?;
            sqlx::query(
                "INSERT INTO tokens (id, token_hash, user_id, scope, description, created_at) \
                 VALUES ($1, $2, $3, NULL, 'created on the first start', $4)",
            )
            .bind(token.to_string())
            .bind(token_hash)
            .bind(user.to_string())
            .bind(now_ms())
            .execute(&mut *tx)
            .await
            .map_err(backend(context))?;
            tx.commit().await.map_err(backend(context))?;
        });
        Ok(true)
    }

    pub async fn count_users(&self) -> Result<i64> {
        on_pool!(self, pool => {
            sqlx::query_scalar("SELECT COUNT(*) FROM users")
                .fetch_one(pool)
                .await
                .map_err(backend("counting users"))
        })
    }

    /// Every user, by name.
    pub async fn list_users(&self) -> Result<Vec<UserRecord>> {
        let rows: Vec<UserRow> = on_pool!(self, pool => {
            sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {USER_COLUMNS} FROM users ORDER BY name")))
                .fetch_all(pool)
                .await
                .map_err(backend("listing users"))?
        });
        rows.into_iter().map(user).collect()
    }

    pub async fn find_user(&self, name: &str) -> Result<Option<UserRecord>> {
        Ok(self.find_user_with_password(name).await?.map(|(u, _)| u))
    }

    /// A user and its password's hash (to check a password against).
    pub async fn find_user_with_password(&self, name: &str) -> Result<Option<(UserRecord, Option<String>)>> {
        // No stored name holds NUL, which PostgreSQL's text cannot even be asked about.
        if name.contains('\0') {
            return Ok(None);
        }
        type WithPassword = (String, String, bool, bool, bool, bool, i64, Option<String>);
        let row: Option<WithPassword> = on_pool!(self, pool => {
            sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {USER_COLUMNS}, password_hash FROM users WHERE name = $1")))
                .bind(name)
                .fetch_optional(pool)
                .await
                .map_err(backend("looking up a user"))?
        });
        row.map(|(id, name, admin, publisher, disabled, has_password, created_at, hash)| {
            Ok((user((id, name, admin, publisher, disabled, has_password, created_at))?, hash))
        })
        .transpose()
    }

    /// Changes a user, unless the change would leave no way in that can act as admin.
    pub async fn update_user(&self, id: &UserId, change: &UserChange) -> Result<()> {
        let password = change.password_hash.clone();
        let updated = guarded!(self, tx => {
            sqlx::query(
                "UPDATE users SET \
                   password_hash = CASE WHEN $2 THEN $3 ELSE password_hash END, \
                   admin = COALESCE($4, admin), publisher = COALESCE($5, publisher), disabled = COALESCE($6, disabled) \
                 WHERE id = $1",
            )
            .bind(id.to_string())
            .bind(password.is_some())
            .bind(password.flatten())
            .bind(change.admin)
            .bind(change.publisher)
            .bind(change.disabled)
            .execute(&mut *tx)
            .await
            .map_err(backend_with(|| format!("changing user {id}")))?
            .rows_affected()
        }, format!("the change would leave no way in that can act as admin (an enabled admin with a password, or a token of one that is unscoped or scoped to `admin`); {MAKE_ONE}"));
        if updated == 0 {
            return Err(StoreError::not_found(format!("user {id}")));
        }
        Ok(())
    }

    /// Deletes a user with its tokens and memberships, unless no way in that can act as admin
    /// would remain.
    pub async fn delete_user(&self, id: &UserId) -> Result<()> {
        let deleted = guarded!(self, tx => {
            sqlx::query("DELETE FROM users WHERE id = $1")
                .bind(id.to_string())
                .execute(&mut *tx)
                .await
                .map_err(backend_with(|| format!("deleting user {id}")))?
                .rows_affected()
        }, format!("user {id} holds the last way in that can act as admin; {MAKE_ONE}"));
        if deleted == 0 {
            return Err(StoreError::not_found(format!("user {id}")));
        }
        Ok(())
    }

    /// Gives `user` `role` in the environment (replacing the role it had there).
    pub async fn set_membership(&self, user: &UserId, environment: &EnvironmentId, role: Role) -> Result<()> {
        on_pool!(self, pool => {
            sqlx::query(
                "INSERT INTO memberships (user_id, environment_id, role) VALUES ($1, $2, $3) \
                 ON CONFLICT (user_id, environment_id) DO UPDATE SET role = excluded.role",
            )
            .bind(user.to_string())
            .bind(environment.to_string())
            .bind(role.as_str())
            .execute(pool)
            .await
            .map_err(backend_with(|| format!("giving user {user} a role in environment {environment}")))?
            .rows_affected()
        });
        Ok(())
    }

    /// Removes the user's role in the environment; whether it had one.
    pub async fn delete_membership(&self, user: &UserId, environment: &EnvironmentId) -> Result<bool> {
        let deleted = on_pool!(self, pool => {
            sqlx::query("DELETE FROM memberships WHERE user_id = $1 AND environment_id = $2")
                .bind(user.to_string())
                .bind(environment.to_string())
                .execute(pool)
                .await
                .map_err(backend_with(|| format!("removing user {user} from environment {environment}")))?
                .rows_affected()
        });
        Ok(deleted > 0)
    }

    /// The members of an environment (`Some`), or the environments of a user, by name.
    async fn memberships(&self, environment: Option<&EnvironmentId>, user: Option<&UserId>) -> Result<Vec<Membership>> {
        let rows: Vec<(String, String, String, String, String)> = on_pool!(self, pool => {
            sqlx::query_as(
                "SELECT m.user_id, u.name, m.environment_id, e.name, m.role FROM memberships m \
                 JOIN users u ON u.id = m.user_id JOIN environments e ON e.id = m.environment_id \
                 WHERE ($1 IS NULL OR m.environment_id = $1) AND ($2 IS NULL OR m.user_id = $2) ORDER BY e.name, u.name",
            )
            .bind(environment.map(|e| e.to_string()))
            .bind(user.map(|u| u.to_string()))
            .fetch_all(pool)
            .await
            .map_err(backend("listing memberships"))?
        });
        rows.into_iter()
            .map(|(user_id, user, environment_id, environment, role)| {
                Ok(Membership {
                    user_id: parse_id(&user_id, "user")?,
                    user,
                    environment_id: parse_id(&environment_id, "environment")?,
                    environment,
                    role: parse_name(&role)?,
                })
            })
            .collect()
    }

    pub async fn members(&self, environment: &EnvironmentId) -> Result<Vec<Membership>> {
        self.memberships(Some(environment), None).await
    }

    pub async fn memberships_of(&self, user: &UserId) -> Result<Vec<Membership>> {
        self.memberships(None, Some(user)).await
    }
}
