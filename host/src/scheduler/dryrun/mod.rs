//! Dryrun of a whole version: every resource read and diffed through its adaptor, nothing
//! enforced, within the environment's and each node's limits. It runs beside the scheduler (it
//! changes nothing the scheduler owns), through the same executor.

pub mod report;

use std::collections::HashMap;
use std::sync::Arc;

use orc_runtime::CallContext;

use super::Version;
use crate::executor::{self, ActionReport, Mode};

/// Every resource of `version` dryrun, `concurrency` at once; reports in intent order.
pub async fn dryrun(version: &Version, ctx: &CallContext, concurrency: usize) -> Vec<ActionReport> {
    dryrun_limited(version, ctx, concurrency, concurrency).await
}

/// [`dryrun`] with at most `per_node` actions at once on any one node, as a deploy has: reads
/// of a whole environment on one node's single SSH connection only queue up there otherwise.
pub async fn dryrun_limited(version: &Version, ctx: &CallContext, concurrency: usize, per_node: usize) -> Vec<ActionReport> {
    dryrun_each(version, ctx, concurrency, per_node, |report| report).await
}

/// [`dryrun_limited`] with each report turned into what the caller keeps as soon as it is made
/// (a server's dryrun of 100,000 resources held every report and then its findings: ~75 MiB).
/// An action that panics is reported `crashed` for its resource; the others go on.
pub async fn dryrun_each<T>(
    version: &Version,
    ctx: &CallContext,
    concurrency: usize,
    per_node: usize,
    keep: impl FnMut(ActionReport) -> T,
) -> Vec<T> {
    use futures::StreamExt;
    let mut nodes: HashMap<&str, Arc<tokio::sync::Semaphore>> = HashMap::new();
    let limits: Vec<Arc<tokio::sync::Semaphore>> = version
        .intent
        .resources
        .iter()
        .map(|r| {
            nodes
                .entry(r.id.node.as_str())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(per_node.max(1))))
                .clone()
        })
        .collect();
    futures::stream::iter(0..version.intent.resources.len())
        .map(|i| {
            let (plugin, ctx, spec) = (version.plugins[i].clone(), ctx.clone(), version.intent.resources[i].clone());
            let limit = limits[i].clone();
            tokio::spawn(async move {
                let _turn = limit.acquire_owned().await.expect("the node's limit is never closed");
                let id = spec.id.to_string();
                executor::caught(&id, Mode::Dryrun, executor::execute(&plugin, &ctx, &spec, Mode::Dryrun)).await
            })
        })
        .buffered(concurrency.max(1))
        .map(|joined| joined.expect("a dryrun action's panic is caught inside its task"))
        .map(keep)
        .collect()
        .await
}
