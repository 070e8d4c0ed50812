//! The `shell` automator: each action of a service is a shell script from the service's
//! configuration, run on the node with `/bin/sh -c` through the host's `node.run`.
//!
//! Configuration (a JSON object):
//! - `scripts` (object, action → script): what each action runs; an action without a script (or
//!   with an empty one) does nothing, and is checked by the SDK's performed records like an
//!   action without a check script: performed (as nothing) once per configuration, so that the
//!   records follow the lifecycle (a `remove` forgets what `configure` did, so a service given
//!   back to a node is set up anew; a `start` forgets `stop`'s record);
//! - `checks` (object, action → script, optional): a script that exits 0 when the action's
//!   effect holds on the node (e.g. `start`: `pgrep -f myd`); any other exit is a change
//!   `check` and the action is performed. An action without a check script is checked by the
//!   SDK's performed records: it holds once its script succeeded with the same configuration
//!   and layout;
//! - `timeout_s` (integer, optional, 1–86400): how long a script (or a check script) may run
//!   before it is killed; the host's default otherwise. The host's call deadline still bounds
//!   the whole call;
//! - every other top-level key becomes an environment variable of the scripts: the name
//!   uppercased, each character other than `A-Z`, `0-9` and `_` replaced by `_`; a string value
//!   as is, any other value as JSON. Names that start with a digit, collide with another key's,
//!   are `PATH` or start with `ORC_` are refused.
//!
//! The scripts also get `ORC_CLUSTER`, `ORC_SERVICE`, `ORC_NODE`, `ORC_ACTION`, `ORC_LAYOUT`
//! (the layout as JSON, node → services) and, for each service in the layout, `ORC_NODES_<SERVICE>`
//! (the nodes running it, comma-separated, in layout order; the service name transformed like a
//! key). Nothing else of the host's environment is passed (the node sets `PATH`).
//!
//! Errors: a configuration that is not as above is `invalid-input` naming the key; a script that
//! exits non-zero is `retryable`, with the exit code and the tail of its stderr, and so is one
//! killed at its timeout — a script's failure is as often passing (a mirror, a peer not up yet) as not,
//! and the scheduler retries with backoff, so an operator sees it failing and fixes the script.
//! A check script that is killed at its timeout is `retryable` too: it decided nothing. The
//! action log gets the tail of the script's stdout.

use std::collections::BTreeMap;
use std::time::Duration;

use orc_sdk::node::{self, Command, Output};
use orc_sdk::{Action, Automator, Change, Error, ErrorKind, Outcome, Result, Task};
use serde::Deserialize;
use serde_json::Value;

pub struct Shell;

orc_sdk::export!(automator: Shell);

/// How much of a script's stdout goes to the action log, and of its stderr into an error.
const TAIL_CHARS: usize = 2048;
/// The longest `timeout_s` accepted: a day.
const MAX_TIMEOUT_S: u64 = 86_400;
/// The actions a script may be given for.
const ACTIONS: [Action; 7] = [
    Action::Bootstrap,
    Action::Install,
    Action::Configure,
    Action::Initialize,
    Action::Start,
    Action::Stop,
    Action::Remove,
];

/// The service's configuration.
#[derive(Debug, Deserialize)]
pub struct Config {
    #[serde(default)]
    scripts: BTreeMap<String, String>,
    #[serde(default)]
    checks: BTreeMap<String, String>,
    #[serde(default)]
    timeout_s: Option<u64>,
    /// Everything else: environment variables of the scripts.
    #[serde(flatten)]
    env: BTreeMap<String, Value>,
}

/// A task's configuration, checked, with the scripts' environment built.
#[derive(Debug)]
struct Prepared<'a> {
    script: Option<&'a str>,
    check: Option<&'a str>,
    timeout: Option<Duration>,
    env: Vec<(String, String)>,
}

/// `my-key.x` → `MY_KEY_X`.
fn env_name(key: &str) -> String {
    key.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' })
        .collect()
}

fn who(task: &Task<Config>) -> String {
    format!("{}/{} on {}", task.cluster, task.service, task.node)
}

fn prepare(task: &Task<Config>) -> Result<Prepared<'_>> {
    let config = &task.config;
    let invalid = |m: String| Error::invalid(format!("{}/{}: invalid configuration: {m}", task.cluster, task.service));
    for (what, map) in [("scripts", &config.scripts), ("checks", &config.checks)] {
        if let Some(bad) = map.keys().find(|k| !ACTIONS.iter().any(|a| a.as_str() == k.as_str())) {
            let known: Vec<&str> = ACTIONS.iter().map(|a| a.as_str()).collect();
            return Err(invalid(format!(
                "`{what}`: unknown action {bad:?}, expected one of {}",
                known.join(", ")
            )));
        }
    }
    let timeout = match config.timeout_s {
        None => None,
        Some(s) if (1..=MAX_TIMEOUT_S).contains(&s) => Some(Duration::from_secs(s)),
        Some(s) => return Err(invalid(format!("`timeout_s` must be 1 to {MAX_TIMEOUT_S}, got {s}"))),
    };
    let mut env: Vec<(String, String)> = Vec::new();
    let mut from_key: BTreeMap<String, &str> = BTreeMap::new();
    for (key, value) in &config.env {
        let name = env_name(key);
        if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(invalid(format!("`{key}`: {name:?} is not a valid environment variable name")));
        }
        if name == "PATH" || name.starts_with("ORC_") {
            return Err(invalid(format!(
                "`{key}`: {name} is reserved (PATH and ORC_* are set by the node and the automator)"
            )));
        }
        if let Some(other) = from_key.insert(name.clone(), key) {
            return Err(invalid(format!("`{key}` and `{other}` are both the environment variable {name}")));
        }
        let value = match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        env.push((name, value));
    }
    let layout: serde_json::Map<String, Value> = task
        .layout
        .iter()
        .map(|p| (p.node.clone(), Value::from(p.services.clone())))
        .collect();
    env.extend([
        ("ORC_CLUSTER".to_string(), task.cluster.clone()),
        ("ORC_SERVICE".to_string(), task.service.clone()),
        ("ORC_NODE".to_string(), task.node.clone()),
        ("ORC_ACTION".to_string(), task.action.as_str().to_string()),
        ("ORC_LAYOUT".to_string(), Value::Object(layout).to_string()),
    ]);
    let mut services: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for placement in &task.layout {
        for service in &placement.services {
            services.entry(env_name(service)).or_default().push(&placement.node);
        }
    }
    env.extend(services.into_iter().map(|(s, nodes)| (format!("ORC_NODES_{s}"), nodes.join(","))));
    Ok(Prepared {
        script: non_empty(config.scripts.get(task.action.as_str())),
        check: non_empty(config.checks.get(task.action.as_str())),
        timeout,
        env,
    })
}

/// A script, unless it is empty or blank.
fn non_empty(script: Option<&String>) -> Option<&str> {
    script.map(String::as_str).filter(|s| !s.trim().is_empty())
}

/// `/bin/sh -c script` with the task's environment and timeout.
fn command(prepared: &Prepared<'_>, script: &str) -> Command {
    let mut command = Command::new("/bin/sh").arg("-c").arg(script);
    for (k, v) in &prepared.env {
        command = command.env(k.clone(), v.clone());
    }
    if let Some(t) = prepared.timeout {
        command = command.timeout(t);
    }
    command
}

/// The last [`TAIL_CHARS`] characters of `text`, trimmed, with `...` when cut.
fn tail(text: &str) -> String {
    let text = text.trim();
    // The character before the kept tail exists only when the text is longer than the tail.
    match text.char_indices().rev().nth(TAIL_CHARS) {
        Some((i, c)) => format!("...{}", &text[i + c.len_utf8()..]),
        None => text.to_string(),
    }
}

/// How a finished script ended, for messages: `exited with 3` or `was killed (timeout)`.
fn ending(output: &Output) -> String {
    if output.exit_code == -1 {
        "was killed (timeout or signal)".to_string()
    } else {
        format!("exited with {}", output.exit_code)
    }
}

/// Runs a script (or a check script, `what`) on the task's node. The host reports a script
/// killed at its timeout as a `permanent` node failure; here it is `retryable`, like a script
/// that fails (see the module's documentation). `unavailable`, `denied` and `invalid-input`
/// keep their kind.
fn run(task: &Task<Config>, command: &Command, what: &str) -> Result<Output> {
    node::run(&task.node, command).map_err(|e| {
        let e = if e.kind() == ErrorKind::Permanent {
            Error::retryable(e.message())
        } else {
            e
        };
        e.context(format_args!("{}: running the `{}` {what}", who(task), task.action))
    })
}

impl Automator for Shell {
    type Config = Config;

    fn check(task: &Task<Config>) -> Result<Vec<Change>> {
        let prepared = prepare(task)?;
        // An action without a script is performed (as nothing) like any other, so that the
        // SDK's records follow the lifecycle: a `remove` forgets what `configure` did on the node
        // (the node's other services may have wiped it), a `start` forgets `stop`'s record.
        let (Some(_), Some(check)) = (prepared.script, prepared.check) else {
            return orc_sdk::automator::performed::check(task);
        };
        let output = run(task, &command(&prepared, check), "check script")?;
        if output.success() {
            return Ok(Vec::new());
        }
        if output.exit_code == -1 {
            return Err(Error::retryable(format!(
                "{}: the `{}` check script {}: {}",
                who(task),
                task.action,
                ending(&output),
                tail(&output.stderr_text())
            )));
        }
        let mut current = serde_json::Map::new();
        current.insert("exit_code".into(), Value::from(output.exit_code));
        let said = tail(&format!("{}\n{}", output.stdout_text(), output.stderr_text()));
        if !said.is_empty() {
            current.insert("output".into(), Value::String(said));
        }
        Ok(vec![Change::new(
            "check",
            Some(Value::Object(current)),
            Some(serde_json::json!({ "exit_code": 0 })),
        )])
    }

    fn perform(task: Task<Config>) -> Result<Outcome> {
        let prepared = prepare(&task)?;
        let Some(script) = prepared.script else {
            return Ok(Outcome::new().message(format!("no `{}` script: nothing to do", task.action)));
        };
        let output = run(&task, &command(&prepared, script), "script")?;
        if !output.success() {
            let stderr = tail(&output.stderr_text());
            let detail = if stderr.is_empty() { String::new() } else { format!(": {stderr}") };
            return Err(Error::retryable(format!(
                "{}: the `{}` script {}{detail}",
                who(&task),
                task.action,
                ending(&output)
            )));
        }
        let stdout = tail(&output.stdout_text());
        let outcome = if stdout.is_empty() {
            Outcome::new().message(format!("`{}` script done", task.action))
        } else {
            Outcome::new().message(stdout)
        };
        Ok(outcome.output("exit_code", &output.exit_code))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orc_sdk::Placement;
    use orc_sdk::automator::decode_task;

    fn task(config: &str, action: Action) -> Result<Task<Config>> {
        decode_task(
            "shop".into(),
            "web".into(),
            "n1".into(),
            action,
            config,
            r#"{"n1":["web","cache"],"n2":["db","web"]}"#,
        )
    }

    fn env(t: &Task<Config>) -> BTreeMap<String, String> {
        prepare(t).unwrap().env.into_iter().collect()
    }

    #[test]
    fn other_keys_and_the_task_become_the_environment() {
        let t = task(
            r#"{"scripts":{"start":"run"},"port":6379,"log-level":"debug","opts":{"a":[1]},"flag":true,"timeout_s":30}"#,
            Action::Start,
        )
        .unwrap();
        let env = env(&t);
        assert_eq!(env["PORT"], "6379");
        assert_eq!(env["LOG_LEVEL"], "debug");
        assert_eq!(env["OPTS"], r#"{"a":[1]}"#);
        assert_eq!(env["FLAG"], "true");
        assert_eq!(env["ORC_CLUSTER"], "shop");
        assert_eq!(env["ORC_SERVICE"], "web");
        assert_eq!(env["ORC_NODE"], "n1");
        assert_eq!(env["ORC_ACTION"], "start");
        assert_eq!(env["ORC_NODES_WEB"], "n1,n2");
        assert_eq!(env["ORC_NODES_DB"], "n2");
        assert_eq!(
            serde_json::from_str::<Value>(&env["ORC_LAYOUT"]).unwrap(),
            serde_json::json!({"n1":["web","cache"],"n2":["db","web"]})
        );
        assert!(!env.contains_key("SCRIPTS") && !env.contains_key("TIMEOUT_S"));
        let p = prepare(&t).unwrap();
        assert_eq!((p.script, p.check, p.timeout), (Some("run"), None, Some(Duration::from_secs(30))));
        assert_eq!(t.layout[1], Placement::new("n2", ["db", "web"]));
    }

    #[test]
    fn bad_configurations_name_the_key() {
        let err = |config: &str| {
            let t = task(config, Action::Install)?;
            prepare(&t).map(|_| ())
        };
        let message = |config: &str| err(config).unwrap_err().message().to_string();
        assert!(message(r#"{"scripts":{"deploy":"x"}}"#).contains("`scripts`: unknown action \"deploy\""));
        assert!(message(r#"{"checks":{"begin":"x"}}"#).contains("`checks`: unknown action \"begin\""));
        assert!(message(r#"{"timeout_s":0}"#).contains("`timeout_s` must be 1 to 86400, got 0"));
        assert!(message(r#"{"a-b":1,"a_b":2}"#).contains("are both the environment variable A_B"));
        assert!(message(r#"{"orc_node":"x"}"#).contains("`orc_node`: ORC_NODE is reserved"));
        assert!(message(r#"{"path":"/x"}"#).contains("`path`: PATH is reserved"));
        assert!(message(r#"{"9lives":1}"#).contains("`9lives`: \"9LIVES\" is not a valid environment variable name"));
        let e = err(r#"{"scripts":{"install":3}}"#).unwrap_err();
        assert_eq!(e.kind(), orc_sdk::ErrorKind::InvalidInput);
        assert!(e.message().starts_with("shop/web: invalid configuration"), "{}", e.message());
        assert_eq!(err(r#"[1]"#).unwrap_err().kind(), orc_sdk::ErrorKind::InvalidInput);
    }

    #[test]
    fn empty_scripts_are_no_scripts() {
        let t = task(r#"{"scripts":{"stop":"  "},"checks":{"stop":""}}"#, Action::Stop).unwrap();
        let p = prepare(&t).unwrap();
        assert_eq!((p.script, p.check), (None, None));
    }

    #[test]
    fn tails_keep_the_end() {
        let long = "x".repeat(TAIL_CHARS + 10) + "END";
        let t = tail(&long);
        assert!(t.starts_with("...") && t.ends_with("END") && t.len() == TAIL_CHARS + 3);
        assert_eq!(tail("  short\n"), "short");
    }
}
