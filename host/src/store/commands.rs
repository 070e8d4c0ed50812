//! Requests relayed to the replica that runs their environment (`commands`).
//!
//! A replica that gets a request for an environment another replica runs writes it here
//! ([`Store::submit_command`]) and waits for its answer; the owner claims it
//! ([`Store::claim_commands`]: only while it holds the environment's lease, and each row once),
//! runs it and writes the answer ([`Store::answer_command`]). On PostgreSQL both steps are
//! announced (`NOTIFY orc_commands` with the environment, `orc_answers` with the command), heard
//! through [`Store::command_news`] (`news.rs`); a notification is lost while a listener is disconnected, so
//! both sides poll as well.

use super::error::{backend, backend_with};
use super::{CommandId, Db, EnvironmentId, Millis, ReplicaId, Result, Store, StoreError, now_ms, parse_id};

/// Announces a submitted command; the payload is its environment's id.
pub(super) const SUBMITTED: &str = "orc_commands";
/// Announces an answered command; the payload is its id.
pub(super) const ANSWERED: &str = "orc_answers";

/// A relayed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRecord {
    pub id: CommandId,
    pub env: EnvironmentId,
    pub method: String,
    /// Path and query.
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The hash of the caller's token, as the tokens table holds it.
    pub credential: String,
    pub submitted_by: ReplicaId,
}

/// The owner's answer to a relayed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The error code the answer carries, if it is a refusal.
    pub code: Option<String>,
}

/// Where a relayed request is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandState {
    /// No replica has claimed it yet.
    Waiting,
    /// Claimed by this replica, which has not answered yet.
    Claimed(ReplicaId),
    Answered(CommandAnswer),
    /// No such row: withdrawn or forgotten.
    Gone,
}

fn headers_json(headers: &[(String, String)]) -> String {
    serde_json::to_string(headers).expect("pairs of strings serialise")
}

fn headers_of(text: &str) -> Result<Vec<(String, String)>> {
    serde_json::from_str(text).map_err(|e| StoreError::corrupt(format!("a command's headers are not pairs of strings: {e}")))
}

const COLUMNS: &str = "id, environment_id, method, target, headers, body, credential, submitted_by";

type Row = (String, String, String, String, String, Vec<u8>, String, String);

fn record(row: Row) -> Result<CommandRecord> {
    let (id, env, method, target, headers, body, credential, submitted_by) = row;
    Ok(CommandRecord {
        id: parse_id(&id, "command")?,
        env: parse_id(&env, "environment")?,
        method,
        target,
        headers: headers_of(&headers)?,
        body,
        credential,
        submitted_by: parse_id(&submitted_by, "replica")?,
    })
}

type AnswerRow = (Option<String>, Option<i32>, Option<String>, Option<Vec<u8>>, Option<String>);

impl Store {
    /// Writes `command` for its environment's owner to claim, and announces it.
    pub async fn submit_command(&self, command: &CommandRecord) -> Result<()> {
        let context = || format!("relaying a request for environment {}", command.env);
        let insert = "INSERT INTO commands (id, environment_id, method, target, headers, body, credential, submitted_by, submitted_at) \
                      VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
        on_pool!(self, pool => {
            sqlx::query(insert)
                .bind(command.id.to_string())
                .bind(command.env.to_string())
                .bind(&command.method)
                .bind(&command.target)
                .bind(headers_json(&command.headers))
                .bind(&command.body)
                .bind(&command.credential)
                .bind(command.submitted_by.to_string())
                .bind(now_ms())
                .execute(pool)
                .await
                .map_err(backend_with(context))?;
        });
        self.announce(SUBMITTED, command.env.to_string()).await;
        Ok(())
    }

    /// Claims for `me`, oldest first, up to `limit` commands waiting for `env`, if `me` holds
    /// its lease; each command is claimed by one replica only.
    pub async fn claim_commands(&self, env: &EnvironmentId, me: ReplicaId, limit: i64) -> Result<Vec<CommandRecord>> {
        let context = || format!("claiming the requests relayed for environment {env}");
        // Concurrent claims on PostgreSQL skip each other's rows rather than wait for them.
        let claim = match &self.db {
            Db::Sqlite(_) => format!(
                "UPDATE commands SET claimed_by = $2 WHERE id IN \
                 (SELECT id FROM commands WHERE environment_id = $1 AND claimed_by IS NULL ORDER BY submitted_at LIMIT $3) \
                 AND EXISTS (SELECT 1 FROM env_leases WHERE environment_id = $1 AND holder = $2) RETURNING {COLUMNS}"
            ),
            Db::Postgres(_) => format!(
                "UPDATE commands SET claimed_by = $2 WHERE id IN \
                 (SELECT id FROM commands WHERE environment_id = $1 AND claimed_by IS NULL ORDER BY submitted_at LIMIT $3 \
                  FOR UPDATE SKIP LOCKED) \
                 AND EXISTS (SELECT 1 FROM env_leases WHERE environment_id = $1 AND holder = $2) RETURNING {COLUMNS}"
            ),
        };
        on_pool!(self, pool => {
            let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(claim))
                .bind(env.to_string())
                .bind(me.to_string())
                .bind(limit)
                .fetch_all(pool)
                .await
                .map_err(backend_with(context))?;
            rows.into_iter().map(record).collect()
        })
    }

    /// The environments that have commands no replica has claimed.
    pub async fn environments_with_commands(&self) -> Result<Vec<EnvironmentId>> {
        let ids: Vec<String> = on_pool!(self, pool => {
            sqlx::query_scalar("SELECT DISTINCT environment_id FROM commands WHERE claimed_by IS NULL")
                .fetch_all(pool)
                .await
                .map_err(backend("looking for relayed requests"))?
        });
        ids.iter().map(|id| parse_id(id, "environment")).collect()
    }

    /// Records the answer to command `id`, and announces it.
    pub async fn answer_command(&self, id: CommandId, answer: &CommandAnswer) -> Result<()> {
        let context = || format!("answering relayed request {id}");
        let update = "UPDATE commands SET status = $2, answer_headers = $3, answer_body = $4, code = $5, answered_at = $6 WHERE id = $1";
        on_pool!(self, pool => {
            sqlx::query(update)
                .bind(id.to_string())
                .bind(i32::from(answer.status))
                .bind(headers_json(&answer.headers))
                .bind(&answer.body)
                .bind(&answer.code)
                .bind(now_ms())
                .execute(pool)
                .await
                .map_err(backend_with(context))?;
        });
        self.announce(ANSWERED, id.to_string()).await;
        Ok(())
    }

    /// Where command `id` is.
    pub async fn command_state(&self, id: CommandId) -> Result<CommandState> {
        let context = || format!("reading relayed request {id}");
        let select = "SELECT claimed_by, status, answer_headers, answer_body, code FROM commands WHERE id = $1";
        let row: Option<AnswerRow> = on_pool!(self, pool => {
            sqlx::query_as(select)
                .bind(id.to_string())
                .fetch_optional(pool)
                .await
                .map_err(backend_with(context))?
        });
        let Some((claimed_by, status, headers, body, code)) = row else {
            return Ok(CommandState::Gone);
        };
        match (status, claimed_by) {
            (Some(status), _) => Ok(CommandState::Answered(CommandAnswer {
                status: u16::try_from(status).map_err(|_| StoreError::corrupt(format!("relayed request {id} has status {status}")))?,
                headers: headers_of(headers.as_deref().unwrap_or("[]"))?,
                body: body.unwrap_or_default(),
                code,
            })),
            (None, Some(by)) => Ok(CommandState::Claimed(parse_id(&by, "replica")?)),
            (None, None) => Ok(CommandState::Waiting),
        }
    }

    /// Withdraws command `id` unless a replica has claimed it: `true` if it is withdrawn (it
    /// will never run).
    pub async fn withdraw_command(&self, id: CommandId) -> Result<bool> {
        let context = || format!("withdrawing relayed request {id}");
        let done = on_pool!(self, pool => {
            sqlx::query("DELETE FROM commands WHERE id = $1 AND claimed_by IS NULL")
                .bind(id.to_string())
                .execute(pool)
                .await
                .map_err(backend_with(context))?
                .rows_affected()
        });
        Ok(done == 1)
    }

    /// Forgets command `id` (its answer is delivered).
    pub async fn forget_command(&self, id: CommandId) -> Result<()> {
        let context = || format!("forgetting relayed request {id}");
        on_pool!(self, pool => {
            sqlx::query("DELETE FROM commands WHERE id = $1")
                .bind(id.to_string())
                .execute(pool)
                .await
                .map_err(backend_with(context))?;
        });
        Ok(())
    }

    /// Forgets the commands submitted before `before` (by the submitter's clock), whatever
    /// became of them: their submitters stopped waiting long ago.
    pub async fn forget_commands_before(&self, before: Millis) -> Result<u64> {
        Ok(on_pool!(self, pool => {
            sqlx::query("DELETE FROM commands WHERE submitted_at < $1")
                .bind(before)
                .execute(pool)
                .await
                .map_err(backend("forgetting old relayed requests"))?
                .rows_affected()
        }))
    }

    /// Tells the other replicas on PostgreSQL (a lost announcement is made up for by polling).
    async fn announce(&self, channel: &str, payload: String) {
        let Db::Postgres(pool) = &self.db else { return };
        if let Err(e) = sqlx::query("SELECT pg_notify($1, $2)")
            .bind(channel)
            .bind(&payload)
            .execute(pool)
            .await
        {
            tracing::debug!(error = %e, channel, "cannot announce a relayed request; it is found by polling");
        }
    }
}
