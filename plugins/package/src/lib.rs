//! The `package` adaptor: a Debian package on a node, installed or not, optionally at an exact
//! version.
//!
//! Resource type `package`; the key is the package name (`nginx`, or `libc6:amd64` with an
//! architecture). Attributes:
//! - `state` (optional): `present` (default) or `absent`;
//! - `version` (optional, only with `present`): install exactly this version, downgrading if
//!   needed; without it any installed version will do and a new install takes the candidate;
//! - `purge_config` (optional, default `false`): removing also deletes the configuration files
//!   (`apt-get purge`), and a package whose configuration files remain counts as present for
//!   `absent`;
//! - `apt_options` (optional list of `Key=Value`): passed to `apt-get` as `-o Key=Value`, e.g. a
//!   proxy or another sources list. Normally absent: the node's own sources apply.
//!
//! Current state from `dpkg-query -W`: `{"status": "installed", "version": "1.2-1"}` (status is
//! dpkg's: `installed`, `config-files`, `half-configured`, …), absent when dpkg does not know the
//! package or it is `not-installed`. Changes: `state` and `version`, current → desired.
//!
//! Runs everything through the `node` interface's `run`, non-interactively (`DEBIAN_FRONTEND=
//! noninteractive`, existing configuration files kept). A package or version the sources do not
//! have is looked up again after one `apt-get update`, then is an `invalid-input` error naming
//! it. Package resources on one node take turns (`flock` on `/run/lock/orc-apt.lock`, up to 5
//! minutes), and `apt-get` waits up to 5 minutes for the dpkg lock (unattended upgrades, an
//! operator); a lock still busy after that is `retryable`.

use orc_sdk::node::apt::{self, NODE_LOCK, NODE_LOCK_WAIT_S};
use orc_sdk::node::{self, Command, Output};
use orc_sdk::{Adaptor, Change, Changes, Error, Result, ResultExt, Target};
use serde::{Deserialize, Serialize};

pub struct Package;

orc_sdk::export!(adaptor: Package);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    #[default]
    Present,
    Absent,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Desired {
    #[serde(default)]
    state: State,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    purge_config: bool,
    #[serde(default)]
    apt_options: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Current {
    /// dpkg's status word: `installed`, `config-files`, `half-configured`, ...
    status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<String>,
}

impl Current {
    fn installed(&self) -> bool {
        self.status == "installed"
    }
}

/// The key, checked to be a Debian package name with an optional `:arch`.
fn name(target: &Target) -> Result<&str> {
    let key = target.key.as_str();
    let (pkg, arch) = key.split_once(':').unwrap_or((key, "x"));
    let pkg_ok = pkg.len() >= 2
        && pkg.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && pkg
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c));
    let arch_ok = !arch.is_empty() && arch.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if pkg_ok && arch_ok {
        Ok(key)
    } else {
        Err(Error::invalid(format!("{}: {key:?} is not a Debian package name", target.id)))
    }
}

fn check_version(target: &Target, version: &str) -> Result<()> {
    let ok = !version.is_empty()
        && version.starts_with(|c: char| c.is_ascii_digit())
        && version.chars().all(|c| c.is_ascii_alphanumeric() || ".+-~:".contains(c));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!("{}: {version:?} is not a Debian version", target.id)))
    }
}

impl Desired {
    fn validate(&self, target: &Target) -> Result<()> {
        name(target)?;
        match (&self.version, self.state) {
            (Some(_), State::Absent) => {
                return Err(Error::invalid(format!("{}: `version` applies only to state `present`", target.id)));
            }
            (Some(v), State::Present) => check_version(target, v)?,
            (None, _) => {}
        }
        if let Some(bad) = self.apt_options.iter().find(|o| !o.contains('=') || o.starts_with('=')) {
            return Err(Error::invalid(format!("{}: apt option {bad:?} is not `Key=Value`", target.id)));
        }
        Ok(())
    }
}

/// Why an `apt-get` run failed, from its exit and its messages.
enum AptFailure {
    /// The package, or the version, is not in the sources.
    NotFound,
    Error(Error),
}

fn run_apt(target: &Target, command: &Command) -> std::result::Result<Output, AptFailure> {
    let output = node::run(&target.node, command)
        .context(format_args!("{command}"))
        .map_err(AptFailure::Error)?;
    if output.success() {
        return Ok(output);
    }
    let stderr = output.stderr_text();
    let all = format!("{}\n{stderr}", output.stdout_text());
    if all.contains("Unable to locate package")
        || all.contains("has no installation candidate")
        || (all.contains("Version '") && all.contains("was not found"))
    {
        return Err(AptFailure::NotFound);
    }
    if apt::lock_busy(&output) {
        return Err(AptFailure::Error(Error::retryable(format!(
            "{}: another package action on node {} held {NODE_LOCK} for {NODE_LOCK_WAIT_S} s; try again",
            target.id, target.node
        ))));
    }
    let locked = ["Could not get lock", "Unable to acquire the dpkg frontend lock", "Unable to lock"];
    if locked.iter().any(|l| all.contains(l)) {
        return Err(AptFailure::Error(Error::retryable(format!(
            "{}: the apt/dpkg lock on node {} is held by another process; try again",
            target.id, target.node
        ))));
    }
    Err(AptFailure::Error(output.error(command)))
}

/// Reads the package's dpkg status.
fn query(target: &Target, name: &str) -> Result<Option<Current>> {
    let command = Command::new("dpkg-query")
        .env("LC_ALL", "C")
        .args(["-W", "-f", "${Status}\\t${Version}\\n", name]);
    let output = node::run(&target.node, &command).context(format_args!("{command}"))?;
    let stdout = output.stdout_text();
    if !output.success() {
        // Exit 1 with "no packages found matching" when dpkg has never heard of it.
        if output.exit_code == 1 && output.stderr_text().contains("no packages found") {
            return Ok(None);
        }
        output.check(&command)?;
    }
    let line = stdout.lines().next().unwrap_or_default();
    let (status, version) = line.split_once('\t').unwrap_or((line, ""));
    // "install ok installed": want, error flag, status.
    let status = status
        .split_whitespace()
        .nth(2)
        .ok_or_else(|| Error::permanent(format!("{}: unexpected output of `{command}`: {line:?}", target.id)))?;
    if status == "not-installed" {
        return Ok(None);
    }
    Ok(Some(Current {
        status: status.to_string(),
        version: Some(version.to_string()).filter(|v| !v.is_empty()),
    }))
}

fn install(target: &Target, desired: &Desired) -> Result<()> {
    let name = name(target)?;
    let spec = match &desired.version {
        Some(v) => format!("{name}={v}"),
        None => name.to_string(),
    };
    let mut args = vec!["install", "--no-install-recommends"];
    if desired.version.is_some() {
        args.push("--allow-downgrades");
    }
    args.push(&spec);
    let command = apt::get(&desired.apt_options, &args);
    match run_apt(target, &command) {
        Ok(_) => return Ok(()),
        Err(AptFailure::Error(e)) => return Err(e),
        Err(AptFailure::NotFound) => {}
    }
    // The package lists may be stale: refresh once and try again.
    orc_sdk::info!("{spec} not found in the package lists of node {}; updating them", target.node);
    let update = apt::get(&desired.apt_options, &["update"]);
    match run_apt(target, &update) {
        Ok(_) | Err(AptFailure::NotFound) => {}
        Err(AptFailure::Error(e)) => return Err(e),
    }
    match run_apt(target, &command) {
        Ok(_) => Ok(()),
        Err(AptFailure::Error(e)) => Err(e),
        Err(AptFailure::NotFound) => Err(Error::invalid(match &desired.version {
            Some(v) => format!(
                "{}: version {v} of package {name} is not available from the sources of node {}",
                target.id, target.node
            ),
            None => format!(
                "{}: package {name} is not available from the sources of node {}",
                target.id, target.node
            ),
        })),
    }
}

fn remove(target: &Target, name: &str, purge: bool, options: &[String]) -> Result<()> {
    let command = apt::get(options, &[if purge { "purge" } else { "remove" }, name]);
    match run_apt(target, &command) {
        Ok(_) | Err(AptFailure::NotFound) => Ok(()),
        Err(AptFailure::Error(e)) => Err(e),
    }
}

/// How a change shows the current state.
fn shown_state(current: Option<&Current>) -> Option<String> {
    current.map(|c| if c.installed() { "present".to_string() } else { c.status.clone() })
}

impl Adaptor for Package {
    type Desired = Desired;
    type Current = Current;

    fn read(target: &Target, desired: &Desired) -> Result<Option<Current>> {
        desired.validate(target)?;
        query(target, name(target)?)
    }

    fn diff(target: &Target, desired: &Desired, current: Option<&Current>) -> Result<Vec<Change>> {
        desired.validate(target)?;
        let shown = shown_state(current);
        let installed = current.is_some_and(Current::installed);
        let changes = match desired.state {
            State::Present => {
                let mut changes = Changes::new();
                if !installed {
                    changes = changes.compare("state", shown.as_ref(), &"present".to_string());
                }
                let installed_version = current.filter(|c| c.installed()).and_then(|c| c.version.as_ref());
                if let Some(version) = &desired.version
                    && Some(version) != installed_version
                {
                    changes = changes.push(Change::new(
                        "version",
                        installed_version.map(|v| v.clone().into()),
                        Some(version.clone().into()),
                    ));
                }
                changes
            }
            State::Absent => match current {
                None => Changes::new(),
                Some(c) if !c.installed() && c.status == "config-files" && !desired.purge_config => Changes::new(),
                Some(_) => Changes::new().compare("state", shown.as_ref(), &"absent".to_string()),
            },
        };
        Ok(changes.into_vec())
    }

    fn apply(target: &Target, desired: &Desired, current: Option<&Current>, _changes: &[Change]) -> Result<Vec<String>> {
        desired.validate(target)?;
        let name = name(target)?;
        match desired.state {
            State::Present => {
                install(target, desired)?;
                let now = query(target, name)?;
                let version = now.as_ref().and_then(|c| c.version.clone()).unwrap_or_default();
                if !now.as_ref().is_some_and(Current::installed) {
                    return Err(Error::permanent(format!(
                        "{}: the apt install succeeded but dpkg reports {name} as {}",
                        target.id,
                        shown_state(now.as_ref()).unwrap_or_else(|| "not installed".into())
                    )));
                }
                let before = current.filter(|c| c.installed()).and_then(|c| c.version.as_deref());
                Ok(vec![match before {
                    Some(old) if old != version => format!("changed {name} from {old} to {version}"),
                    Some(_) => format!("{name} {version} is installed"),
                    None => format!("installed {name} {version}"),
                }])
            }
            State::Absent => {
                remove(target, name, desired.purge_config, &desired.apt_options)?;
                Ok(vec![format!("{} {name}", if desired.purge_config { "purged" } else { "removed" })])
            }
        }
    }

    fn delete(target: &Target, current: &Current) -> Result<Vec<String>> {
        let name = name(target)?;
        let purge = target.attribute::<bool>("purge_config")?.unwrap_or(false);
        let options = target.attribute::<Vec<String>>("apt_options")?.unwrap_or_default();
        if !purge && !current.installed() && current.status == "config-files" {
            return Ok(vec![format!("{name} was already removed (configuration files kept)")]);
        }
        remove(target, name, purge, &options)?;
        Ok(vec![format!("{} {name}", if purge { "purged" } else { "removed" })])
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
            id: format!("package[web1,{key}]"),
            resource_type: "package".into(),
            node: "web1".into(),
            key: key.into(),
            attributes_json: attributes.to_string(),
        }
    }

    fn diff(attributes: Value, current: Option<Value>) -> Result<Vec<Change>> {
        let current = current.map(|c| c.to_string());
        raw::diff::<Package>(&target("hello", attributes), current.as_deref())
    }

    #[test]
    fn a_missing_package_is_installed_and_a_pinned_one_shows_its_version() {
        assert_eq!(
            diff(json!({}), None).unwrap(),
            vec![Change::new("state", None, Some(json!("present")))]
        );
        assert_eq!(
            diff(json!({"version": "2.0"}), None).unwrap(),
            vec![
                Change::new("state", None, Some(json!("present"))),
                Change::new("version", None, Some(json!("2.0")))
            ]
        );
    }

    #[test]
    fn an_installed_package_changes_only_for_a_different_pin() {
        let installed = json!({"status": "installed", "version": "1.0"});
        assert!(diff(json!({}), Some(installed.clone())).unwrap().is_empty());
        assert!(diff(json!({"version": "1.0"}), Some(installed.clone())).unwrap().is_empty());
        assert_eq!(
            diff(json!({"version": "2.0"}), Some(installed)).unwrap(),
            vec![Change::new("version", Some(json!("1.0")), Some(json!("2.0")))]
        );
    }

    #[test]
    fn broken_or_removed_packages_show_dpkg_status() {
        let half = json!({"status": "half-configured", "version": "1.0"});
        assert_eq!(
            diff(json!({}), Some(half)).unwrap(),
            vec![Change::new("state", Some(json!("half-configured")), Some(json!("present")))]
        );
        let conf = json!({"status": "config-files", "version": "1.0"});
        assert!(diff(json!({"state": "absent"}), Some(conf.clone())).unwrap().is_empty());
        assert_eq!(
            diff(json!({"state": "absent", "purge_config": true}), Some(conf)).unwrap(),
            vec![Change::new("state", Some(json!("config-files")), Some(json!("absent")))]
        );
        assert_eq!(
            diff(json!({"state": "absent"}), Some(json!({"status": "installed", "version": "1"}))).unwrap(),
            vec![Change::new("state", Some(json!("present")), Some(json!("absent")))]
        );
    }

    #[test]
    fn bad_names_versions_and_options_are_invalid_input() {
        let e = raw::diff::<Package>(&target("Hello World", json!({})), None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert_eq!(
            e.message(),
            "package[web1,Hello World]: \"Hello World\" is not a Debian package name"
        );
        assert!(raw::diff::<Package>(&target("libc6:amd64", json!({})), None).is_ok());
        let e = diff(json!({"version": "1.0; rm -rf /"}), None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        let e = diff(json!({"state": "absent", "version": "1.0"}), None).unwrap_err();
        assert_eq!(e.message(), "package[web1,hello]: `version` applies only to state `present`");
        let e = diff(json!({"apt_options": ["-y"]}), None).unwrap_err();
        assert_eq!(e.message(), "package[web1,hello]: apt option \"-y\" is not `Key=Value`");
        let e = diff(json!({"state": "gone"}), None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
    }
}
