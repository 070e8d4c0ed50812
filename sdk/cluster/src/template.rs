//! Cluster templates and their validation.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A cluster template: the services a cluster may contain and the constraints on their layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Template {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// The solver plugin (`name@version` or `sha256:…`); the first-party `layout-solver` when
    /// absent. The host pins it to a digest when the template is submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub solver: Option<String>,
    /// The services, by name.
    pub services: BTreeMap<String, Service>,
    #[serde(default, skip_serializing_if = "Constraints::is_empty")]
    pub constraints: Constraints,
    #[serde(default, skip_serializing_if = "Defaults::is_empty")]
    pub defaults: Defaults,
}

/// One service a cluster may run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Service {
    /// The automator plugin that performs this service's actions (`name@version` or
    /// `sha256:…`); pinned to a digest when the template is submitted.
    pub automator: String,
    /// The service's configuration (a JSON object) handed to its automator; a cluster may
    /// override parts of it (JSON merge patch).
    #[serde(default = "empty_object", skip_serializing_if = "is_empty_object")]
    pub config: Value,
    #[serde(default, skip_serializing_if = "Requires::is_empty")]
    pub requires: Requires,
    /// On how many nodes of the cluster the service runs.
    #[serde(default, skip_serializing_if = "Count::is_default")]
    pub count: Count,
    /// What a node must have to host the service.
    #[serde(default, skip_serializing_if = "Needs::is_empty")]
    pub needs: Needs,
}

/// Dependencies on other services of the cluster, on any node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requires {
    /// Install-time: these services are installed (on every node that hosts them) before this
    /// one is installed anywhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub install: Vec<String>,
    /// Run-time: these services are started (on every node that hosts them) before this one is
    /// initialized or started anywhere; stopped after it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runtime: Vec<String>,
}

impl Requires {
    pub fn is_empty(&self) -> bool {
        self.install.is_empty() && self.runtime.is_empty()
    }
}

/// On how many nodes a service runs: at least `min` (1 when absent; 0 makes the service
/// optional) and at most `max` (every node of the cluster when absent). A solver places a
/// service on as many nodes as `max` and the other constraints allow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Count {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
}

impl Count {
    pub fn is_default(&self) -> bool {
        self.min.is_none() && self.max.is_none()
    }

    /// The lower bound (1 when unset).
    pub fn min(&self) -> u32 {
        self.min.unwrap_or(1)
    }

    /// The upper bound in a cluster of `size` nodes (`size` when unset).
    pub fn max(&self, size: u32) -> u32 {
        self.max.map_or(size, |m| m.min(size))
    }
}

/// What a node must have to host a service: every label equal, every fact met.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Needs {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// By fact name as the host gathers them (`architecture`, `cpus`, `memory_bytes`, `os_id`, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub facts: BTreeMap<String, FactNeed>,
}

impl Needs {
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.facts.is_empty()
    }

    /// Whether a node with these labels and facts (a JSON object) meets every need.
    pub fn met_by(&self, labels: &BTreeMap<String, String>, facts: &Value) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.facts.iter().all(|(k, need)| facts.get(k).is_some_and(|f| need.met_by(f)))
    }
}

/// A need on one fact: a numeric range (`{"min": 2}`), or a value the fact must equal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FactNeed {
    Range(Range),
    Equals(Value),
}

/// A numeric range, both ends inclusive, either end open.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Range {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<serde_json::Number>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<serde_json::Number>,
}

impl FactNeed {
    pub fn met_by(&self, fact: &Value) -> bool {
        match self {
            FactNeed::Range(r) => fact.as_f64().is_some_and(|x| {
                r.min.as_ref().is_none_or(|m| m.as_f64().is_some_and(|m| x >= m))
                    && r.max.as_ref().is_none_or(|m| m.as_f64().is_some_and(|m| x <= m))
            }),
            FactNeed::Equals(v) => match (v.as_f64(), fact.as_f64()) {
                (Some(a), Some(b)) => a == b,
                _ => v == fact,
            },
        }
    }
}

/// Placement constraints across services. A group's services that are not in a cluster are
/// ignored for that cluster (a group left with one service constrains nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Constraints {
    /// Each group's services share nodes: a node hosts all of them or none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub together: Vec<Vec<String>>,
    /// Each group's services never share a node: a node hosts at most one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apart: Vec<Vec<String>>,
}

impl Constraints {
    pub fn is_empty(&self) -> bool {
        self.together.is_empty() && self.apart.is_empty()
    }
}

/// What a cluster gets when its create request leaves it out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// The number of nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
    /// The services; every service of the template when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<Vec<String>>,
}

impl Defaults {
    pub fn is_empty(&self) -> bool {
        self.size.is_none() && self.services.is_none()
    }
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

fn is_empty_object(v: &Value) -> bool {
    v.as_object().is_some_and(|o| o.is_empty())
}

/// Why a template (or a choice of services from it) is refused: `path` is the JSON path of the
/// culprit in the template (`services.web.requires.install[0]`, `constraints.apart[1]`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct TemplateError {
    pub path: String,
    pub message: String,
}

fn err(path: impl Into<String>, message: impl Into<String>) -> TemplateError {
    TemplateError {
        path: path.into(),
        message: message.into(),
    }
}

/// Whether `name` may name a service ([`orc_manifest::names::SERVICE`]).
pub fn valid_service_name(name: &str) -> bool {
    orc_manifest::names::SERVICE.accepts(name)
}

impl Template {
    /// Parses and validates a template.
    pub fn from_json(value: Value) -> Result<Template, TemplateError> {
        let t: Template = serde_json::from_value(value).map_err(|e| err("template", e.to_string()))?;
        t.validate()?;
        Ok(t)
    }

    /// Refuses unknown services, dependency cycles and contradictory constraints, naming the
    /// culprit by its path.
    pub fn validate(&self) -> Result<(), TemplateError> {
        if self.services.is_empty() {
            return Err(err("services", "a template needs at least one service"));
        }
        for (name, s) in &self.services {
            let at = format!("services.{name}");
            if !valid_service_name(name) {
                return Err(err(
                    at,
                    "a service name is 1-63 lowercase letters, digits, `-` or `_`, starting with a letter",
                ));
            }
            if s.automator.trim().is_empty() {
                return Err(err(format!("{at}.automator"), "names no automator"));
            }
            if !s.config.is_object() {
                return Err(err(format!("{at}.config"), "must be a JSON object"));
            }
            for (kind, list) in [("install", &s.requires.install), ("runtime", &s.requires.runtime)] {
                for (i, r) in list.iter().enumerate() {
                    if !self.services.contains_key(r) {
                        return Err(err(format!("{at}.requires.{kind}[{i}]"), format!("unknown service `{r}`")));
                    }
                }
            }
            if let (Some(min), Some(max)) = (s.count.min, s.count.max)
                && min > max
            {
                return Err(err(format!("{at}.count"), format!("min {min} is greater than max {max}")));
            }
            if s.count.max == Some(0) {
                return Err(err(format!("{at}.count"), "max 0 would place the service nowhere"));
            }
        }
        for kind in ["install", "runtime"] {
            if let Some(cycle) = self.dependency_cycle(kind) {
                return Err(err(
                    format!("services.{}.requires.{kind}", cycle[0]),
                    format!("{kind}-time dependency cycle: {}", cycle.join(" -> ")),
                ));
            }
        }
        for (kind, groups) in [("together", &self.constraints.together), ("apart", &self.constraints.apart)] {
            for (i, g) in groups.iter().enumerate() {
                let mut seen = BTreeSet::new();
                for (j, s) in g.iter().enumerate() {
                    let at = format!("constraints.{kind}[{i}][{j}]");
                    if !self.services.contains_key(s) {
                        return Err(err(at, format!("unknown service `{s}`")));
                    }
                    if !seen.insert(s) {
                        return Err(err(at, format!("`{s}` is named twice")));
                    }
                }
            }
        }
        self.check_contradictions()?;
        if let Some(size) = self.defaults.size
            && size == 0
        {
            return Err(err("defaults.size", "a cluster has at least one node"));
        }
        if let Some(services) = &self.defaults.services {
            self.select(services).map_err(|e| TemplateError {
                path: format!("defaults.{}", e.path),
                message: e.message,
            })?;
        }
        Ok(())
    }

    /// A cycle in the `kind` (`install` or `runtime`) dependency graph, as the services along
    /// it with the first repeated at the end.
    fn dependency_cycle(&self, kind: &str) -> Option<Vec<String>> {
        let deps = |s: &Service| -> Vec<String> {
            if kind == "install" {
                s.requires.install.clone()
            } else {
                s.requires.runtime.clone()
            }
        };
        // 0 = unvisited, 1 = on the path, 2 = done.
        let mut mark: BTreeMap<&str, u8> = BTreeMap::new();
        let mut path: Vec<String> = Vec::new();
        fn visit<'a>(
            t: &'a Template,
            name: &'a str,
            deps: &dyn Fn(&Service) -> Vec<String>,
            mark: &mut BTreeMap<&'a str, u8>,
            path: &mut Vec<String>,
        ) -> Option<Vec<String>> {
            match mark.get(name) {
                Some(2) => return None,
                Some(1) => {
                    let start = path.iter().position(|p| p == name).unwrap_or(0);
                    let mut cycle = path[start..].to_vec();
                    cycle.push(name.to_string());
                    return Some(cycle);
                }
                _ => {}
            }
            mark.insert(name, 1);
            path.push(name.to_string());
            let (key, service) = t.services.get_key_value(name)?;
            for d in deps(service) {
                if let Some((dk, _)) = t.services.get_key_value(d.as_str())
                    && let Some(c) = visit(t, dk, deps, mark, path)
                {
                    return Some(c);
                }
            }
            path.pop();
            mark.insert(key, 2);
            None
        }
        for name in self.services.keys() {
            if let Some(c) = visit(self, name, &deps, &mut mark, &mut path) {
                return Some(c);
            }
        }
        None
    }

    /// Services joined by `together` groups (transitively) must be able to share every node:
    /// no two of them in one `apart` group, and count ranges that overlap.
    fn check_contradictions(&self) -> Result<(), TemplateError> {
        let names: Vec<&String> = self.services.keys().collect();
        let index = |s: &str| names.iter().position(|n| n.as_str() == s);
        let mut parent: Vec<usize> = (0..names.len()).collect();
        // The together group that first joined each service to its component, for messages.
        let mut joined_by: Vec<Option<usize>> = vec![None; names.len()];
        fn root(parent: &mut [usize], mut i: usize) -> usize {
            while parent[i] != i {
                parent[i] = parent[parent[i]];
                i = parent[i];
            }
            i
        }
        for (gi, g) in self.constraints.together.iter().enumerate() {
            let members: Vec<usize> = g.iter().filter_map(|s| index(s)).collect();
            for w in members.windows(2) {
                let (a, b) = (root(&mut parent, w[0]), root(&mut parent, w[1]));
                if a != b {
                    parent[a] = b;
                }
            }
            for &m in &members {
                joined_by[m].get_or_insert(gi);
            }
        }
        for (gi, g) in self.constraints.apart.iter().enumerate() {
            let members: Vec<usize> = g.iter().filter_map(|s| index(s)).collect();
            for (x, &a) in members.iter().enumerate() {
                for &b in &members[x + 1..] {
                    if root(&mut parent, a) == root(&mut parent, b) {
                        let via = joined_by[a].or(joined_by[b]).unwrap_or(0);
                        return Err(err(
                            format!("constraints.apart[{gi}]"),
                            format!(
                                "`{}` and `{}` must never share a node, but constraints.together[{via}] makes them share every node",
                                names[a], names[b]
                            ),
                        ));
                    }
                }
            }
        }
        // Services that share every node run on the same number of nodes.
        let mut ranges: BTreeMap<usize, (u32, Option<u32>, usize)> = BTreeMap::new();
        for (i, name) in names.iter().enumerate() {
            let c = self.services[*name].count;
            let r = root(&mut parent, i);
            let entry = ranges.entry(r).or_insert((0, None, i));
            entry.0 = entry.0.max(c.min());
            entry.1 = match (entry.1, c.max) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if let Some(max) = entry.1
                && entry.0 > max
            {
                let g = joined_by[i].unwrap_or(0);
                return Err(err(
                    format!("constraints.together[{g}]"),
                    format!(
                        "the services it joins must run on the same nodes, but their counts cannot agree (`{name}` and `{}`: at least {} and at most {max} nodes)",
                        names[entry.2], entry.0
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The template restricted to `services` (the ones a cluster runs): refuses unknown names,
    /// duplicates and a service whose dependencies are left out. Constraint groups keep their
    /// positions (so their names stay those of the full template) with the other services
    /// removed.
    pub fn select(&self, services: &[String]) -> Result<Template, TemplateError> {
        if services.is_empty() {
            return Err(err("services", "a cluster runs at least one service"));
        }
        let mut chosen = BTreeMap::new();
        for (i, s) in services.iter().enumerate() {
            let Some(service) = self.services.get(s) else {
                return Err(err(format!("services[{i}]"), format!("the template has no service `{s}`")));
            };
            if chosen.insert(s.clone(), service.clone()).is_some() {
                return Err(err(format!("services[{i}]"), format!("`{s}` is named twice")));
            }
        }
        for (name, s) in &chosen {
            for (kind, list) in [("install", &s.requires.install), ("runtime", &s.requires.runtime)] {
                if let Some(missing) = list.iter().find(|r| !chosen.contains_key(*r)) {
                    return Err(err(
                        "services",
                        format!("`{name}` requires `{missing}` ({kind}-time), which is not among the cluster's services"),
                    ));
                }
            }
        }
        let keep = |groups: &Vec<Vec<String>>| -> Vec<Vec<String>> {
            groups
                .iter()
                .map(|g| g.iter().filter(|s| chosen.contains_key(*s)).cloned().collect())
                .collect()
        };
        Ok(Template {
            description: self.description.clone(),
            solver: self.solver.clone(),
            constraints: Constraints {
                together: keep(&self.constraints.together),
                apart: keep(&self.constraints.apart),
            },
            defaults: Defaults {
                size: self.defaults.size,
                services: None,
            },
            services: chosen,
        })
    }

    /// The services a cluster gets when its request names none.
    pub fn default_services(&self) -> Vec<String> {
        self.defaults
            .services
            .clone()
            .unwrap_or_else(|| self.services.keys().cloned().collect())
    }

    /// Services in install order: every service after those it requires at install time
    /// (ties by name). The template must be valid (no cycle).
    pub fn install_order(&self) -> Vec<String> {
        let mut order: Vec<String> = Vec::new();
        let mut placed: BTreeSet<&str> = BTreeSet::new();
        while order.len() < self.services.len() {
            let before = order.len();
            for (name, s) in &self.services {
                if !placed.contains(name.as_str())
                    && s.requires
                        .install
                        .iter()
                        .all(|r| placed.contains(r.as_str()) || !self.services.contains_key(r))
                {
                    placed.insert(name);
                    order.push(name.clone());
                }
            }
            if order.len() == before {
                break;
            }
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(v: Value) -> Result<Template, TemplateError> {
        Template::from_json(v)
    }

    fn svc() -> Value {
        json!({"automator": "shell@0.1.0"})
    }

    #[test]
    fn a_full_template_parses_and_round_trips() {
        let v = json!({
            "description": "web stack",
            "solver": "layout-solver@0.1.0",
            "services": {
                "db": {"automator": "shell@0.1.0", "config": {"port": 5432}, "count": {"min": 1, "max": 1},
                       "needs": {"labels": {"disk": "ssd"}, "facts": {"memory_bytes": {"min": 1024}, "architecture": "x86_64"}}},
                "web": {"automator": "shell@0.1.0", "requires": {"install": ["base"], "runtime": ["db"]}},
                "base": {"automator": "shell@0.1.0"}
            },
            "constraints": {"together": [["web", "base"]], "apart": [["db", "web"]]},
            "defaults": {"size": 3, "services": ["db", "web", "base"]}
        });
        let t = parse(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(&t).unwrap(), v);
        assert_eq!(t.install_order(), ["base", "db", "web"]);
        assert!(matches!(t.services["db"].needs.facts["memory_bytes"], FactNeed::Range(_)));
        assert!(matches!(t.services["db"].needs.facts["architecture"], FactNeed::Equals(_)));
    }

    #[test]
    fn each_bad_template_names_its_culprit() {
        let cases = [
            (json!({"services": {}}), "services"),
            (json!({"services": {"Web": svc()}}), "services.Web"),
            (json!({"services": {"web": {"automator": ""}}}), "services.web.automator"),
            (json!({"services": {"web": {"automator": "a", "config": 3}}}), "services.web.config"),
            (
                json!({"services": {"web": {"automator": "a", "requires": {"install": ["db"]}}}}),
                "services.web.requires.install[0]",
            ),
            (
                json!({"services": {"web": {"automator": "a", "count": {"min": 3, "max": 2}}}}),
                "services.web.count",
            ),
            (
                json!({"services": {"web": {"automator": "a", "count": {"max": 0}}}}),
                "services.web.count",
            ),
            (
                json!({"services": {"web": svc(), "db": svc()}, "constraints": {"apart": [["web", "dbx"]]}}),
                "constraints.apart[0][1]",
            ),
            (
                json!({"services": {"web": svc()}, "constraints": {"together": [["web", "web"]]}}),
                "constraints.together[0][1]",
            ),
            (json!({"services": {"web": svc()}, "defaults": {"size": 0}}), "defaults.size"),
            (
                json!({"services": {"web": svc()}, "defaults": {"services": ["db"]}}),
                "defaults.services[0]",
            ),
            (json!({"services": {"web": svc()}, "colour": 1}), "template"),
        ];
        for (v, path) in cases {
            let e = parse(v.clone()).expect_err(&v.to_string());
            assert_eq!(e.path, path, "{v}: {e}");
        }
    }

    #[test]
    fn a_dependency_cycle_is_named() {
        let e = parse(json!({"services": {
            "a": {"automator": "x", "requires": {"runtime": ["b"]}},
            "b": {"automator": "x", "requires": {"runtime": ["c"]}},
            "c": {"automator": "x", "requires": {"runtime": ["a"]}},
        }}))
        .unwrap_err();
        assert_eq!(e.message, "runtime-time dependency cycle: a -> b -> c -> a");
        let e = parse(json!({"services": {"a": {"automator": "x", "requires": {"install": ["a"]}}}})).unwrap_err();
        assert_eq!(e.message, "install-time dependency cycle: a -> a");
    }

    #[test]
    fn contradictory_constraints_are_refused() {
        // Joined through b, then kept apart.
        let e = parse(json!({"services": {"a": svc(), "b": svc(), "c": svc()},
            "constraints": {"together": [["a", "b"], ["b", "c"]], "apart": [["c", "a"]]}}))
        .unwrap_err();
        assert_eq!(e.path, "constraints.apart[0]");
        assert!(e.message.contains("`c` and `a`"), "{e}");
        // Together, but their counts cannot agree.
        let e = parse(
            json!({"services": {"a": {"automator": "x", "count": {"max": 1}}, "b": {"automator": "x", "count": {"min": 2}}},
            "constraints": {"together": [["a", "b"]]}}),
        )
        .unwrap_err();
        assert_eq!(e.path, "constraints.together[0]", "{e}");
    }

    #[test]
    fn select_keeps_constraint_positions_and_refuses_missing_dependencies() {
        let t = parse(json!({"services": {
            "db": svc(), "web": {"automator": "x", "requires": {"runtime": ["db"]}}, "cache": svc()},
            "constraints": {"apart": [["cache", "web"], ["db", "cache"]]}}))
        .unwrap();
        let s = t.select(&["db".into(), "web".into()]).unwrap();
        assert_eq!(s.constraints.apart, vec![vec!["web".to_string()], vec!["db".to_string()]]);
        assert_eq!(s.services.len(), 2);
        let e = t.select(&["web".into()]).unwrap_err();
        assert!(e.message.contains("`web` requires `db`"), "{e}");
        assert_eq!(t.select(&["nope".into()]).unwrap_err().path, "services[0]");
    }

    #[test]
    fn needs_match_labels_and_facts() {
        let n: Needs = serde_json::from_value(json!({"labels": {"disk": "ssd"},
            "facts": {"memory_bytes": {"min": 100, "max": 200}, "architecture": "x86_64", "cpus": 2}}))
        .unwrap();
        let labels: BTreeMap<String, String> = [("disk".to_string(), "ssd".to_string())].into();
        assert!(n.met_by(&labels, &json!({"memory_bytes": 150, "architecture": "x86_64", "cpus": 2.0})));
        assert!(!n.met_by(&labels, &json!({"memory_bytes": 250, "architecture": "x86_64", "cpus": 2})));
        assert!(!n.met_by(&labels, &json!({"memory_bytes": 150, "architecture": "aarch64", "cpus": 2})));
        assert!(!n.met_by(&labels, &json!({"architecture": "x86_64", "cpus": 2})));
        assert!(!n.met_by(&BTreeMap::new(), &json!({"memory_bytes": 150, "architecture": "x86_64", "cpus": 2})));
    }
}
