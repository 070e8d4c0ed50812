//! The `command` adaptor: a command run on a node when its guard says it has not been done, like
//! Ansible's `command`/`shell` with `creates`, `removes`-style checks.
//!
//! Resource type `command`; the key is a name for the command on its node (`init-db`).
//! Attributes:
//! - `argv` (list of strings) or `shell` (string run by `/bin/sh -c`): exactly one;
//! - guards, at least one (a command without one would run on every deploy and every
//!   self-healing pass, so it is refused): `creates` (a path: done when it exists), `unless` (a
//!   shell command: done when it exits 0), `onlyif` (a shell command: run only when it exits 0).
//!   When several are given the command runs only if every guard says so;
//! - `cwd` (optional): working directory for the command and its guards;
//! - `env` (object, optional): environment variables (the node's commands otherwise get only
//!   `PATH`);
//! - `timeout_ms` (optional): kill the command after this long (the host's default otherwise);
//! - `success_codes` (list, default `[0]`): exit codes that count as success.
//!
//! Current state: `{"done": true, "reason": "/var/lib/app/.initialised exists"}`. `diff` reports
//! one change, `run`, with the command, when the guard says it should run. A failure names the
//! command, its exit code and the tail of its stderr.
//!
//! Everything goes through the node's commands (`test -e` for `creates`, `cd` for `cwd`), never
//! its file functions, so paths mean the same as they do to the command on every node: on the
//! local node file functions take paths inside the node's root (`/etc/motd` is `<root>/etc/motd`)
//! while a command runs confined, seeing the root at its host path and the system read-only.

use std::collections::BTreeMap;
use std::time::Duration;

use orc_sdk::node::{self, Command, Output};
use orc_sdk::{Adaptor, Change, Error, Result, ResultExt, Target};
use serde::{Deserialize, Serialize};

pub struct CommandAdaptor;

orc_sdk::export!(adaptor: CommandAdaptor);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Desired {
    #[serde(default)]
    argv: Option<Vec<String>>,
    #[serde(default)]
    shell: Option<String>,
    #[serde(default)]
    creates: Option<String>,
    #[serde(default)]
    unless: Option<String>,
    #[serde(default)]
    onlyif: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    timeout_ms: Option<u32>,
    #[serde(default = "zero")]
    success_codes: Vec<i32>,
}

fn zero() -> Vec<i32> {
    vec![0]
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Current {
    /// Whether the guards say the command has been done (or must not run).
    done: bool,
    /// Which guard decided, for the action log.
    reason: String,
}

/// Runs `argv` after `cd`-ing into `cwd`, through the node's shell.
fn in_dir(cwd: Option<&str>, argv: Vec<String>) -> Vec<String> {
    match cwd {
        None => argv,
        Some(dir) => {
            let mut wrapped = vec![
                "/bin/sh".to_string(),
                "-c".into(),
                r#"cd -- "$1" && shift && exec "$@""#.into(),
                "sh".into(),
                dir.to_string(),
            ];
            wrapped.extend(argv);
            wrapped
        }
    }
}

fn sh(script: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), script.into()]
}

impl Desired {
    /// The command's argv, checked.
    fn program(&self, target: &Target) -> Result<Vec<String>> {
        let invalid = |m: &str| Error::invalid(format!("{}: {m}", target.id));
        let argv = match (&self.argv, &self.shell) {
            (Some(_), Some(_)) => return Err(invalid("give either `argv` or `shell`, not both")),
            (None, None) => return Err(invalid("give the command as `argv` (a list) or `shell` (a string)")),
            (Some(argv), None) if argv.first().is_none_or(String::is_empty) => {
                return Err(invalid("`argv` needs a program as its first element"));
            }
            (Some(argv), None) => argv.clone(),
            (None, Some(script)) if script.trim().is_empty() => return Err(invalid("`shell` is empty")),
            (None, Some(script)) => sh(script),
        };
        if self.creates.is_none() && self.unless.is_none() && self.onlyif.is_none() {
            return Err(invalid(
                "a command needs a guard — `creates`, `unless` or `onlyif` — or it would run on every deploy and every repair",
            ));
        }
        if let Some(path) = &self.creates
            && path.is_empty()
        {
            return Err(invalid("`creates` is empty"));
        }
        if self.success_codes.is_empty() {
            return Err(invalid("`success_codes` is empty"));
        }
        Ok(argv)
    }

    /// How the command is shown in changes and messages.
    fn shown(&self) -> String {
        match (&self.argv, &self.shell) {
            (Some(argv), _) => argv.join(" "),
            (None, Some(script)) => script.clone(),
            (None, None) => String::new(),
        }
    }

    fn command(&self, argv: Vec<String>) -> Command {
        let argv = in_dir(self.cwd.as_deref(), argv);
        let mut cmd = Command::new(argv[0].clone()).args(argv[1..].iter().cloned());
        for (k, v) in &self.env {
            cmd = cmd.env(k, v);
        }
        if let Some(ms) = self.timeout_ms {
            cmd = cmd.timeout(Duration::from_millis(ms.into()));
        }
        cmd
    }

    /// Runs a guard; `true` when it exits 0.
    fn guard(&self, target: &Target, name: &str, argv: Vec<String>) -> Result<bool> {
        let cmd = self.command(argv);
        let out = node::run(&target.node, &cmd).context(format_args!("{}: guard `{name}`", target.id))?;
        Ok(out.success())
    }
}

/// The end of a command's output, for messages.
fn tail(text: &str) -> String {
    const TAIL: usize = 512;
    let text = text.trim();
    match text.char_indices().rev().nth(TAIL) {
        Some((i, _)) => format!("...{}", &text[i..]),
        None => text.to_string(),
    }
}

impl Adaptor for CommandAdaptor {
    type Desired = Desired;
    type Current = Current;

    fn read(target: &Target, desired: &Desired) -> Result<Option<Current>> {
        desired.program(target)?;
        let done = |reason: String| Ok(Some(Current { done: true, reason }));
        if let Some(path) = &desired.creates {
            let test = vec!["test".into(), "-e".into(), path.clone()];
            if desired.guard(target, "creates", test)? {
                return done(format!("{path} exists"));
            }
        }
        if let Some(check) = &desired.unless
            && desired.guard(target, "unless", sh(check))?
        {
            return done(format!("`{check}` succeeded"));
        }
        if let Some(check) = &desired.onlyif
            && !desired.guard(target, "onlyif", sh(check))?
        {
            return done(format!("`{check}` failed"));
        }
        Ok(Some(Current {
            done: false,
            reason: "the guards say it should run".into(),
        }))
    }

    fn diff(target: &Target, desired: &Desired, current: Option<&Current>) -> Result<Vec<Change>> {
        desired.program(target)?;
        if current.is_some_and(|c| c.done) {
            return Ok(Vec::new());
        }
        Ok(vec![Change::new("run", None, Some(desired.shown().into()))])
    }

    fn apply(target: &Target, desired: &Desired, _current: Option<&Current>, _changes: &[Change]) -> Result<Vec<String>> {
        let argv = desired.program(target)?;
        let cmd = desired.command(argv);
        let shown = desired.shown();
        let out: Output = node::run(&target.node, &cmd).context(format_args!("{}: run `{shown}`", target.id))?;
        if !desired.success_codes.contains(&out.exit_code) {
            let stderr = tail(&out.stderr_text());
            let status = if out.exit_code == -1 {
                "was killed".to_string()
            } else {
                format!("exited with {}", out.exit_code)
            };
            let detail = if stderr.is_empty() { String::new() } else { format!(": {stderr}") };
            return Err(Error::permanent(format!("{}: `{shown}` {status}{detail}", target.id)));
        }
        let mut messages = vec![format!("ran `{shown}` (exit {})", out.exit_code)];
        let stdout = tail(&out.stdout_text());
        if !stdout.is_empty() {
            messages.push(format!("output: {stdout}"));
        }
        if let Some(path) = &desired.creates {
            let test = vec!["test".into(), "-e".into(), path.clone()];
            if !desired.guard(target, "creates", test)? {
                messages.push(format!(
                    "warning: {path} still does not exist, so the command will run again on the next deploy"
                ));
            }
        }
        Ok(messages)
    }

    fn delete(_target: &Target, _current: &Current) -> Result<Vec<String>> {
        Ok(vec!["a command has nothing to remove".into()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orc_sdk::ErrorKind;
    use orc_sdk::adaptor::raw;
    use serde_json::{Value, json};

    fn target(attributes: Value) -> Target {
        Target {
            id: "command[web1,init]".into(),
            resource_type: "command".into(),
            node: "web1".into(),
            key: "init".into(),
            attributes_json: attributes.to_string(),
        }
    }

    fn diff(attributes: Value, done: bool) -> Result<Vec<Change>> {
        let current = json!({"done": done, "reason": "test"}).to_string();
        raw::diff::<CommandAdaptor>(&target(attributes), Some(&current))
    }

    #[test]
    fn runs_only_when_the_guard_says_so() {
        let attrs = json!({"argv": ["touch", "/tmp/x"], "creates": "/tmp/x"});
        assert_eq!(
            diff(attrs.clone(), false).unwrap(),
            vec![Change::new("run", None, Some(json!("touch /tmp/x")))]
        );
        assert!(diff(attrs, true).unwrap().is_empty());
        let shell = json!({"shell": "echo hi > /tmp/y", "unless": "test -s /tmp/y"});
        assert_eq!(diff(shell, false).unwrap()[0].desired, Some(json!("echo hi > /tmp/y")));
    }

    #[test]
    fn commands_without_guard_or_program_are_refused() {
        let e = diff(json!({"argv": ["true"]}), false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.message().contains("needs a guard"), "{e}");
        let e = diff(json!({"argv": ["true"], "shell": "true", "creates": "/x"}), false).unwrap_err();
        assert!(e.message().contains("not both"), "{e}");
        let e = diff(json!({"creates": "/x"}), false).unwrap_err();
        assert!(e.message().contains("`argv` (a list) or `shell`"), "{e}");
        let e = diff(json!({"argv": [], "creates": "/x"}), false).unwrap_err();
        assert!(e.message().contains("needs a program"), "{e}");
        let e = diff(json!({"argv": ["true"], "creates": "/x", "user": "root"}), false).unwrap_err();
        assert!(e.message().contains("unknown field `user`"), "{e}");
    }

    #[test]
    fn a_working_directory_wraps_the_command_in_cd() {
        let argv = in_dir(Some("/srv/my app"), vec!["make".into(), "install".into()]);
        assert_eq!(argv[..2], ["/bin/sh", "-c"]);
        assert_eq!(argv[4..], ["/srv/my app", "make", "install"]);
        // Run the wrapper for real: the directory with a space is one word.
        let dir = std::env::temp_dir();
        let out = std::process::Command::new(&argv[0])
            .args(&in_dir(dir.to_str(), vec!["pwd".into()])[1..])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            dir.canonicalize().unwrap().to_str().unwrap()
        );
        assert_eq!(in_dir(None, vec!["true".into()]), ["true"]);
    }

    #[test]
    fn tails_keep_the_end() {
        let long = format!("{}END", "x".repeat(2000));
        let t = tail(&long);
        assert!(t.starts_with("...") && t.ends_with("END") && t.len() < 600, "{t}");
        assert_eq!(tail("  short\n"), "short");
    }
}
