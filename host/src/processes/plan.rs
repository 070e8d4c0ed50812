//! A process's tasks: the five steps of its service's automator on its node, in its own resource
//! set, through the cluster [`planner`] (`plan`; a move's: `plan_move`), with what it is told
//! of its connections (`Delivered`); and the waits for other processes' starts they hold.

use std::collections::{BTreeMap, BTreeSet};

use orc_cluster::{Layout, Needs, Template};
use serde_json::Value;

use super::requests::empty_object;
use super::{Deployment, ProcessDoc, ServicesError, set_of};
use crate::clusters::planner::{self, PlanInput};
use crate::intent::{ResourceId, ResourceSpec};

/// What a process is told of its connections (as `App::delivered_connections` finds them): what its
/// automator gets under the service's `connections_key`, and the starts its `configure` and
/// `start` wait for — a peer's where it goes (moving, or updating to other ports), where the
/// process is told it runs.
#[derive(Debug, Clone)]
pub(crate) struct Delivered {
    pub config: Value,
    pub waits: Vec<ResourceId>,
}

impl Delivered {
    /// No connections.
    pub(crate) fn none() -> Delivered {
        Delivered {
            config: empty_object(),
            waits: Vec::new(),
        }
    }
}

/// The template of one service, as the planner and the solver take it.
pub(crate) fn single_service(service: &str, automator: orc_manifest::Digest, needs: &Needs) -> Template {
    let value = serde_json::json!({"services": {service: {"automator": automator.to_string(), "needs": needs}}});
    Template::from_json(value).expect("a one-service template is valid")
}

/// The tasks of a process's resource set `set` for `target` with its `connections` as delivered
/// (`None`: every task undone), keeping `previous` tasks the new plan no longer has as removals.
pub(crate) fn plan(
    set: &str,
    target: Option<&Deployment>,
    previous: &[ResourceSpec],
    delivered: &Delivered,
) -> Result<Vec<ResourceSpec>, ServicesError> {
    let (template, layout, config, late_config) = match target {
        Some(t) => (
            single_service(&t.service, t.automator, &Needs::default()),
            [(t.node.clone(), [t.service.clone()])].into_iter().collect::<Layout>(),
            [(t.service.clone(), t.effective_config())].into_iter().collect(),
            [(t.service.clone(), t.late_config(&delivered.config))].into_iter().collect(),
        ),
        None => {
            let service = previous
                .iter()
                .find_map(|t| planner::parse_task_key(&t.id.key).map(|(_, s, _)| s.to_string()))
                .unwrap_or_else(|| "none".to_string());
            let automator = previous
                .iter()
                .find_map(|t| match &t.adaptor {
                    crate::intent::PluginRef::Digest(d) => Some(*d),
                    _ => None,
                })
                .unwrap_or_else(|| orc_manifest::Digest::of(b""));
            (
                single_service(&service, automator, &Needs::default()),
                Layout::default(),
                BTreeMap::new(),
                BTreeMap::new(),
            )
        }
    };
    let mut tasks = planner::plan(&PlanInput {
        cluster: set,
        template: &template,
        config: &config,
        layout: &layout,
        late_config: &late_config,
        stopped: &BTreeSet::new(),
        previous,
        keep_removals: true,
    })
    .map_err(|e| ServicesError::Invalid(e.to_string()))?;
    // The configuration's secrets are never shown (undoings keep what they had).
    if let Some(t) = target {
        let sensitive = (!t.secrets.is_empty()).then(|| Box::new(t.secrets.iter().map(|p| format!("/config{p}")).collect::<Vec<_>>()));
        for task in tasks.iter_mut().filter(|task| !task.purged) {
            task.sensitive = sensitive.clone();
        }
    }
    // The one requirement across sets: the steps told the connections (`configure`, `start`:
    // each may be the only one to run, the other unchanged) wait for the moving providers'
    // starts at their destinations, where they are told those run.
    if let Some(t) = target
        && !delivered.waits.is_empty()
    {
        for step in planner::Step::ALL.into_iter().filter(|s| s.sees_layout()) {
            let id = planner::task_id(set, &t.node, &t.service, step);
            if let Some(task) = tasks.iter_mut().find(|task| task.id == id && !task.purged) {
                task.requires.extend(delivered.waits.iter().cloned());
            }
        }
    }
    Ok(tasks)
}

/// A move's tasks: `target`'s on its new node, the old node's (`from`) purged, the old `stop`
/// (its purged `start`) waiting for the new `start`, so the process runs somewhere throughout.
pub(crate) fn plan_move(
    set: &str,
    target: &Deployment,
    from: &str,
    previous: &[ResourceSpec],
    delivered: &Delivered,
) -> Result<Vec<ResourceSpec>, ServicesError> {
    let mut tasks = plan(set, Some(target), previous, delivered)?;
    let started = planner::task_id(set, &target.node, &target.service, planner::Step::Start);
    for t in &mut tasks {
        if t.purged && t.id.node == from && planner::parse_task_key(&t.id.key).is_some_and(|(_, _, step)| step == planner::Step::Start) {
            t.requires.push(started.clone());
        }
    }
    Ok(tasks)
}

/// Whether `new` is `old` without some of its waits for other processes' starts, and nothing
/// else: a provider that has arrived where its consumer was told it goes. The row keeps them (met,
/// they order nothing), rather than being written and released again for no action: such a
/// start leaves its process's tasks only once that process has moved on (again, or terminated),
/// and each of those re-plans the waiting process first (told the new destination, or the
/// connection dropped).
pub(crate) fn only_waits_dropped(set: &str, new: &[ResourceSpec], old: &[ResourceSpec]) -> bool {
    new.len() == old.len()
        && new.iter().zip(old).all(|(n, o)| {
            n.id == o.id
                && n.adaptor == o.adaptor
                && n.attributes == o.attributes
                && n.purged == o.purged
                && n.set == o.set
                && n.requires.iter().all(|r| o.requires.contains(r))
                && o.requires
                    .iter()
                    .all(|r| n.requires.contains(r) || planner::parse_task_key(&r.key).is_some_and(|(other, _, _)| other != set))
        })
}

/// The other processes whose tasks `process`'s tasks (in `doc`) wait for: a `configure` or
/// `start` for a provider's `start` where it goes.
pub(crate) fn waited_for(process: &str, doc: &ProcessDoc) -> BTreeSet<String> {
    let own = set_of(process);
    doc.tasks
        .iter()
        .flat_map(|t| t.requires.iter())
        .filter_map(|r| planner::parse_task_key(&r.key).map(|(set, _, _)| set))
        .filter(|set| *set != own)
        .filter_map(|set| set.strip_prefix(super::SET_PREFIX).map(str::to_string))
        .collect()
}
