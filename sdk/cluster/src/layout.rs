//! Layouts (which services run on which node) and the check that one meets a template.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::template::Template;

/// Which services run on which node: node name → service names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Layout(pub BTreeMap<String, BTreeSet<String>>);

impl Layout {
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// The nodes that run `service`.
    pub fn nodes_of<'a>(&'a self, service: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0.iter().filter(move |(_, s)| s.contains(service)).map(|(n, _)| n.as_str())
    }

    pub fn services_on(&self, node: &str) -> Option<&BTreeSet<String>> {
        self.0.get(node)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every (node, service) pair, ordered by node then service.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().flat_map(|(n, s)| s.iter().map(move |s| (n.as_str(), s.as_str())))
    }
}

impl<N: Into<String>, S: Into<String>, I: IntoIterator<Item = S>> FromIterator<(N, I)> for Layout {
    fn from_iter<T: IntoIterator<Item = (N, I)>>(iter: T) -> Self {
        let mut layout = Layout::default();
        for (node, services) in iter {
            layout
                .0
                .entry(node.into())
                .or_default()
                .extend(services.into_iter().map(Into::into));
        }
        layout
    }
}

/// A node a cluster may use, as a solver sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Facts gathered by the host (`architecture`, `cpus`, `memory_bytes`, `os_id`, …), a JSON
    /// object.
    #[serde(default)]
    pub facts: Value,
}

/// A constraint a layout breaks: `constraint` is its name (its path in the template, or `size`
/// / `nodes` for the request itself).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{constraint}: {message}")]
pub struct Violation {
    pub constraint: String,
    pub message: String,
}

fn violation(constraint: impl Into<String>, message: impl Into<String>) -> Violation {
    Violation {
        constraint: constraint.into(),
        message: message.into(),
    }
}

/// Whether `layout` is a valid layout of `template` (restricted to the cluster's services, see
/// [`Template::select`]) for a cluster of `size` nodes chosen among `nodes`: exactly `size`
/// nodes, each known and hosting at least one service, only the template's services, every
/// service's `needs` and `count`, every `together` and `apart` group. Returns the first
/// constraint broken.
pub fn check_layout(template: &Template, size: u32, nodes: &[NodeInfo], layout: &Layout) -> Result<(), Violation> {
    if layout.len() != size as usize {
        return Err(violation(
            "size",
            format!("the layout has {} nodes, the cluster asks for {size}", layout.len()),
        ));
    }
    let known: BTreeMap<&str, &NodeInfo> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    for (node, services) in &layout.0 {
        let Some(info) = known.get(node.as_str()) else {
            return Err(violation("nodes", format!("node `{node}` is not one the cluster may use")));
        };
        if services.is_empty() {
            return Err(violation("size", format!("node `{node}` hosts no service")));
        }
        for s in services {
            let Some(service) = template.services.get(s) else {
                return Err(violation(
                    "services",
                    format!("node `{node}` hosts `{s}`, which is not one of the cluster's services"),
                ));
            };
            if !service.needs.met_by(&info.labels, &info.facts) {
                return Err(violation(
                    format!("services.{s}.needs"),
                    format!("node `{node}` does not have what `{s}` needs"),
                ));
            }
        }
    }
    for (name, service) in &template.services {
        let count = layout.nodes_of(name).count() as u32;
        let (min, max) = (service.count.min(), service.count.max(size));
        if count < min || count > max {
            return Err(violation(
                format!("services.{name}.count"),
                format!("`{name}` runs on {count} nodes, the template allows {min} to {max}"),
            ));
        }
    }
    for (i, group) in template.constraints.together.iter().enumerate() {
        let group: BTreeSet<&str> = group
            .iter()
            .map(String::as_str)
            .filter(|s| template.services.contains_key(*s))
            .collect();
        for (node, services) in &layout.0 {
            let here = group.iter().filter(|s| services.contains(**s)).count();
            if here != 0 && here != group.len() {
                return Err(violation(
                    format!("constraints.together[{i}]"),
                    format!("node `{node}` hosts {here} of the {} services that must share nodes", group.len()),
                ));
            }
        }
    }
    for (i, group) in template.constraints.apart.iter().enumerate() {
        for (node, services) in &layout.0 {
            let here: Vec<&str> = group.iter().map(String::as_str).filter(|s| services.contains(*s)).collect();
            if here.len() > 1 {
                return Err(violation(
                    format!("constraints.apart[{i}]"),
                    format!("node `{node}` hosts {}, which must never share a node", here.join(" and ")),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn template() -> Template {
        Template::from_json(json!({
            "services": {
                "db": {"automator": "x", "count": {"max": 1}, "needs": {"labels": {"disk": "ssd"}}},
                "web": {"automator": "x"},
                "agent": {"automator": "x"},
                "cache": {"automator": "x", "count": {"min": 0}}
            },
            "constraints": {"together": [["web", "agent"]], "apart": [["db", "web"]]}
        }))
        .unwrap()
    }

    fn nodes() -> Vec<NodeInfo> {
        (1..=4)
            .map(|i| NodeInfo {
                name: format!("n{i}"),
                labels: if i == 1 {
                    [("disk".into(), "ssd".into())].into()
                } else {
                    BTreeMap::new()
                },
                facts: json!({}),
            })
            .collect()
    }

    #[test]
    fn a_valid_layout_passes() {
        let l: Layout = [
            ("n1", vec!["db"]),
            ("n2", vec!["web", "agent"]),
            ("n3", vec!["web", "agent", "cache"]),
        ]
        .into_iter()
        .collect();
        check_layout(&template(), 3, &nodes(), &l).unwrap();
        assert_eq!(l.nodes_of("web").collect::<Vec<_>>(), ["n2", "n3"]);
    }

    #[test]
    fn each_broken_constraint_is_named() {
        let t = template();
        type Case<'a> = (Vec<(&'a str, Vec<&'a str>)>, &'a str);
        let cases: Vec<Case> = vec![
            (vec![("n1", vec!["db"]), ("n2", vec!["web", "agent"])], "size"),
            (
                vec![("n1", vec!["db"]), ("n2", vec!["web", "agent"]), ("n9", vec!["web", "agent"])],
                "nodes",
            ),
            (vec![("n1", vec!["db"]), ("n2", vec!["web", "agent"]), ("n3", vec![])], "size"),
            (
                vec![("n1", vec!["db"]), ("n2", vec!["web", "agent"]), ("n3", vec!["mail"])],
                "services",
            ),
            (
                vec![("n1", vec!["web", "agent"]), ("n2", vec!["db"]), ("n3", vec!["web", "agent"])],
                "services.db.needs",
            ),
            (
                vec![
                    ("n1", vec!["web", "agent"]),
                    ("n2", vec!["web", "agent"]),
                    ("n3", vec!["web", "agent"]),
                ],
                "services.db.count",
            ),
            (
                vec![("n1", vec!["db"]), ("n2", vec!["web"]), ("n3", vec!["web", "agent"])],
                "constraints.together[0]",
            ),
            (
                vec![
                    ("n1", vec!["db", "web", "agent"]),
                    ("n2", vec!["web", "agent"]),
                    ("n3", vec!["cache"]),
                ],
                "constraints.apart[0]",
            ),
        ];
        for (pairs, constraint) in cases {
            let l: Layout = pairs.clone().into_iter().collect();
            let v = check_layout(&t, 3, &nodes(), &l).expect_err(&format!("{pairs:?}"));
            assert_eq!(v.constraint, constraint, "{pairs:?}: {v}");
        }
    }
}
