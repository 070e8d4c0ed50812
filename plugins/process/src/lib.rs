//! The `process` adaptor: a long-running program on a node, started detached and kept running
//! (or stopped) with the arguments, environment and version it is given.
//!
//! Resource type `process`; the key is the process's name on its node (letters, digits, `.`,
//! `_`, `-`). Attributes:
//! - `argv` (list of strings, required): the program and its arguments;
//! - `env` (object, optional): its environment (besides `PATH`, nothing else is passed);
//! - `version` (string, optional): free text; a change restarts the process (e.g. after
//!   installing a new build of the same path);
//! - `state` (`running` default, or `stopped`);
//! - `cwd` (optional, default `/`): its working directory;
//! - `state_dir` (optional, default `/var/lib/orc/process`): where `<name>.pid` (pid and start
//!   time), `<name>.spec` (the argv, env, cwd and version it was started with) and `<name>.log`
//!   (its stdout and stderr) live on the node;
//! - `stop_timeout_ms` (optional, default 10000): how long `TERM` has before `KILL`.
//!
//! The process runs in its own session (`setsid`); it is alive when `/proc/<pid>` exists, is not
//! a zombie, and has the start time recorded with its pid, so a reused pid is never taken for
//! it. A running process whose recorded spec differs from the desired one is restarted; stopping
//! sends `TERM` to its process group, then `KILL` after the grace period. Purge stops it and
//! removes its pid, spec and log files.
//!
//! Current state: `{"state": "running", "pid": 4242, "spec": {"argv": [...], "env": {...},
//! "cwd": "/", "version": "1"}}`.
//!
//! Everything goes through the node's commands (one POSIX shell script, `process.sh`), never its
//! file functions: on the local node those take paths inside the node's root while the program
//! sees the root at its host path, so paths must mean what they mean to the program. On the
//! local node a process ends with the command that started it (the sandbox's PID namespace ends
//! with it): long-running processes belong on SSH nodes.

use std::collections::BTreeMap;
use std::time::Duration;

use orc_sdk::node::{self, Command};
use orc_sdk::{Adaptor, Change, Changes, Error, Result, ResultExt, Target};
use serde::{Deserialize, Serialize};

pub struct ProcessAdaptor;

orc_sdk::export!(adaptor: ProcessAdaptor);

/// The script every action runs on the node.
const SCRIPT: &str = include_str!("process.sh");
const DEFAULT_STATE_DIR: &str = "/var/lib/orc/process";
const DEFAULT_STOP_TIMEOUT_MS: u32 = 10_000;
/// Time for the script itself beyond the stop grace period.
const SCRIPT_TIME: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    #[default]
    Running,
    Stopped,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Desired {
    argv: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    state: State,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    state_dir: Option<String>,
    #[serde(default)]
    stop_timeout_ms: Option<u32>,
}

/// What a process was started with; recorded on the node beside its pid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    argv: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Current {
    state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pid: Option<u32>,
    /// The spec recorded at the last start; `None` when there is none (or it is unreadable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spec: Option<Spec>,
}

/// The state directory and name, checked, plus the stop grace period.
struct Place<'a> {
    dir: &'a str,
    name: &'a str,
    stop_timeout_ms: u32,
}

impl Desired {
    fn spec(&self) -> Spec {
        Spec {
            argv: self.argv.clone(),
            env: self.env.clone(),
            cwd: self.cwd.clone().unwrap_or_else(|| "/".into()),
            version: self.version.clone(),
        }
    }

    fn check(&self, target: &Target) -> Result<()> {
        let invalid = |m: String| Error::invalid(format!("{}: {m}", target.id));
        if self.argv.first().is_none_or(String::is_empty) {
            return Err(invalid("`argv` needs a program as its first element".into()));
        }
        for key in self.env.keys() {
            let valid = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(invalid(format!("`env`: {key:?} is not a valid variable name")));
            }
        }
        for (what, path) in [("cwd", self.cwd.as_deref()), ("state_dir", self.state_dir.as_deref())] {
            if let Some(p) = path
                && !p.starts_with('/')
            {
                return Err(invalid(format!("`{what}` must be an absolute path, got {p:?}")));
            }
        }
        Ok(())
    }
}

fn place<'a>(target: &'a Target, desired: &'a Desired) -> Result<Place<'a>> {
    let name = target.key.as_str();
    let valid =
        !name.is_empty() && !name.starts_with('.') && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !valid {
        return Err(Error::invalid(format!(
            "{}: the key names the process and its files: letters, digits, `.`, `_` and `-`, not starting with `.`; got {name:?}",
            target.id
        )));
    }
    desired.check(target)?;
    Ok(Place {
        dir: desired.state_dir.as_deref().unwrap_or(DEFAULT_STATE_DIR),
        name,
        stop_timeout_ms: desired.stop_timeout_ms.unwrap_or(DEFAULT_STOP_TIMEOUT_MS),
    })
}

/// Runs the script with `action` and its arguments; `env` is the program's environment.
fn script(target: &Target, place: &Place<'_>, action: &str, args: &[String], env: &BTreeMap<String, String>) -> Result<String> {
    let mut cmd = Command::new("/bin/sh")
        .args(["-c", SCRIPT, "orc-process", action, place.dir, place.name])
        .args(args.iter().cloned())
        .timeout(Duration::from_millis(place.stop_timeout_ms.into()) + SCRIPT_TIME);
    for (k, v) in env {
        cmd = cmd.env(k, v);
    }
    let out = node::run(&target.node, &cmd).context(format_args!("{}: {action} {}", target.id, place.name))?;
    if !out.success() {
        return Err(Error::permanent(format!(
            "{}: cannot {action} {} (exit {}): {}",
            target.id,
            place.name,
            out.exit_code,
            out.stderr_text().trim()
        )));
    }
    Ok(out.stdout_text())
}

/// Parses the `status` action's output: `running <pid>` or `stopped`, then the spec file.
fn parse_status(text: &str) -> Current {
    let (first, spec) = text.split_once('\n').unwrap_or((text, ""));
    let pid = first.strip_prefix("running ").and_then(|p| p.trim().parse().ok());
    Current {
        state: if pid.is_some() { State::Running } else { State::Stopped },
        pid,
        spec: serde_json::from_str(spec.trim()).ok(),
    }
}

/// The fields in which the recorded spec differs from the desired one.
fn spec_changes(recorded: Option<&Spec>, desired: &Spec) -> Changes {
    Changes::new()
        .compare("argv", recorded.map(|s| &s.argv), &desired.argv)
        .compare("env", recorded.map(|s| &s.env), &desired.env)
        .compare("cwd", recorded.map(|s| &s.cwd), &desired.cwd)
        .compare_optional("version", recorded.and_then(|s| s.version.as_ref()), desired.version.as_ref())
}

impl Adaptor for ProcessAdaptor {
    type Desired = Desired;
    type Current = Current;

    fn read(target: &Target, desired: &Desired) -> Result<Option<Current>> {
        let place = place(target, desired)?;
        let out = script(target, &place, "status", &[], &BTreeMap::new())?;
        Ok(Some(parse_status(&out)))
    }

    fn diff(target: &Target, desired: &Desired, current: Option<&Current>) -> Result<Vec<Change>> {
        place(target, desired)?;
        let current_state = current.map_or(State::Stopped, |c| c.state);
        let recorded = current.and_then(|c| c.spec.as_ref());
        Ok(match (desired.state, current_state) {
            (State::Stopped, State::Stopped) => Vec::new(),
            (State::Stopped, State::Running) => Changes::new().compare("state", Some(&State::Running), &State::Stopped).into_vec(),
            (State::Running, State::Stopped) => {
                let mut changes = vec![Change::new("state", Some("stopped".into()), Some("running".into()))];
                // What the next start changes compared with the last one, when there was one.
                if recorded.is_some() {
                    changes.extend(spec_changes(recorded, &desired.spec()).into_vec());
                }
                changes
            }
            (State::Running, State::Running) => spec_changes(recorded, &desired.spec()).into_vec(),
        })
    }

    fn apply(target: &Target, desired: &Desired, current: Option<&Current>, changes: &[Change]) -> Result<Vec<String>> {
        let place = place(target, desired)?;
        let grace = place.stop_timeout_ms.to_string();
        let mut messages = Vec::new();
        let running = current.is_some_and(|c| c.state == State::Running);
        if running {
            let out = script(target, &place, "stop", std::slice::from_ref(&grace), &BTreeMap::new())?;
            messages.extend(out.lines().map(|l| format!("{}: {l}", place.name)));
        }
        if desired.state == State::Stopped {
            return Ok(messages);
        }
        let spec = desired.spec();
        let spec_json =
            serde_json::to_string(&spec).map_err(|e| Error::permanent(format!("{}: cannot encode the spec: {e}", target.id)))?;
        let mut args = vec![spec.cwd.clone(), spec_json];
        args.extend(spec.argv.iter().cloned());
        let out = script(target, &place, "start", &args, &desired.env)?;
        messages.extend(out.lines().map(|l| format!("{}: {l}", place.name)));
        if running {
            let why: Vec<&str> = changes.iter().map(|c| c.field.as_str()).collect();
            messages.push(format!("{}: restarted because {} changed", place.name, why.join(", ")));
        }
        Ok(messages)
    }

    fn delete(target: &Target, _current: &Current) -> Result<Vec<String>> {
        // A purged resource's attributes are still its last desired ones.
        let desired: Desired = target.attributes()?;
        let place = place(target, &desired)?;
        let grace = place.stop_timeout_ms.to_string();
        let out = script(target, &place, "purge", &[grace], &BTreeMap::new())?;
        let mut messages: Vec<String> = out.lines().map(|l| format!("{}: {l}", place.name)).collect();
        messages.push(format!("removed the state of {} from {}", place.name, place.dir));
        Ok(messages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orc_sdk::ErrorKind;
    use orc_sdk::adaptor::raw;
    use serde_json::{Value, json};

    fn target(key: &str, attributes: Value) -> Target {
        Target {
            id: format!("process[web1,{key}]"),
            resource_type: "process".into(),
            node: "web1".into(),
            key: key.into(),
            attributes_json: attributes.to_string(),
        }
    }

    fn diff(attributes: Value, current: Option<Value>) -> Result<Vec<Change>> {
        raw::diff::<ProcessAdaptor>(&target("app", attributes), current.map(|c| c.to_string()).as_deref())
    }

    #[test]
    fn status_output_is_parsed() {
        let c = parse_status("running 42\n{\"argv\":[\"sleep\"],\"env\":{},\"cwd\":\"/\"}");
        assert_eq!((c.state, c.pid), (State::Running, Some(42)));
        assert_eq!(c.spec.unwrap().argv, ["sleep"]);
        let c = parse_status("stopped\n");
        assert_eq!((c.state, c.pid, c.spec), (State::Stopped, None, None));
    }

    #[test]
    fn changes_name_what_differs_from_the_recorded_start() {
        let attrs = json!({"argv": ["app", "--port", "80"], "version": "2"});
        let spec = json!({"argv": ["app", "--port", "80"], "env": {}, "cwd": "/", "version": "1"});
        let running = json!({"state": "running", "pid": 7, "spec": spec});
        assert_eq!(
            diff(attrs.clone(), Some(running)).unwrap(),
            vec![Change::new("version", Some(json!("1")), Some(json!("2")))]
        );
        let same = json!({"state": "running", "pid": 7, "spec": {"argv": ["app", "--port", "80"], "env": {}, "cwd": "/", "version": "2"}});
        assert!(diff(attrs.clone(), Some(same.clone())).unwrap().is_empty());
        let stopped = json!({"state": "stopped", "spec": spec});
        let changes = diff(attrs.clone(), Some(stopped)).unwrap();
        assert_eq!(changes[0], Change::new("state", Some(json!("stopped")), Some(json!("running"))));
        assert_eq!(changes[1].field, "version");
        let fresh = diff(attrs.clone(), Some(json!({"state": "stopped"}))).unwrap();
        assert_eq!(fresh, vec![Change::new("state", Some(json!("stopped")), Some(json!("running")))]);
        let stop = json!({"argv": ["app"], "state": "stopped"});
        assert_eq!(
            diff(stop.clone(), Some(same)).unwrap(),
            vec![Change::new("state", Some(json!("running")), Some(json!("stopped")))]
        );
        assert!(diff(stop, Some(json!({"state": "stopped"}))).unwrap().is_empty());
    }

    #[test]
    fn bad_names_and_attributes_are_invalid_input() {
        let e = raw::diff::<ProcessAdaptor>(&target("../x", json!({"argv": ["a"]})), None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.message().contains("the key names the process"), "{e}");
        let e = diff(json!({"argv": []}), None).unwrap_err();
        assert!(e.message().contains("needs a program"), "{e}");
        let e = diff(json!({"argv": ["a"], "env": {"A B": "x"}}), None).unwrap_err();
        assert!(e.message().contains("not a valid variable name"), "{e}");
        let e = diff(json!({"argv": ["a"], "state_dir": "rel"}), None).unwrap_err();
        assert!(e.message().contains("`state_dir` must be an absolute path"), "{e}");
        let e = diff(json!({"argv": ["a"], "state": "paused"}), None).unwrap_err();
        assert!(e.message().contains("unknown variant `paused`"), "{e}");
    }

    /// The script itself, run locally the way the node runs it: start, status, restart with a
    /// changed spec is the adaptor's job, so here start, a pid that survives, stop, purge.
    #[test]
    fn the_script_starts_tracks_and_stops_a_real_process() {
        let dir = std::env::temp_dir().join(format!("orc-process-test-{}", std::process::id()));
        let dir_s = dir.to_str().unwrap();
        let run = |args: &[&str]| {
            std::process::Command::new("/bin/sh")
                .args(["-c", SCRIPT, "orc-process"])
                .args(args)
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .env("GREETING", "hi there")
                .output()
                .unwrap()
        };
        let out = run(&[
            "start",
            dir_s,
            "t",
            "/",
            "{\"argv\":[]}",
            "/bin/sh",
            "-c",
            "echo \"$GREETING\"; exec sleep 30",
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let status = parse_status(&String::from_utf8_lossy(&run(&["status", dir_s, "t"]).stdout));
        let pid = status.pid.expect("running");
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
        let out = run(&["purge", dir_s, "t", "2000"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let status = parse_status(&String::from_utf8_lossy(&run(&["status", dir_s, "t"]).stdout));
        assert_eq!((status.state, status.spec), (State::Stopped, None));
        let bad = run(&["start", dir_s, "bad", "/", "{}", "/nonexistent/program"]);
        assert!(!bad.status.success());
        assert!(String::from_utf8_lossy(&bad.stderr).contains("exited at once"), "{bad:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
