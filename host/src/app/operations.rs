//! Operations: a user deploy or repair through the scheduler, and a dryrun of a version; each is
//! recorded in the store at once and completed there when it is over.

use std::sync::Arc;

use orc_manifest::error_chain;

use super::{App, EnvError};
use crate::scheduler::dryrun::report::{DryrunResult, ResourceFinding};
use crate::store::{DryrunReport, DryrunStatus, Operation, OperationKind, now_ms};

impl App {
    /// Starts a user deploy or repair; the returned operation is completed (in the store) with its
    /// outcome once the scheduler has settled.
    pub async fn start_operation(&self, key: &str, kind: OperationKind, author: Option<&str>) -> Result<Operation, EnvError> {
        let env = self.get(key).await?;
        let running = self.running(&env).await?;
        running.check_scheduler()?;
        let op = self.store.create_operation(&env.id, kind, author).await?;
        let started = match kind {
            OperationKind::Deploy => running.scheduler.deploy_failed(),
            OperationKind::Repair => running.scheduler.repair(),
        };
        if let Err(e) = started {
            let e = running.unavailable(e);
            let failed = serde_json::json!({ "error": { "code": "scheduler_unavailable", "message": e.to_string() } });
            self.store.interrupt_operation(&env.id, &op.id, &failed.to_string()).await?;
            return Err(e);
        }
        let (store, scheduler, op_id, since) = (self.store.clone(), running.scheduler.clone(), op.id, op.created_at);
        let name = running.name.clone();
        tokio::spawn(async move {
            let snapshot = match scheduler.settled().await {
                Ok(snapshot) => snapshot,
                Err(e) => {
                    // Never `done` for work that will not happen.
                    let message = format!(
                        "the scheduler of environment `{name}` stopped before the operation ended: {}",
                        e.reason
                    );
                    let failed = serde_json::json!({ "error": { "code": "scheduler_unavailable", "message": message } });
                    if let Err(e) = store.interrupt_operation(&env.id, &op_id, &failed.to_string()).await {
                        tracing::error!(environment = %env.name, operation = %op_id, error = %error_chain(&e), "cannot record the operation's end");
                    }
                    return;
                }
            };
            // Every action of the operation finished before the settle answer (the writer
            // records events before it replies), so the log counts them all.
            let actions = match store.count_actions(&env.id, since, now_ms() + 1).await {
                Ok(counts) => counts.into_iter().collect::<std::collections::BTreeMap<_, _>>(),
                Err(e) => {
                    tracing::error!(environment = %env.name, error = %error_chain(&e), "cannot count the operation's actions");
                    Default::default()
                }
            };
            let statuses: std::collections::BTreeMap<_, _> = snapshot.counts.iter().map(|(s, n)| (s.as_str(), *n)).collect();
            let result = serde_json::json!({ "version": snapshot.version, "resources": statuses, "actions": actions });
            if let Err(e) = store.complete_operation(&env.id, &op_id, &result.to_string()).await {
                tracing::error!(environment = %env.name, operation = %op_id, error = %error_chain(&e), "cannot complete the operation");
            }
        });
        Ok(op)
    }

    /// Starts a dryrun of `version` (default: the latest); the returned report is completed (in
    /// the store) once every resource has been read and compared. Nothing is changed.
    pub async fn start_dryrun(&self, key: &str, version: Option<i64>, author: Option<&str>) -> Result<DryrunReport, EnvError> {
        let env = self.get(key).await?;
        let version = match version {
            Some(v) => v,
            None if env.latest_version > 0 => env.latest_version,
            None => return Err(EnvError::NoVersion(env.name)),
        };
        let running = self.running(&env).await?;
        let limit = env.settings.limits.concurrent_dryruns;
        let slot = running.dryrun_slot(limit).ok_or_else(|| EnvError::RateLimited {
            what: format!(
                "environment `{}` runs {limit} dryruns already (`limits.concurrent_dryruns`)",
                env.name
            ),
            retry_after_s: 1,
        })?;
        let loaded = match running.released(version) {
            Some(shared) => shared,
            None => Arc::new(self.load_version(&env.id, version, &running.grants()).await?),
        };
        let report = self.store.create_dryrun(&env.id, version, author).await?;
        let (store, ctx, id) = (self.store.clone(), running.ctx(), report.id);
        let (concurrency, per_node) = (env.settings.env_concurrency as usize, env.settings.per_node_concurrency as usize);
        tokio::spawn(async move {
            let findings = crate::scheduler::dryrun_each(&loaded, &ctx, concurrency, per_node, ResourceFinding::of).await;
            drop(loaded);
            drop(slot);
            let result = DryrunResult::from_findings(version, findings);
            let json = serde_json::to_string(&result).expect("a dryrun report serialises");
            if let Err(e) = store.complete_dryrun(&env.id, &id, DryrunStatus::Done, &json).await {
                tracing::error!(environment = %env.name, dryrun = %id, error = %error_chain(&e), "cannot store the dryrun report");
            }
        });
        Ok(report)
    }
}
