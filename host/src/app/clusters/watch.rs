//! The cluster watcher: one task per cluster operation that follows the environment's events
//! and moves the cluster on when its tasks are done or have failed (see the module doc of
//! [`crate::clusters`]). Also the lease sweeper and the restart of watchers with the host.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::RowChange;
use crate::app::App;
use crate::app::running::Running;
use crate::app::watcher::{Look, Watch};
use crate::clusters::plan::{has_removals, plan_for};
use crate::clusters::stored::{stored_doc, stored_template};
use crate::clusters::{ClusterDoc, ClusterError, ClusterStatus, OperationKind};
use crate::scheduler::subscribers::{Subscription, Want};
use crate::store::{ClusterRecord, Environment, EnvironmentId, now_ms};
use orc_manifest::error_chain;

/// How often expired leases are looked for.
const LEASE_SWEEP: Duration = Duration::from_secs(5);

/// What a watcher does next.
enum Next {
    Wait,
    Done,
}

/// A cluster watcher: woken by any batch of the environment's events.
struct ClusterWatch {
    cluster: String,
    generation: u64,
}

impl Watch for ClusterWatch {
    type News = Subscription;
    type Carry = ();

    fn subscribe(&self, running: &Arc<Running>) -> Subscription {
        running.stream.subscribe(Want::Counts)
    }

    async fn look(&self, app: &Arc<App>, env: &Environment) -> Look<()> {
        match app.step(env, &self.cluster, self.generation).await {
            Ok(Next::Done) => Look::Done,
            Ok(Next::Wait) => Look::Wait(()),
            // The row moved on since the step read it (an operator's operation, a lease): look
            // again at once.
            Err(ClusterError::Env(crate::app::EnvError::VersionConflict(what))) => {
                tracing::debug!(%what, "cluster changed meanwhile; looking again");
                Look::Again
            }
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "cluster step failed; trying again");
                Look::Wait(())
            }
        }
    }

    async fn woken(news: &mut Subscription, (): &mut ()) {
        if news.recv().await.is_none() {
            // A subscription that ended (it never does when it only counts) wakes no more: the
            // tick will.
            std::future::pending::<()>().await;
        }
    }
}

impl App {
    /// Follows `cluster`'s operation `generation` until it is over.
    pub(crate) fn spawn_watcher(self: &Arc<Self>, env: EnvironmentId, cluster: String, generation: u64) {
        let this = self.clone();
        let span = tracing::info_span!("cluster_watch", cluster = %cluster, generation);
        tokio::spawn(async move { this.drive(env, ClusterWatch { cluster, generation }).await }.instrument(span));
    }

    /// Looks at the cluster once and moves it on.
    async fn step(self: &Arc<Self>, env: &Environment, name: &str, generation: u64) -> Result<Next, ClusterError> {
        let Some(mut record) = self.store.find_cluster(&env.id, name).await? else {
            return Ok(Next::Done);
        };
        let mut doc = stored_doc(&record)?;
        if doc.generation != generation {
            return Ok(Next::Done);
        }
        let Some(status) = ClusterStatus::parse(&record.status) else {
            return Ok(Next::Done);
        };
        let progress = self.progress(env, &doc).await?;
        let template = stored_template(
            &self
                .store
                .get_template(&env.id, &record.template, Some(record.template_version))
                .await?,
        )?;
        let selected = template.select(&doc.services)?;
        match status {
            ClusterStatus::Active => Ok(Next::Done),
            ClusterStatus::Failed => {
                if doc.operation == OperationKind::Rollback {
                    return Ok(Next::Done);
                }
                if progress.done {
                    // Retries healed it.
                    self.settle(env, &mut record, &mut doc, &selected, ClusterStatus::Active).await?;
                    return Ok(Next::Done);
                }
                Ok(Next::Wait)
            }
            ClusterStatus::RollingBack | ClusterStatus::Deleting if progress.done => {
                doc.tasks.clear();
                if status == ClusterStatus::Deleting {
                    self.release_cluster_tasks(env, name, &[], RowChange::Delete(record.revision), None)
                        .await?;
                    tracing::info!(environment = %env.name, cluster = %name, "cluster deleted");
                } else {
                    record.status = ClusterStatus::Failed.as_str().to_string();
                    record.document = serde_json::to_string(&doc).expect("a cluster serialises");
                    self.release_cluster_tasks(env, name, &[], RowChange::Update(&record), None).await?;
                    tracing::warn!(environment = %env.name, cluster = %name, failure = ?doc.failure, "cluster create rolled back");
                }
                Ok(Next::Done)
            }
            ClusterStatus::RollingBack | ClusterStatus::Deleting => Ok(Next::Wait),
            _ if progress.done => {
                if let Some((service, false)) = doc.restart.clone() {
                    // The stop half of a restart is done: start it again.
                    doc.stopped.remove(&service);
                    doc.restart = Some((service, true));
                    let previous = std::mem::take(&mut doc.tasks);
                    doc.tasks = plan_for(name, &selected, &doc, &previous, true)?;
                    record.document = serde_json::to_string(&doc).expect("a cluster serialises");
                    self.release_cluster_tasks(env, name, &doc.tasks, RowChange::Update(&record), None)
                        .await?;
                    return Ok(Next::Wait);
                }
                doc.restart = None;
                self.settle(env, &mut record, &mut doc, &selected, ClusterStatus::Active).await?;
                tracing::info!(environment = %env.name, cluster = %name, operation = ?doc.operation, "cluster operation done");
                Ok(Next::Done)
            }
            ClusterStatus::Creating if progress.failed.is_some() => {
                let failure = progress.failed;
                tracing::warn!(environment = %env.name, cluster = %name, failure = ?failure, "cluster create failed; rolling back");
                self.undo_cluster(env, record, OperationKind::Rollback, failure, None).await?;
                Ok(Next::Done)
            }
            _ if progress.failed.is_some() => {
                if doc.failure.is_none() {
                    tracing::warn!(environment = %env.name, cluster = %name, failure = ?progress.failed, "cluster operation failed");
                    doc.failure = progress.failed;
                    record.status = ClusterStatus::Failed.as_str().to_string();
                    record.document = serde_json::to_string(&doc).expect("a cluster serialises");
                    self.write_cluster(env, &record).await?;
                }
                Ok(Next::Wait)
            }
            _ => Ok(Next::Wait),
        }
    }

    /// Ends an operation: drops the removed tasks that are done from the plan, then stores
    /// `status`.
    async fn settle(
        &self,
        env: &Environment,
        record: &mut ClusterRecord,
        doc: &mut ClusterDoc,
        selected: &orc_cluster::Template,
        status: ClusterStatus,
    ) -> Result<(), ClusterError> {
        let removals = has_removals(doc);
        if removals {
            doc.tasks = plan_for(&record.name, selected, doc, &[], false)?;
        }
        doc.failure = None;
        record.status = status.as_str().to_string();
        record.document = serde_json::to_string(&doc).expect("a cluster serialises");
        *record = if removals {
            let name = record.name.clone();
            self.release_cluster_tasks(env, &name, &doc.tasks, RowChange::Update(record), None)
                .await?
                .expect("an updated row")
        } else {
            self.write_cluster(env, record).await?
        };
        Ok(())
    }

    /// Restarts the watchers of `env`'s clusters with an operation under way (or failed, to
    /// notice a retry that heals them). Called when this replica starts running `env`.
    pub(in crate::app) async fn resume_clusters(self: &Arc<Self>, env: &Environment) {
        match self.store.list_clusters(&env.id).await {
            Ok(clusters) => {
                for c in clusters {
                    let watched = ClusterStatus::parse(&c.status).is_some_and(|s| s != ClusterStatus::Active);
                    if let (true, Ok(doc)) = (watched, stored_doc(&c)) {
                        self.spawn_watcher(env.id, c.name.clone(), doc.generation);
                    }
                }
            }
            Err(e) => tracing::error!(environment = %env.name, error = %error_chain(&e), "cannot list clusters"),
        }
    }

    /// Deletes clusters whose lease has ended, in the environments this replica runs.
    pub(in crate::app) async fn sweep_leases(self: Arc<Self>) {
        let mut stopping = self.stopping.subscribe();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(LEASE_SWEEP) => {}
                _ = stopping.changed() => return,
            }
            let expired = match self.store.expired_clusters(now_ms()).await {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!(error = %error_chain(&e), "cannot look for expired cluster leases");
                    continue;
                }
            };
            for (env_id, record) in expired {
                if ClusterStatus::parse(&record.status) == Some(ClusterStatus::Deleting) || !self.ownership.holds(&env_id) {
                    continue;
                }
                let Ok(env) = self.store.get_environment(&env_id).await else {
                    continue;
                };
                tracing::info!(environment = %env.name, cluster = %record.name, "cluster lease expired: deleting");
                if let Err(e) = self.undo_cluster(&env, record, OperationKind::Delete, None, None).await {
                    tracing::warn!(environment = %env.name, error = %error_chain(&e), "cannot delete an expired cluster");
                }
            }
        }
    }
}
