//! What the other replicas announce through PostgreSQL (`LISTEN` on a session of its own): a
//! relayed request submitted or answered (`commands.rs`), a batch of events recorded
//! (`events.rs`). A notification is lost while the listener is disconnected, so whoever waits
//! on one also polls; each (re)connection is announced, to look again at once.

use tokio::sync::broadcast;

use super::commands::{ANSWERED, SUBMITTED};
use super::events::RECORDED;
use super::{CommandId, Db, EnvironmentId, Store};

/// What the other replicas announced of relayed requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandNews {
    /// A command for this environment waits.
    Submitted(EnvironmentId),
    Answered(CommandId),
    /// The listener (re)connected: what was announced meanwhile is lost, look again.
    Listening,
}

/// What the other replicas announced of recorded events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventNews {
    /// A batch of this environment's events was recorded.
    Recorded(EnvironmentId),
    /// The listener (re)connected: what was announced meanwhile is lost, look again.
    Listening,
}

/// The listener's two audiences; kept apart so that a stream of recorded batches never crowds
/// out a relayed request's answer.
#[derive(Debug)]
pub(super) struct Heralds {
    commands: broadcast::Sender<CommandNews>,
    events: broadcast::Sender<EventNews>,
}

impl Store {
    /// What the replicas announce of commands, on PostgreSQL (`None` on SQLite, where one
    /// process runs everything). The first call of either kind starts listening, until the pool
    /// is closed.
    pub fn command_news(&self) -> Option<broadcast::Receiver<CommandNews>> {
        self.heralds().map(|h| h.commands.subscribe())
    }

    /// What the replicas announce of recorded events, on PostgreSQL (`None` on SQLite).
    pub fn event_news(&self) -> Option<broadcast::Receiver<EventNews>> {
        self.heralds().map(|h| h.events.subscribe())
    }

    fn heralds(&self) -> Option<&Heralds> {
        let Db::Postgres(pool) = &self.db else { return None };
        let mut started = false;
        let heralds = self.news.get_or_init(|| {
            started = true;
            Heralds {
                commands: broadcast::channel(1024).0,
                events: broadcast::channel(1024).0,
            }
        });
        if started {
            tokio::spawn(listen(pool.clone(), heralds.commands.clone(), heralds.events.clone()));
        }
        Some(heralds)
    }
}

/// Hears every channel on a session of its own and passes what it hears on, until the pool is
/// closed.
async fn listen(pool: sqlx::PgPool, commands: broadcast::Sender<CommandNews>, events: broadcast::Sender<EventNews>) {
    while !pool.is_closed() {
        let listener = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
            listener.listen_all([SUBMITTED, ANSWERED, RECORDED]).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = match listener.await {
            Ok(listener) => listener,
            Err(e) => {
                tracing::debug!(error = %e, "cannot listen to the other replicas; polling only");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        let _ = commands.send(CommandNews::Listening);
        let _ = events.send(EventNews::Listening);
        while let Ok(Some(notification)) = listener.try_recv().await {
            let payload = notification.payload();
            match notification.channel() {
                SUBMITTED => {
                    if let Ok(env) = payload.parse() {
                        let _ = commands.send(CommandNews::Submitted(env));
                    }
                }
                ANSWERED => {
                    if let Ok(id) = payload.parse() {
                        let _ = commands.send(CommandNews::Answered(id));
                    }
                }
                _ => {
                    if let Ok(env) = payload.parse() {
                        let _ = events.send(EventNews::Recorded(env));
                    }
                }
            }
        }
    }
}
