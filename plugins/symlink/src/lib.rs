//! The `symlink` adaptor: a symbolic link on a node and where it points.
//!
//! Resource type `symlink`; the key is the link's absolute path on the node. Attributes:
//! - `target` (string, required): what the link points to, stored as given (absolute or
//!   relative to the link's directory; it need not exist);
//! - `force` (bool, default `false`): replace a regular file, an empty directory or a special
//!   file found at the path. Without it such a path is a `permanent` error naming what is there;
//!   a non-empty directory is never replaced.
//!
//! Current state: `{"kind": "symlink", "target": "/etc/nginx/sites-available/app"}`, or the kind
//! of whatever else is at the path (`{"kind": "file"}`). A link pointing elsewhere is replaced
//! atomically. Purge removes the link, and only a link: a file found there is left alone.

use orc_sdk::node::{self, FileKind};
use orc_sdk::{Adaptor, Change, Changes, Error, Result, ResultExt, Target};
use serde::{Deserialize, Serialize};

pub struct SymlinkAdaptor;

orc_sdk::export!(adaptor: SymlinkAdaptor);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Desired {
    target: String,
    #[serde(default)]
    force: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Current {
    /// `symlink`, `file`, `directory` or `special file`.
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<String>,
}

const SYMLINK: &str = "symlink";

impl Current {
    fn is_link(&self) -> bool {
        self.kind == SYMLINK
    }
}

impl Adaptor for SymlinkAdaptor {
    type Desired = Desired;
    type Current = Current;

    fn read(target: &Target, _desired: &Desired) -> Result<Option<Current>> {
        let path = target.absolute_non_directory_path()?;
        let Some(stat) = node::stat(&target.node, path).context(format_args!("stat {path}"))? else {
            return Ok(None);
        };
        if stat.kind != FileKind::Symlink {
            return Ok(Some(Current {
                kind: stat.kind.as_str().to_string(),
                target: None,
            }));
        }
        // Removed between the two calls: absent, as the next read would say.
        Ok(node::read_link(&target.node, path)
            .context(format_args!("read link {path}"))?
            .map(|t| Current {
                kind: SYMLINK.into(),
                target: Some(t),
            }))
    }

    fn diff(target: &Target, desired: &Desired, current: Option<&Current>) -> Result<Vec<Change>> {
        let path = target.absolute_non_directory_path()?;
        if desired.target.is_empty() {
            return Err(Error::invalid(format!("{}: `target` is empty", target.id)));
        }
        let Some(current) = current else {
            return Ok(Changes::new().compare("target", None, &desired.target).into_vec());
        };
        if current.is_link() {
            return Ok(Changes::new()
                .compare("target", current.target.as_ref(), &desired.target)
                .into_vec());
        }
        if !desired.force {
            return Err(Error::permanent(format!(
                "{}: {path} is a {}, not a symlink; set `force: true` to replace it",
                target.id, current.kind
            )));
        }
        Ok(Changes::new()
            .compare("kind", Some(&current.kind), &SYMLINK.to_string())
            .compare("target", None, &desired.target)
            .into_vec())
    }

    fn apply(target: &Target, desired: &Desired, current: Option<&Current>, _changes: &[Change]) -> Result<Vec<String>> {
        let path = target.absolute_non_directory_path()?;
        let mut messages = Vec::new();
        if let Some(current) = current.filter(|c| !c.is_link()) {
            if !desired.force {
                return Err(Error::permanent(format!(
                    "{}: {path} is a {}, not a symlink; set `force: true` to replace it",
                    target.id, current.kind
                )));
            }
            // Never recursive: a directory with content is not ours to throw away.
            node::remove(&target.node, path, false).context(format_args!("{}: replace the {} at {path}", target.id, current.kind))?;
            messages.push(format!("removed the {} at {path}", current.kind));
        }
        node::create_symlink(&target.node, &desired.target, path).context(format_args!("symlink {path}"))?;
        messages.push(match current.and_then(|c| c.target.as_deref()) {
            Some(old) => format!("pointed {path} at {} (was {old})", desired.target),
            None => format!("linked {path} -> {}", desired.target),
        });
        Ok(messages)
    }

    fn delete(target: &Target, current: &Current) -> Result<Vec<String>> {
        let path = target.absolute_non_directory_path()?;
        if !current.is_link() {
            return Ok(vec![format!("{path} is a {}, not a symlink: left alone", current.kind)]);
        }
        let existed = node::remove(&target.node, path, false).context(format_args!("remove {path}"))?;
        Ok(vec![if existed {
            format!("removed {path}")
        } else {
            format!("{path} was already absent")
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orc_sdk::ErrorKind;
    use orc_sdk::adaptor::raw;
    use serde_json::{Value, json};

    fn diff(attributes: Value, current: Option<Value>) -> Result<Vec<Change>> {
        let target = Target {
            id: "symlink[web1,/etc/app]".into(),
            resource_type: "symlink".into(),
            node: "web1".into(),
            key: "/etc/app".into(),
            attributes_json: attributes.to_string(),
        };
        raw::diff::<SymlinkAdaptor>(&target, current.map(|c| c.to_string()).as_deref())
    }

    #[test]
    fn links_are_created_and_repointed() {
        assert_eq!(
            diff(json!({"target": "/opt/app"}), None).unwrap(),
            vec![Change::new("target", None, Some(json!("/opt/app")))]
        );
        assert_eq!(
            diff(
                json!({"target": "/opt/app"}),
                Some(json!({"kind": "symlink", "target": "/opt/old"}))
            )
            .unwrap(),
            vec![Change::new("target", Some(json!("/opt/old")), Some(json!("/opt/app")))]
        );
        assert!(
            diff(
                json!({"target": "/opt/app"}),
                Some(json!({"kind": "symlink", "target": "/opt/app"}))
            )
            .unwrap()
            .is_empty()
        );
    }

    #[test]
    fn a_file_in_the_way_needs_force() {
        let e = diff(json!({"target": "/opt/app"}), Some(json!({"kind": "file"}))).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Permanent);
        assert_eq!(
            e.message(),
            "symlink[web1,/etc/app]: /etc/app is a file, not a symlink; set `force: true` to replace it"
        );
        assert_eq!(
            diff(json!({"target": "/opt/app", "force": true}), Some(json!({"kind": "directory"}))).unwrap(),
            vec![
                Change::new("kind", Some(json!("directory")), Some(json!("symlink"))),
                Change::new("target", None, Some(json!("/opt/app")))
            ]
        );
        let e = diff(json!({"target": ""}), None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        let e = diff(json!({}), None).unwrap_err();
        assert!(e.message().contains("missing field `target`"), "{e}");
    }
}
