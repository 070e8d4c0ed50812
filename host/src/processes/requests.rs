//! What an operator asks of processes: the bodies of `POST …/processes` and `PATCH
//! …/processes/{name}`, their defaults, and the states a list may be filtered by
//! ([`parse_states`]).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::{ProcessState, ServicesError};

/// How many times a task may fail before its operation fails (and is rolled back).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// `POST …/processes`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProcess {
    pub name: String,
    /// `name@version` of a service in the catalog.
    pub service: String,
    /// The node to run on; the solver picks one the service's needs allow when absent.
    #[serde(default)]
    pub node: Option<String>,
    /// The process's own configuration, valid against the service's `config_schema`.
    #[serde(default = "empty_object")]
    #[schema(value_type = Object)]
    pub config: Value,
    /// Port name → number, replacing the service's defaults.
    #[serde(default)]
    pub ports: BTreeMap<String, u16>,
    /// A task failing this many times fails the operation (default 3).
    #[serde(default)]
    pub max_attempts: Option<u32>,
}

/// `PATCH …/processes/{name}`: what is given replaces what the process has.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateProcess {
    /// Another version of the same service (`name@version`).
    #[serde(default)]
    pub service: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub config: Option<Value>,
    #[serde(default)]
    pub ports: Option<BTreeMap<String, u16>>,
}

pub(crate) fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// `creating,moving` → those states; an unknown one is refused, naming it.
pub fn parse_states(list: &str) -> Result<Vec<ProcessState>, ServicesError> {
    list.split(',')
        .map(|s| {
            ProcessState::parse(s.trim()).ok_or_else(|| {
                ServicesError::Invalid(format!(
                    "state: `{}` is not a process state (creating, running, updating, moving, rolling_back, terminating, failed)",
                    s.chars().filter(|c| !c.is_control()).take(40).collect::<String>()
                ))
            })
        })
        .collect()
}
