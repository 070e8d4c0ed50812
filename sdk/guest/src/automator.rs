//! Automators: perform one action for one service on one node.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::solver::Placement;
use crate::{Error, Result, json};

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
pub trait Automator {
    /// The service's configuration, decoded from the host's JSON.
    type Config: DeserializeOwned;

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

#[cfg(feature = "automator")]
mod export {
    use super::{Action, Automator, Task, decode_config, decode_layout};
    use crate::bindings::automator::exports::orc::plugin::service_automator as wit;
    use crate::bindings::types;

    impl<A: Automator> wit::Guest for A {
        fn perform(task: wit::Task) -> Result<wit::Outcome, types::Error> {
            crate::panic::install_hook();
            let config = decode_config::<A::Config>(&task.cluster, &task.service, &task.config)?;
            let layout = decode_layout(&task.layout)?;
            let action = match task.action {
                wit::Action::Bootstrap => Action::Bootstrap,
                wit::Action::Install => Action::Install,
                wit::Action::Configure => Action::Configure,
                wit::Action::Initialize => Action::Initialize,
                wit::Action::Start => Action::Start,
                wit::Action::Stop => Action::Stop,
                wit::Action::Remove => Action::Remove,
            };
            let outcome = A::perform(Task {
                cluster: task.cluster,
                service: task.service,
                node: task.node,
                action,
                config,
                layout,
            })?;
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
