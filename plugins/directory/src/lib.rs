//! The `directory` adaptor: a directory on a node and its permission bits.
//!
//! Resource type `directory`; the key is the directory's absolute path on the node. Attributes:
//! - `mode` (optional): octal string (`"0755"`) or integer of octal digits (`755`). A new
//!   directory gets `0755` when absent; an existing one's mode is then left alone;
//! - `owner`, `group` (optional): a name resolved on the node, or a numeric id; compared and
//!   set only when given (a new directory belongs to whoever the node writes as otherwise);
//! - `parents` (bool, default `true`): create missing parent directories;
//! - `purge_recursive` (bool, default `false`): when the resource is purged, remove the
//!   directory with its content. Otherwise purging removes it only when it is empty.
//!
//! Current state: `{"mode": "0755"}`, with `"owner": {"uid": 0, "gid": 0, "user": "root",
//! "group": "root"}` when `owner` or `group` is managed (looking the names up costs a command over
//! SSH). Something other than a directory at the path is an error, never replaced.

use orc_sdk::adaptor::has_change;
use orc_sdk::node::{self, FileKind, Mode, Ownership};
use orc_sdk::{Adaptor, Change, Changes, Error, Result, ResultExt, Target};
use serde::{Deserialize, Serialize};

/// The mode of a directory created without a `mode` attribute.
const DEFAULT_MODE: Mode = Mode::new(0o755).expect("0o755 is a valid mode");

pub struct DirectoryAdaptor;

orc_sdk::export!(adaptor: DirectoryAdaptor);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Desired {
    #[serde(default)]
    mode: Option<Mode>,
    #[serde(default)]
    owner: Option<String>,
    #[serde(default)]
    group: Option<String>,
    #[serde(default = "yes")]
    parents: bool,
    /// Read by `delete` through `Target::attribute`; declared so that it is a known attribute.
    #[serde(default)]
    #[allow(dead_code)]
    purge_recursive: bool,
}

fn yes() -> bool {
    true
}

impl Desired {
    fn manages_owner(&self) -> bool {
        self.owner.is_some() || self.group.is_some()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Current {
    mode: Mode,
    /// Read only when `owner` or `group` is managed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<Ownership>,
}

impl Adaptor for DirectoryAdaptor {
    type Desired = Desired;
    type Current = Current;

    fn read(target: &Target, desired: &Desired) -> Result<Option<Current>> {
        let path = target.absolute_path()?;
        match node::stat(&target.node, path).context(format_args!("stat {path}"))? {
            None => Ok(None),
            Some(stat) if stat.kind == FileKind::Directory => {
                let owner = if desired.manages_owner() {
                    node::owner(&target.node, path).context(format_args!("owner of {path}"))?
                } else {
                    None
                };
                Ok(Some(Current { mode: stat.mode, owner }))
            }
            Some(stat) => Err(Error::permanent(format!(
                "{}: {path} is a {}, not a directory; the directory adaptor will not replace it",
                target.id,
                stat.kind.as_str()
            ))),
        }
    }

    fn diff(target: &Target, desired: &Desired, current: Option<&Current>) -> Result<Vec<Change>> {
        target.absolute_path()?;
        let (owner, group) = (desired.owner.as_deref(), desired.group.as_deref());
        Ok(match current {
            None => Changes::new()
                .compare("mode", None, &desired.mode.unwrap_or(DEFAULT_MODE))
                .compare_ownership(None, owner, group),
            Some(current) => Changes::new()
                .compare_managed("mode", Some(&current.mode), desired.mode.as_ref())
                .compare_ownership(current.owner.as_ref(), owner, group),
        }
        .into_vec())
    }

    fn apply(target: &Target, desired: &Desired, current: Option<&Current>, changes: &[Change]) -> Result<Vec<String>> {
        let path = target.absolute_path()?;
        let mut messages = Vec::new();
        match current {
            None => {
                let mode = desired.mode.unwrap_or(DEFAULT_MODE);
                node::create_dir(&target.node, path, Some(mode), desired.parents).context(format_args!("create directory {path}"))?;
                messages.push(format!("created directory {path} (mode {mode})"));
                if desired.manages_owner() {
                    messages.push(node::set_owner_of(
                        target,
                        path,
                        desired.owner.as_deref(),
                        desired.group.as_deref(),
                    )?);
                }
            }
            Some(current) => {
                if let Some(mode) = desired.mode.filter(|m| *m != current.mode && has_change(changes, "mode")) {
                    node::set_mode(&target.node, path, mode).context(format_args!("chmod {path}"))?;
                    messages.push(format!("set mode of {path} to {mode} (was {})", current.mode));
                }
                let user = desired.owner.as_deref().filter(|_| has_change(changes, "owner"));
                let group = desired.group.as_deref().filter(|_| has_change(changes, "group"));
                if user.is_some() || group.is_some() {
                    messages.push(node::set_owner_of(target, path, user, group)?);
                }
            }
        }
        Ok(messages)
    }

    fn delete(target: &Target, _current: &Current) -> Result<Vec<String>> {
        let path = target.absolute_path()?;
        let recursive = target.attribute::<bool>("purge_recursive")?.unwrap_or(false);
        if recursive && path.trim_end_matches('/').is_empty() {
            return Err(Error::invalid(format!("{}: refusing to remove / recursively", target.id)));
        }
        let existed = node::remove(&target.node, path, recursive).map_err(|e| {
            // The host's message says why; only a plain removal can fail for want of recursion.
            let hint = if recursive {
                ""
            } else {
                " (a directory that is not empty is removed only with purge_recursive: true)"
            };
            Error::new(e.kind(), format!("remove {path}: {}{hint}", e.message()))
        })?;
        Ok(vec![match (existed, recursive) {
            (false, _) => format!("{path} was already absent"),
            (true, false) => format!("removed directory {path}"),
            (true, true) => format!("removed directory {path} and its content"),
        }])
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
            id: "directory[web1,/srv/www]".into(),
            resource_type: "directory".into(),
            node: "web1".into(),
            key: "/srv/www".into(),
            attributes_json: attributes.to_string(),
        }
    }

    fn diff(attributes: Value, current: Option<&str>) -> Result<Vec<Change>> {
        raw::diff::<DirectoryAdaptor>(&target(attributes), current)
    }

    #[test]
    fn a_missing_directory_is_created_with_0755_unless_told() {
        assert_eq!(diff(json!({}), None).unwrap(), vec![Change::new("mode", None, Some(json!("0755")))]);
        assert_eq!(
            diff(json!({"mode": "0700", "parents": false}), None).unwrap(),
            vec![Change::new("mode", None, Some(json!("0700")))]
        );
    }

    #[test]
    fn mode_is_managed_only_when_given() {
        assert!(diff(json!({}), Some(r#"{"mode":"0700"}"#)).unwrap().is_empty());
        assert!(diff(json!({"mode": 700}), Some(r#"{"mode":"0700"}"#)).unwrap().is_empty());
        assert_eq!(
            diff(json!({"mode": "0750", "purge_recursive": true}), Some(r#"{"mode":"0700"}"#)).unwrap(),
            vec![Change::new("mode", Some(json!("0700")), Some(json!("0750")))]
        );
    }

    #[test]
    fn owner_and_group_are_managed_only_when_given() {
        let root = r#"{"mode":"0755","owner":{"uid":0,"gid":0,"user":"root","group":"root"}}"#;
        assert!(diff(json!({}), Some(root)).unwrap().is_empty());
        assert!(diff(json!({"owner": "root", "group": "0"}), Some(root)).unwrap().is_empty());
        assert_eq!(
            diff(json!({"owner": "www-data", "group": "root"}), Some(root)).unwrap(),
            vec![Change::new("owner", Some(json!("root")), Some(json!("www-data")))]
        );
        assert_eq!(
            diff(json!({"group": "33"}), None).unwrap(),
            vec![
                Change::new("mode", None, Some(json!("0755"))),
                Change::new("group", None, Some(json!("33")))
            ]
        );
    }

    #[test]
    fn bad_attributes_are_invalid_input() {
        let e = diff(json!({"parents": "yes"}), None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert_eq!(
            e.message(),
            "directory[web1,/srv/www]: invalid attributes: `parents`: invalid type: string \"yes\", expected a boolean"
        );
        let e = diff(json!({"recurse": true}), None).unwrap_err();
        assert!(
            e.message()
                .contains("unknown field `recurse`, expected one of `mode`, `owner`, `group`, `parents`, `purge_recursive`"),
            "{e}"
        );
    }
}
