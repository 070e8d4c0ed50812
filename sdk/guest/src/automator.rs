//! Automators: check and perform one action for one service on one node.
//!
//! The host calls [`Automator::check`] first (on deploy, repair and dryrun) and
//! [`Automator::perform`] only when the check returns changes. An automator that cannot observe
//! an action's effect on the node keeps the default `check`: the SDK remembers each successful
//! `perform` in the plugin's `kv` ([`performed`]) and reports a change until the same inputs have
//! been performed.

pub mod performed;

use std::collections::BTreeMap;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::solver::Placement;
use crate::{Change, Error, Result, json};

/// The service action to perform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    Bootstrap,
    Install,
    Configure,
    Initialize,
    Start,
    Stop,
    Remove,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Bootstrap => "bootstrap",
            Action::Install => "install",
            Action::Configure => "configure",
            Action::Initialize => "initialize",
            Action::Start => "start",
            Action::Stop => "stop",
            Action::Remove => "remove",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One action for one service on one node, with the configuration decoded into the automator's
/// own type.
#[derive(Debug, Clone, PartialEq)]
pub struct Task<C> {
    pub cluster: String,
    pub service: String,
    /// The node to act on; pass it to [`crate::node`] calls.
    pub node: String,
    pub action: Action,
    pub config: C,
    /// The cluster's layout, for services that need their peers.
    pub layout: Vec<Placement>,
    /// `sha256:<hex>` of the task's inputs — action, configuration and layout, as canonical
    /// JSON ([`performed::inputs_digest`]): what the default [`Automator::check`] compares.
    pub inputs_digest: String,
}

impl<C> Task<C> {
    /// The nodes that run `service`, in layout order.
    pub fn nodes_running(&self, service: &str) -> Vec<&str> {
        self.layout
            .iter()
            .filter(|p| p.services.iter().any(|s| s == service))
            .map(|p| p.node.as_str())
            .collect()
    }
}

/// What an action did: messages for the action log, and values it produced (a port, an id).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    pub messages: Vec<String>,
    pub output: Map<String, Value>,
}

impl Outcome {
    pub fn new() -> Self {
        Outcome::default()
    }

    #[must_use]
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.messages.push(message.into());
        self
    }

    #[must_use]
    pub fn output<T: Serialize + ?Sized>(mut self, key: impl Into<String>, value: &T) -> Self {
        self.output.insert(key.into(), crate::adaptor::to_value(value));
        self
    }
}

/// A service automator.
///
/// Both calls get the task with its configuration decoded afresh, on a fresh instance: nothing
/// survives in memory from `check` to `perform`.
pub trait Automator {
    /// The service's configuration, decoded from the host's JSON.
    type Config: DeserializeOwned;

    /// Whether the SDK keeps performed records in the plugin's `kv` (see [`performed`]): after
    /// every successful `perform` it records the task's [`Task::inputs_digest`], and the default
    /// [`Automator::check`] compares against it. The plugin must then request capability `kv`
    /// (the host refuses to load a plugin that imports `kv` without requesting it).
    ///
    /// Set it to `false` in an automator that implements `check` for every action by looking at
    /// the node itself: the SDK then never touches `kv`, and the plugin needs no `kv` capability.
    const PERFORMED_RECORDS: bool = true;

    /// Whether the task's action holds on the node now: an empty list when it does, otherwise the
    /// differences (`field`, current, desired) that [`Automator::perform`] would remove. Must not
    /// change the node.
    ///
    /// The default reads the performed record ([`performed::check`]): no change when the same
    /// inputs were performed last, else one change `performed` (recorded digest or none →
    /// [`Task::inputs_digest`]).
    fn check(task: &Task<Self::Config>) -> Result<Vec<Change>> {
        if Self::PERFORMED_RECORDS {
            performed::check(task)
        } else {
            Err(performed::no_records(task))
        }
    }

    /// Carries the action out; returns messages for the action log and output values. Must be
    /// idempotent: the host performs again after a failure, and whenever `check` reports changes.
    fn perform(task: Task<Self::Config>) -> Result<Outcome>;
}

/// Decodes a service configuration; errors are `invalid-input` naming the service and field.
pub fn decode_config<C: DeserializeOwned>(cluster: &str, service: &str, config: &str) -> Result<C> {
    json::decode(config).map_err(|e| Error::invalid(e.describe(&format!("{cluster}/{service}: invalid configuration"))))
}

/// Decodes the layout the host sends: an object of node -> services (the WIT's shape), or a list
/// of placements.
pub fn decode_layout(layout: &str) -> Result<Vec<Placement>> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Shape {
        ByNode(BTreeMap<String, Vec<String>>),
        Placements(Vec<Placement>),
    }
    match serde_json::from_str::<Shape>(layout) {
        Ok(Shape::ByNode(map)) => Ok(map.into_iter().map(|(node, services)| Placement { node, services }).collect()),
        Ok(Shape::Placements(list)) => Ok(list),
        Err(_) => Err(Error::invalid(format!(
            "invalid layout: expected an object of node -> [services], got {}",
            layout.chars().take(200).collect::<String>()
        ))),
    }
}

/// Decodes a task as the host sends it: the configuration into `C`, the layout, and the digest
/// of the inputs. Errors are `invalid-input` naming the service (and the field).
pub fn decode_task<C: DeserializeOwned>(
    cluster: String,
    service: String,
    node: String,
    action: Action,
    config: &str,
    layout: &str,
) -> Result<Task<C>> {
    let decoded = decode_config::<C>(&cluster, &service, config)?;
    let layout = decode_layout(layout)?;
    let inputs_digest = performed::inputs_digest(action, config, &layout)?;
    Ok(Task {
        cluster,
        service,
        node,
        action,
        config: decoded,
        layout,
        inputs_digest,
    })
}

#[cfg(feature = "automator")]
mod export {
    use super::{Action, Automator, Task, decode_task, performed};
    use crate::bindings::automator::exports::orc::plugin::service_automator as wit;
    use crate::bindings::types;

    fn decode<A: Automator>(task: wit::Task) -> crate::Result<Task<A::Config>> {
        let action = match task.action {
            wit::Action::Bootstrap => Action::Bootstrap,
            wit::Action::Install => Action::Install,
            wit::Action::Configure => Action::Configure,
            wit::Action::Initialize => Action::Initialize,
            wit::Action::Start => Action::Start,
            wit::Action::Stop => Action::Stop,
            wit::Action::Remove => Action::Remove,
        };
        decode_task(task.cluster, task.service, task.node, action, &task.config, &task.layout)
    }

    impl<A: Automator> wit::Guest for A {
        fn check(task: wit::Task) -> Result<Vec<types::Change>, types::Error> {
            crate::panic::install_hook();
            let task = decode::<A>(task)?;
            let changes = A::check(&task)?;
            Ok(changes
                .into_iter()
                .map(|c| types::Change {
                    field: c.field,
                    current: c.current.map(|v| v.to_string()),
                    desired: c.desired.map(|v| v.to_string()),
                })
                .collect())
        }

        fn perform(task: wit::Task) -> Result<wit::Outcome, types::Error> {
            crate::panic::install_hook();
            let task = decode::<A>(task)?;
            let record = A::PERFORMED_RECORDS.then(|| performed::Performed::of(&task));
            let outcome = A::perform(task)?;
            if let Some(record) = record {
                record.remember(&mut performed::HostKv)?;
            }
            Ok(wit::Outcome {
                messages: outcome.messages,
                output: serde_json::Value::Object(outcome.output).to_string(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn layouts_decode_from_either_shape() {
        let by_node = decode_layout(r#"{"n1":["db"],"n2":["web","cache"]}"#).unwrap();
        let list = decode_layout(r#"[{"node":"n1","services":["db"]},{"node":"n2","services":["web","cache"]}]"#).unwrap();
        assert_eq!(by_node, list);
        let task = Task {
            cluster: "c".into(),
            service: "web".into(),
            node: "n2".into(),
            action: Action::Start,
            config: (),
            layout: by_node,
            inputs_digest: String::new(),
        };
        assert_eq!(task.nodes_running("db"), vec!["n1"]);
        assert!(decode_layout("3").unwrap_err().message().starts_with("invalid layout"));
    }

    #[test]
    fn config_errors_name_service_and_field() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Config {
            port: u16,
        }
        let e = decode_config::<Config>("shop", "web", r#"{"port":70000}"#).unwrap_err();
        assert_eq!(
            e.message(),
            "shop/web: invalid configuration: `port`: invalid value: integer `70000`, expected u16"
        );
    }

    #[test]
    fn outcomes_collect_messages_and_output() {
        let o = Outcome::new().message("started").output("port", &8080);
        assert_eq!(o.messages, vec!["started"]);
        assert_eq!(Value::Object(o.output), json!({"port": 8080}));
        assert_eq!(Action::Initialize.to_string(), "initialize");
    }
}
