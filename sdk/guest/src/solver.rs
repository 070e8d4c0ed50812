//! Solvers: cluster template + size + nodes + existing layout -> a valid layout.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Error, json};

/// The services placed on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub node: String,
    pub services: Vec<String>,
}

impl Placement {
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(node: impl Into<String>, services: I) -> Self {
        Placement {
            node: node.into(),
            services: services.into_iter().map(Into::into).collect(),
        }
    }
}

/// A node the solver may place services on.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Facts gathered by the host (`os`, `arch`, `cpus`, `memory-mb`, ...), a JSON object.
    pub facts: Value,
}

impl NodeInfo {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    /// The fact `key` decoded as `T`; `None` when absent or of another type.
    pub fn fact<T: DeserializeOwned>(&self, key: &str) -> Option<T> {
        self.facts.get(key).and_then(|v| T::deserialize(v).ok())
    }
}

/// What a solver is asked, with the template decoded into the solver's own type.
#[derive(Debug, Clone, PartialEq)]
pub struct LayoutRequest<T> {
    pub template: T,
    /// The requested number of nodes.
    pub size: u32,
    /// The nodes the environment may use.
    pub nodes: Vec<NodeInfo>,
    /// The current layout; empty for a new cluster. A good solver changes it as little as possible.
    pub existing: Vec<Placement>,
}

/// Why a solver returned no layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SolveError {
    /// No layout satisfies `constraint` (named as in the template).
    NoValidLayout { constraint: String, message: String },
    /// Anything else (a bad template is `invalid-input`).
    Failed(Error),
}

impl SolveError {
    pub fn no_valid_layout(constraint: impl Into<String>, message: impl Into<String>) -> Self {
        SolveError::NoValidLayout {
            constraint: constraint.into(),
            message: message.into(),
        }
    }
}

impl From<Error> for SolveError {
    fn from(e: Error) -> Self {
        SolveError::Failed(e)
    }
}

impl fmt::Display for SolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SolveError::NoValidLayout { constraint, message } => write!(f, "no valid layout: constraint `{constraint}`: {message}"),
            SolveError::Failed(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for SolveError {}

/// A cluster solver.
pub trait Solver {
    /// The cluster template, decoded from the host's JSON.
    type Template: DeserializeOwned;

    /// A layout (the services of every node used), or why there is none.
    fn solve(request: LayoutRequest<Self::Template>) -> Result<Vec<Placement>, SolveError>;
}

/// Decodes a template; errors are `invalid-input` naming the field.
pub fn decode_template<T: DeserializeOwned>(template: &str) -> Result<T, Error> {
    json::decode(template).map_err(|e| Error::invalid(e.describe("invalid template")))
}

/// Decodes node facts; anything but a JSON object (or invalid text) becomes an empty object, so
/// a solver never fails on facts it does not use.
pub fn decode_facts(facts: &str) -> Value {
    match serde_json::from_str::<Value>(facts) {
        Ok(v @ Value::Object(_)) => v,
        _ => Value::Object(Default::default()),
    }
}

#[cfg(feature = "solver")]
mod export {
    use super::{LayoutRequest, NodeInfo, Placement, SolveError, Solver, decode_facts, decode_template};
    use crate::bindings::solver::exports::orc::plugin::cluster_solver as wit;

    fn placement_from_wit(p: wit::Placement) -> Placement {
        Placement {
            node: p.node,
            services: p.services,
        }
    }

    impl<S: Solver> wit::Guest for S {
        fn solve(request: wit::LayoutRequest) -> Result<Vec<wit::Placement>, wit::SolveError> {
            crate::panic::install_hook();
            let result = decode_template::<S::Template>(&request.template)
                .map_err(SolveError::from)
                .and_then(|template| {
                    S::solve(LayoutRequest {
                        template,
                        size: request.size,
                        nodes: request
                            .nodes
                            .into_iter()
                            .map(|n| NodeInfo {
                                name: n.name,
                                labels: n.labels.into_iter().collect(),
                                facts: decode_facts(&n.facts),
                            })
                            .collect(),
                        existing: request.existing.into_iter().map(placement_from_wit).collect(),
                    })
                });
            match result {
                Ok(layout) => Ok(layout
                    .into_iter()
                    .map(|p| wit::Placement {
                        node: p.node,
                        services: p.services,
                    })
                    .collect()),
                Err(SolveError::NoValidLayout { constraint, message }) => {
                    Err(wit::SolveError::NoValidLayout(wit::NoLayout { constraint, message }))
                }
                Err(SolveError::Failed(e)) => Err(wit::SolveError::Failed(e.into())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Template {
        services: Vec<String>,
    }

    #[test]
    fn template_errors_name_the_field() {
        let e = decode_template::<Template>(r#"{"services":"web"}"#).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert_eq!(
            e.message(),
            "invalid template: `services`: invalid type: string \"web\", expected a sequence"
        );
    }

    #[test]
    fn facts_are_objects_and_typed_on_demand() {
        let n = NodeInfo {
            name: "n1".into(),
            labels: BTreeMap::new(),
            facts: decode_facts(r#"{"cpus":4,"os":"linux"}"#),
        };
        assert_eq!(n.fact::<u32>("cpus"), Some(4));
        assert_eq!(n.fact::<u32>("os"), None);
        assert_eq!(decode_facts("[1]"), Value::Object(Default::default()));
    }

    #[test]
    fn solve_errors_display_the_constraint() {
        let e = SolveError::no_valid_layout("db.max-count", "3 databases need 3 nodes, 2 available");
        assert_eq!(
            e.to_string(),
            "no valid layout: constraint `db.max-count`: 3 databases need 3 nodes, 2 available"
        );
    }
}
