//! The first-party `layout-solver` plugin, called as the host calls it: the Wasm component built
//! from source, loaded in the runtime, asked for layouts. Every layout it returns is checked
//! with `orc_cluster::check_layout`.

mod cases;
mod properties;

use std::collections::BTreeMap;
use std::sync::Arc;

use orc_cluster::{Layout, NodeInfo, Template, check_layout};
use orc_manifest::{Digest, PluginKind};
use orc_plugin_artifacts::LAYOUT_SOLVER;
use orc_runtime::wit::{LayoutRequest, NodeInfo as WitNode, Placement, SolveError};
use orc_runtime::{CallContext, CallError, Grants, Plugin, Runtime, RuntimeConfig};
use serde_json::{Value, json};

/// What the solver answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Layout(Layout),
    NoLayout { constraint: String, message: String },
}

impl Answer {
    /// The layout; panics on a refusal.
    #[track_caller]
    pub fn layout(self) -> Layout {
        match self {
            Answer::Layout(l) => l,
            Answer::NoLayout { constraint, message } => panic!("no valid layout: {constraint}: {message}"),
        }
    }

    /// The refused constraint and message; panics on a layout.
    #[track_caller]
    pub fn refusal(self) -> (String, String) {
        match self {
            Answer::NoLayout { constraint, message } => (constraint, message),
            Answer::Layout(l) => panic!("expected no valid layout, got {l:?}"),
        }
    }
}

/// The solver plugin loaded in a fresh runtime.
pub struct Solver {
    _rt: Runtime,
    plugin: Arc<Plugin>,
}

impl Solver {
    pub fn load() -> Solver {
        let rt = Runtime::new(RuntimeConfig {
            memory_limit_bytes: 64 << 20,
            max_instances: 20,
            ..RuntimeConfig::default()
        })
        .expect("runtime");
        let digest: Digest = LAYOUT_SOLVER.digest.parse().expect("digest");
        assert_eq!(LAYOUT_SOLVER.kind, "solver");
        let plugin = rt
            .load_bytes(&digest, LAYOUT_SOLVER.bytes, PluginKind::Solver, &Grants::none())
            .expect("load layout-solver");
        Solver { _rt: rt, plugin }
    }

    /// One call with the template as raw JSON text.
    pub async fn solve_raw(&self, template: String, size: u32, nodes: &[NodeInfo], existing: &Layout) -> Result<Answer, CallError> {
        let request = LayoutRequest {
            template,
            size,
            nodes: nodes
                .iter()
                .map(|n| WitNode {
                    name: n.name.clone(),
                    labels: n.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                    facts: n.facts.to_string(),
                })
                .collect(),
            existing: existing
                .0
                .iter()
                .map(|(node, services)| Placement {
                    node: node.clone(),
                    services: services.iter().cloned().collect(),
                })
                .collect(),
        };
        let mut instance = self.plugin.solver(&CallContext::new("test")).await?;
        Ok(match instance.solve(&request).await? {
            Ok(placements) => Answer::Layout(placements.into_iter().map(|p| (p.node, p.services)).collect()),
            Err(SolveError::NoValidLayout(e)) => Answer::NoLayout {
                constraint: e.constraint,
                message: e.message,
            },
            Err(SolveError::Failed(e)) => panic!("the runtime reports `failed` as a CallError, got {e:?}"),
        })
    }

    /// One call; a layout is checked against the template before it is returned.
    pub async fn solve(&self, template: &Template, size: u32, nodes: &[NodeInfo], existing: &Layout) -> Answer {
        match self.solve_within_budget(template, size, nodes, existing).await {
            Some(answer) => answer,
            None => panic!("the solver's search gave up"),
        }
    }

    /// Like [`Solver::solve`], but a search that gave up at its step budget (the solver's
    /// documented answer for an instance too large to settle: `permanent`, "gave up after N
    /// steps") is `None`; any other failure still panics.
    pub async fn solve_within_budget(&self, template: &Template, size: u32, nodes: &[NodeInfo], existing: &Layout) -> Option<Answer> {
        let text = serde_json::to_string(template).expect("template JSON");
        let answer = match self.solve_raw(text, size, nodes, existing).await {
            Err(CallError::Failed { error, .. }) if error.message.contains("gave up after") => return None,
            other => other.expect("solve call"),
        };
        if let Answer::Layout(l) = &answer {
            check_layout(template, size, nodes, l).unwrap_or_else(|v| panic!("invalid layout {l:?}: {v}"));
        }
        Some(answer)
    }
}

/// A template from JSON; every service's automator defaults to `x`.
pub fn template(mut v: Value) -> Template {
    if let Some(services) = v.get_mut("services").and_then(Value::as_object_mut) {
        for s in services.values_mut() {
            if let Some(o) = s.as_object_mut() {
                o.entry("automator").or_insert(json!("x"));
            }
        }
    }
    Template::from_json(v).expect("valid template")
}

/// A node with labels and facts.
pub fn node(name: &str, labels: &[(&str, &str)], facts: Value) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        facts,
    }
}

/// `n` plain nodes `n1`..`nN`.
pub fn plain(n: usize) -> Vec<NodeInfo> {
    (1..=n).map(|i| node(&format!("n{i}"), &[], json!({}))).collect()
}

/// A layout from (node, services) pairs.
pub fn layout(pairs: &[(&str, &[&str])]) -> Layout {
    pairs
        .iter()
        .map(|(n, s)| (n.to_string(), s.iter().map(|s| s.to_string())))
        .collect()
}
