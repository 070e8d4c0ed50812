//! The one driver of the watchers that follow an operation until it is over (a cluster's, a
//! process's): each round it reads the environment (gone, or run by another replica: the
//! watcher ends), subscribes to what
//! may wake it *before* it looks (so what is persisted after its look wakes it), looks once, and
//! waits for news worth a look, a tick, or the host stopping. What a watcher looks at and what
//! wakes it are its [`Watch`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use orc_manifest::error_chain;

use super::App;
use super::running::Running;
use crate::store::{Environment, EnvironmentId, StoreError};

/// How often a watcher looks again without news (news wakes it sooner), and waits after the
/// environment could not be read or started.
pub(super) const TICK: Duration = Duration::from_secs(2);
/// After news, how long the rest of a burst gets to arrive before the next look.
const SETTLE: Duration = Duration::from_millis(50);

/// What one look decided.
pub(super) enum Look<C> {
    /// The operation is over: the watcher ends.
    Done,
    /// Wait for news worth a look (`C`: what the look knows of what it waits for).
    Wait(C),
    /// Look again at once (what was read moved on meanwhile).
    Again,
}

/// What a watcher looks at, and what wakes it.
pub(super) trait Watch: Send + Sync + 'static {
    /// The news a watcher follows, subscribed before each look.
    type News: Send;
    /// What a look hands to the wait after it.
    type Carry: Send;

    fn subscribe(&self, running: &Arc<Running>) -> Self::News;

    fn look<'a>(&'a self, app: &'a Arc<App>, env: &'a Environment) -> impl Future<Output = Look<Self::Carry>> + Send + 'a;

    /// Completes on news worth a look.
    fn woken<'a>(news: &'a mut Self::News, carry: &'a mut Self::Carry) -> impl Future<Output = ()> + Send + 'a;
}

impl App {
    /// Runs `watch` in environment `env_id` until a look says done, the environment is gone or
    /// the host stops.
    pub(super) async fn drive<W: Watch>(self: Arc<Self>, env_id: EnvironmentId, watch: W) {
        let mut stopping = self.stopping.subscribe();
        loop {
            if *stopping.borrow() {
                return;
            }
            let env = match self.store.get_environment(&env_id).await {
                Ok(env) => env,
                Err(StoreError::NotFound { .. }) => return,
                Err(e) => {
                    tracing::warn!(error = %error_chain(&e), "cannot read the environment");
                    tokio::time::sleep(TICK).await;
                    continue;
                }
            };
            let mut news = match self.running(&env).await {
                Ok(running) => watch.subscribe(&running),
                // Another replica runs it, and its watchers there.
                Err(super::EnvError::Elsewhere { .. }) => return,
                Err(e) => {
                    tracing::warn!(error = %error_chain(&e), "environment not running");
                    tokio::time::sleep(TICK).await;
                    continue;
                }
            };
            let mut carry = match watch.look(&self, &env).await {
                Look::Done => return,
                Look::Again => continue,
                Look::Wait(carry) => carry,
            };
            tokio::select! {
                () = W::woken(&mut news, &mut carry) => tokio::time::sleep(SETTLE).await,
                _ = tokio::time::sleep(TICK) => {}
                _ = stopping.changed() => return,
            }
        }
    }
}
