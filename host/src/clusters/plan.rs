//! A cluster's tasks from what its document says: each service's effective configuration (the
//! template's with the cluster's overrides merged in), the tasks for its layout and stopped
//! services through the [`planner`] (`plan_for`; planned anew for an operation: `replan`), and
//! whether a plan still holds removals to drop once they are done.

use std::collections::BTreeMap;

use orc_cluster::Template;
use serde_json::Value;

use super::planner::{self, PlanInput, Step};
use super::{ClusterDoc, ClusterError};
use crate::intent::ResourceSpec;
use crate::json::merge_patch;

/// Each service's configuration: the template's with the cluster's overrides merged in.
pub(crate) fn effective_config(template: &Template, doc: &ClusterDoc) -> BTreeMap<String, Value> {
    template
        .services
        .iter()
        .filter(|(name, _)| doc.services.contains(name))
        .map(|(name, s)| {
            let mut config = s.config.clone();
            if let Some(patch) = doc.config.get(name) {
                merge_patch(&mut config, patch.clone());
            }
            (name.clone(), config)
        })
        .collect()
}

/// The cluster's tasks for its layout, stopped services and configuration.
pub(crate) fn plan_for(
    name: &str,
    template: &Template,
    doc: &ClusterDoc,
    previous: &[ResourceSpec],
    keep_removals: bool,
) -> Result<Vec<ResourceSpec>, ClusterError> {
    let config = effective_config(template, doc);
    planner::plan(&PlanInput {
        cluster: name,
        template,
        config: &config,
        layout: &doc.layout,
        late_config: &BTreeMap::new(),
        stopped: &doc.stopped,
        previous,
        keep_removals,
    })
    .map_err(|e| ClusterError::Invalid(e.to_string()))
}

/// The cluster's tasks planned anew for `selected` (taken out of `doc`): the previous ones and
/// the new ones.
pub(crate) fn replan(
    name: &str,
    selected: &Template,
    doc: &mut ClusterDoc,
) -> Result<(Vec<ResourceSpec>, Vec<ResourceSpec>), ClusterError> {
    let previous = std::mem::take(&mut doc.tasks);
    let tasks = plan_for(name, selected, doc, &previous, true)?;
    Ok((previous, tasks))
}

/// Whether `tasks` still holds removals (purged tasks of (node, service) pairs the layout no
/// longer has) that can be dropped once done.
pub(crate) fn has_removals(doc: &ClusterDoc) -> bool {
    doc.tasks.iter().any(|t| {
        t.purged
            && planner::parse_task_key(&t.id.key).is_none_or(|(_, service, step)| {
                step != Step::Start || !doc.layout.services_on(&t.id.node).is_some_and(|s| s.contains(service))
            })
    })
}
