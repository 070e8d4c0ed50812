//! The planner: a cluster's layout (and the tasks it had) → the cluster's tasks, as resources of
//! an intent version, so the environment's scheduler deploys them like any other resource.
//!
//! Every (node, service) of the layout gets five tasks, each requiring the one before:
//! `bootstrap → install → configure → initialize → start`. Across nodes:
//! - an **install-time** dependency (`web` requires `base` to be installed) makes `web`'s
//!   install on every node wait for `base`'s install on every node that runs `base`;
//! - a **run-time** dependency (`web` requires `db` running) makes `web`'s initialize (and so its
//!   start) on every node wait for `db`'s start on every node that runs `db`.
//!
//! Removal is the same tasks marked `purged`: the scheduler removes purged resources dependents
//! first (the edges between two purged resources are reversed), and the executor turns a purged
//! `start` into the automator's `stop` and a purged `install` into `remove`. Removed bootstrap,
//! configure and initialize steps have nothing to undo and are left out of the plan (each would
//! cost an action that does nothing); the removals keep the order the steps in between gave
//! them. So a node leaving the cluster stops its services in reverse run-time order, then removes
//! them in reverse install order. A service the operator stopped keeps its other tasks and has
//! its `start` tasks purged.
//!
//! Task ids are `task[<node>,<cluster>/<service>/<step>]`; the attributes carry the cluster, the
//! service, the step, the service's configuration and, for `configure` and `start`, the layout
//! (so a changed layout reconfigures and restarts the services that may depend on their peers).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use orc_cluster::{Layout, Template};
use orc_manifest::Digest;
use serde_json::{Value, json};

use crate::intent::{Attributes, PluginRef, ResourceId, ResourceSpec};

/// The resource type of cluster tasks (reserved: operators' intents cannot use it).
pub const TASK_TYPE: &str = "task";

/// The steps of a service on a node, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Step {
    Bootstrap,
    Install,
    Configure,
    Initialize,
    Start,
}

impl Step {
    pub const ALL: [Step; 5] = [Step::Bootstrap, Step::Install, Step::Configure, Step::Initialize, Step::Start];

    pub fn as_str(self) -> &'static str {
        match self {
            Step::Bootstrap => "bootstrap",
            Step::Install => "install",
            Step::Configure => "configure",
            Step::Initialize => "initialize",
            Step::Start => "start",
        }
    }

    pub fn parse(s: &str) -> Option<Step> {
        Step::ALL.into_iter().find(|step| step.as_str() == s)
    }

    /// Whether the layout is part of this step's input.
    pub fn sees_layout(self) -> bool {
        matches!(self, Step::Configure | Step::Start)
    }
}

/// The id of one task.
pub fn task_id(cluster: &str, node: &str, service: &str, step: Step) -> ResourceId {
    ResourceId {
        resource_type: TASK_TYPE.to_string(),
        node: node.to_string(),
        key: format!("{cluster}/{service}/{}", step.as_str()),
    }
}

/// Whether `id` is one of `cluster`'s tasks.
pub fn is_task_of(id: &ResourceId, cluster: &str) -> bool {
    id.resource_type == TASK_TYPE && id.key.strip_prefix(cluster).is_some_and(|rest| rest.starts_with('/'))
}

/// The (cluster, service, step) of a task id.
pub fn parse_task_key(key: &str) -> Option<(&str, &str, Step)> {
    let mut parts = key.splitn(3, '/');
    let (cluster, service, step) = (parts.next()?, parts.next()?, parts.next()?);
    Some((cluster, service, Step::parse(step)?))
}

/// What the planner needs to know about a cluster.
#[derive(Debug)]
pub struct PlanInput<'a> {
    pub cluster: &'a str,
    /// The template restricted to the cluster's services, automators pinned to digests.
    pub template: &'a Template,
    /// Each service's configuration (the template's, with the cluster's overrides merged in).
    pub config: &'a BTreeMap<String, Value>,
    /// The layout to reach.
    pub layout: &'a Layout,
    /// Per service, configuration only the steps that see the layout (`configure`, `start`) get,
    /// merged over `config`: a process's connections, which change without its install changing.
    pub late_config: &'a BTreeMap<String, serde_json::Map<String, Value>>,
    /// Services the operator stopped.
    pub stopped: &'a BTreeSet<String>,
    /// The cluster's tasks in the plan deployed so far: those the new layout no longer has are
    /// kept, purged, until [`PlanInput::keep_removals`] is false.
    pub previous: &'a [ResourceSpec],
    /// Keep the removed tasks (purged) in the plan; false once they are all done.
    pub keep_removals: bool,
}

/// Why a plan cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("service `{service}`: its automator `{reference}` is not pinned to a digest")]
    Unpinned { service: String, reference: String },
}

/// Whether removing task `t` does something: a removed `install` (`remove`) or `start` (`stop`);
/// removed `bootstrap`, `configure` and `initialize` steps have nothing to undo.
fn undoes(t: &ResourceSpec) -> bool {
    parse_task_key(&t.id.key).is_none_or(|(_, _, step)| matches!(step, Step::Install | Step::Start))
}

/// What removal `t` requires: its requirements still planned or removed, and, through a removed
/// step that is not planned (nothing to undo), the removals that one required, so that the order
/// the removals run in (each requirement between two purged tasks reversed by the scheduler) is
/// the order the full chain gave: `stop` before `remove`, dependents' before their
/// requirements'. Only removals are reached through a step left out: between a purged task and
/// a planned one, the left-out step ordered nothing.
fn removal_requires(t: &ResourceSpec, planned: &HashSet<ResourceId>, removed: &HashMap<&ResourceId, &ResourceSpec>) -> Vec<ResourceId> {
    let mut requires = Vec::new();
    let mut seen = HashSet::new();
    let mut stack: Vec<(&ResourceId, bool)> = t.requires.iter().rev().map(|r| (r, true)).collect();
    while let Some((r, direct)) = stack.pop() {
        match removed.get(r) {
            // Each removed task once (a diamond of left-out steps reaches one twice).
            Some(_) if !seen.insert(r) => {}
            Some(d) if undoes(d) => requires.push(r.clone()),
            Some(d) => stack.extend(d.requires.iter().rev().map(|r| (r, false))),
            // A planned one only as the removal's own requirement, however else it is reached.
            None if direct && planned.contains(r) && !requires.contains(r) => requires.push(r.clone()),
            None => {}
        }
    }
    requires
}

/// The cluster's tasks for `input`: the layout's tasks with their dependencies, then the removed
/// ones that have something to undo (purged). Deterministic: same input, same plan, same order.
pub fn plan(input: &PlanInput<'_>) -> Result<Vec<ResourceSpec>, PlanError> {
    let layout_json = serde_json::to_value(input.layout).expect("a layout serialises");
    let mut automators = BTreeMap::new();
    for (name, service) in &input.template.services {
        let digest: Digest = service.automator.parse().map_err(|_| PlanError::Unpinned {
            service: name.clone(),
            reference: service.automator.clone(),
        })?;
        automators.insert(name.as_str(), digest);
    }
    let empty = Value::Object(Default::default());
    let mut tasks = Vec::new();
    // Services in install order, so that the plan reads in the order it runs.
    for service in input.template.install_order() {
        let spec = &input.template.services[&service];
        for node in input.layout.nodes_of(&service) {
            for (i, step) in Step::ALL.into_iter().enumerate() {
                let mut requires = Vec::new();
                if i > 0 {
                    requires.push(task_id(input.cluster, node, &service, Step::ALL[i - 1]));
                }
                match step {
                    Step::Install => {
                        for r in &spec.requires.install {
                            requires.extend(input.layout.nodes_of(r).map(|m| task_id(input.cluster, m, r, Step::Install)));
                        }
                    }
                    Step::Initialize => {
                        for r in &spec.requires.runtime {
                            requires.extend(input.layout.nodes_of(r).map(|m| task_id(input.cluster, m, r, Step::Start)));
                        }
                    }
                    _ => {}
                }
                let mut attributes = json!({
                    "cluster": input.cluster,
                    "service": service,
                    "action": step.as_str(),
                    "config": input.config.get(&service).unwrap_or(&empty),
                });
                if step.sees_layout() {
                    attributes["layout"] = layout_json.clone();
                    if let (Some(late), Value::Object(config)) = (input.late_config.get(&service), &mut attributes["config"]) {
                        config.extend(late.clone());
                    }
                }
                tasks.push(ResourceSpec {
                    id: task_id(input.cluster, node, &service, step),
                    adaptor: PluginRef::Digest(automators[service.as_str()]),
                    attributes: Attributes::new(&attributes),
                    requires,
                    purged: step == Step::Start && input.stopped.contains(&service),
                    set: None,
                    sensitive: None,
                });
            }
        }
    }
    if input.keep_removals {
        let planned: HashSet<ResourceId> = tasks.iter().map(|t| t.id.clone()).collect();
        let removed: HashMap<&ResourceId, &ResourceSpec> = input
            .previous
            .iter()
            .filter(|t| !planned.contains(&t.id))
            .map(|t| (&t.id, t))
            .collect();
        for t in input.previous.iter().filter(|t| removed.contains_key(&t.id) && undoes(t)) {
            let mut t = t.clone();
            t.purged = true;
            t.requires = removal_requires(&t, &planned, &removed);
            tasks.push(t);
        }
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

    fn template() -> Template {
        Template::from_json(json!({"services": {
            "base": {"automator": DIGEST},
            "db": {"automator": DIGEST, "requires": {"install": ["base"]}},
            "web": {"automator": DIGEST, "requires": {"install": ["base"], "runtime": ["db"]}},
        }}))
        .unwrap()
    }

    fn layout(pairs: &[(&str, &[&str])]) -> Layout {
        pairs.iter().map(|(n, s)| (*n, s.iter().copied())).collect()
    }

    fn plan_of(layout: &Layout, previous: &[ResourceSpec], stopped: &[&str], keep_removals: bool) -> Vec<ResourceSpec> {
        let t = template();
        let config = BTreeMap::new();
        let stopped: BTreeSet<String> = stopped.iter().map(|s| s.to_string()).collect();
        plan(&PlanInput {
            cluster: "c1",
            template: &t,
            config: &config,
            layout,
            late_config: &BTreeMap::new(),
            stopped: &stopped,
            previous,
            keep_removals,
        })
        .unwrap()
    }

    fn requires(tasks: &[ResourceSpec], id: &str) -> Vec<String> {
        let t = tasks
            .iter()
            .find(|t| t.id.to_string() == id)
            .unwrap_or_else(|| panic!("no task {id}"));
        let mut r: Vec<String> = t.requires.iter().map(|r| r.to_string()).collect();
        r.sort();
        r
    }

    #[test]
    fn steps_chain_and_dependencies_cross_nodes() {
        let l = layout(&[("n1", &["base", "db"]), ("n2", &["base", "web"]), ("n3", &["base", "web"])]);
        let tasks = plan_of(&l, &[], &[], true);
        assert_eq!(tasks.len(), 5 * 6);
        // The plan is a valid intent (ids unique, requirements exist, no cycle).
        crate::intent::Intent::validate(crate::intent::IntentDocument { resources: tasks.clone() }).unwrap();
        assert_eq!(requires(&tasks, "task[n1,c1/base/bootstrap]"), Vec::<String>::new());
        assert_eq!(
            requires(&tasks, "task[n1,c1/db/install]"),
            [
                "task[n1,c1/base/install]",
                "task[n1,c1/db/bootstrap]",
                "task[n2,c1/base/install]",
                "task[n3,c1/base/install]",
            ]
        );
        assert_eq!(
            requires(&tasks, "task[n2,c1/web/initialize]"),
            ["task[n1,c1/db/start]", "task[n2,c1/web/configure]",]
        );
        assert_eq!(requires(&tasks, "task[n3,c1/web/start]"), ["task[n3,c1/web/initialize]"]);
        // Layout only where it matters.
        let attrs = |id: &str| tasks.iter().find(|t| t.id.to_string() == id).unwrap().attributes.to_value();
        assert!(attrs("task[n2,c1/web/configure]")["layout"]["n1"].is_array());
        assert!(attrs("task[n2,c1/web/install]").get("layout").is_none());
        assert_eq!(attrs("task[n2,c1/web/start]")["action"], "start");
    }

    #[test]
    fn late_configuration_is_seen_by_configure_and_start_only() {
        let t = template();
        let l = layout(&[("n1", &["base", "db"])]);
        let config: BTreeMap<String, Value> = [("db".to_string(), json!({"size": 1}))].into();
        let late = [("db".to_string(), json!({"peers": ["p"]}).as_object().unwrap().clone())].into();
        let tasks = plan(&PlanInput {
            cluster: "c1",
            template: &t,
            config: &config,
            layout: &l,
            late_config: &late,
            stopped: &BTreeSet::new(),
            previous: &[],
            keep_removals: true,
        })
        .unwrap();
        let config_of = |step: &str| {
            let id = format!("task[n1,c1/db/{step}]");
            tasks.iter().find(|t| t.id.to_string() == id).unwrap().attributes.to_value()["config"].clone()
        };
        for step in ["configure", "start"] {
            assert_eq!(config_of(step), json!({"size": 1, "peers": ["p"]}), "{step}");
        }
        for step in ["bootstrap", "install", "initialize"] {
            assert_eq!(config_of(step), json!({"size": 1}), "{step}");
        }
    }

    #[test]
    fn removed_nodes_are_purged_and_then_dropped() {
        let before = layout(&[("n1", &["base", "db"]), ("n2", &["base", "web"]), ("n3", &["base", "web"])]);
        let first = plan_of(&before, &[], &[], true);
        let after = layout(&[("n1", &["base", "db"]), ("n2", &["base", "web"])]);
        let second = plan_of(&after, &first, &[], true);
        let purged: Vec<String> = second.iter().filter(|t| t.purged).map(|t| t.id.to_string()).collect();
        // Only what undoes something: `stop` (a purged start) and `remove` (a purged install).
        assert_eq!(
            purged,
            [
                "task[n3,c1/base/install]",
                "task[n3,c1/base/start]",
                "task[n3,c1/web/install]",
                "task[n3,c1/web/start]"
            ]
        );
        // Kept tasks unchanged, except those that see the layout.
        for t in &second {
            if let Some(old) = first.iter().find(|o| o.id == t.id)
                && !t.purged
            {
                let step = parse_task_key(&t.id.key).unwrap().2;
                assert_eq!(old.attributes == t.attributes, !step.sees_layout(), "{}", t.id);
            }
        }
        // Purged tasks keep the order the steps left out gave them (the scheduler reverses
        // requirements between purged tasks): stop before remove; a planned requirement of the
        // removal itself is kept, one of a left-out step (web's initialize → db's start) is not.
        assert_eq!(requires(&second, "task[n3,c1/web/start]"), ["task[n3,c1/web/install]"]);
        assert_eq!(
            requires(&second, "task[n3,c1/web/install]"),
            ["task[n1,c1/base/install]", "task[n2,c1/base/install]", "task[n3,c1/base/install]"]
        );
        assert_eq!(requires(&second, "task[n3,c1/base/start]"), ["task[n3,c1/base/install]"]);
        crate::intent::Intent::validate(crate::intent::IntentDocument { resources: second.clone() }).unwrap();
        // Removed together, a run-time dependency orders the stops: web's before db's.
        let only_base = layout(&[("n3", &["base"])]);
        let gone = plan_of(&only_base, &first, &[], true);
        assert_eq!(
            requires(&gone, "task[n2,c1/web/start]"),
            ["task[n1,c1/db/start]", "task[n2,c1/web/install]"]
        );
        assert_eq!(requires(&gone, "task[n1,c1/db/start]"), ["task[n1,c1/db/install]"]);
        // A planned task that a removal requires itself stays required, also when a left-out
        // step it passes through (listed first) requires it too.
        let planned = task_id("c1", "n3", "base", Step::Install);
        let left_out = task_id("c1", "n9", "web", Step::Configure);
        let mut previous = gone.clone();
        for (id, step) in [(left_out.clone(), "configure"), (task_id("c1", "n9", "web", Step::Start), "start")] {
            let mut t = previous[0].clone();
            t.id = id;
            t.attributes = Attributes::new(&json!({"cluster": "c1", "service": "web", "action": step}));
            t.requires = if step == "start" {
                vec![left_out.clone(), planned.clone()]
            } else {
                vec![planned.clone()]
            };
            previous.push(t);
        }
        let kept = plan_of(&only_base, &previous, &[], true);
        assert_eq!(requires(&kept, "task[n9,c1/web/start]"), ["task[n3,c1/base/install]"]);
        let third = plan_of(&after, &second, &[], false);
        assert_eq!(third.len(), 20);
        assert!(third.iter().all(|t| !t.purged));
    }

    #[test]
    fn a_stopped_service_has_its_starts_purged() {
        let l = layout(&[("n1", &["base", "db"]), ("n2", &["base", "web"])]);
        let tasks = plan_of(&l, &[], &["web"], true);
        let purged: Vec<String> = tasks.iter().filter(|t| t.purged).map(|t| t.id.to_string()).collect();
        assert_eq!(purged, ["task[n2,c1/web/start]"]);
    }

    #[test]
    fn task_keys_parse_and_belong_to_their_cluster() {
        let id = task_id("c1", "n1", "web", Step::Initialize);
        assert_eq!(id.to_string(), "task[n1,c1/web/initialize]");
        assert_eq!(parse_task_key(&id.key), Some(("c1", "web", Step::Initialize)));
        assert!(is_task_of(&id, "c1"));
        assert!(!is_task_of(&id, "c"));
        assert!(!is_task_of(&task_id("c10", "n1", "web", Step::Start), "c1"));
    }
}
