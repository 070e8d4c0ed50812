//! The `file` adaptor: a regular file on a node, its content and its permission bits.
//!
//! Resource type `file`; the key is the file's absolute path on the node. Attributes:
//! - `content` (string, required): the whole content;
//! - `mode` (optional): octal string (`"0644"`) or integer of octal digits (`644`). A new file
//!   gets `0644` when absent; an existing file's mode is then left alone;
//! - `owner`, `group` (optional): a name resolved on the node, or a numeric id. Compared and
//!   changed only when given; a new file otherwise belongs to whoever the node writes as. A
//!   content rewrite (a new file renamed over the old one) keeps the previous owner and group.
//!
//! Current state: `{"mode": "0644", "size": 12, "sha256": "<hex>", "content": "hello world\n",
//! "uid": 0, "gid": 0, "owner": "root", "group": "root"}`, with `content` only for UTF-8 files of
//! at most 4 KiB, so the host never carries large or binary files around, and the names only
//! when `owner` or `group` is managed (looking them up costs a command over SSH). Content is compared by sha256. Changes show text of at most 4 KiB as is,
//! anything else as `sha256:<hex> (<n> bytes)`.
//!
//! Written only against the host's `node` interface, so it works unchanged whatever transport
//! the host uses to reach the node. Writes are atomic (`node::write_file`).

use orc_sdk::adaptor::has_change;
use orc_sdk::node::{self, FileKind, FileStat, Mode, Ownership};
use orc_sdk::{Adaptor, Change, Changes, Error, Result, ResultExt, Target};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The mode of a file created without a `mode` attribute.
const DEFAULT_MODE: Mode = Mode::new(0o644).expect("0o644 is a valid mode");
/// Content up to this size (and valid UTF-8) is shown and carried as text.
const SHOW_LIMIT: usize = 4096;

pub struct FileAdaptor;

orc_sdk::export!(adaptor: FileAdaptor);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Desired {
    content: String,
    #[serde(default)]
    mode: Option<Mode>,
    #[serde(default)]
    owner: Option<String>,
    #[serde(default)]
    group: Option<String>,
}

impl Desired {
    fn manages_owner(&self) -> bool {
        self.owner.is_some() || self.group.is_some()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Current {
    mode: Mode,
    size: u64,
    sha256: String,
    /// The content, for UTF-8 files of at most [`SHOW_LIMIT`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content: Option<String>,
    uid: u32,
    gid: u32,
    /// The user's name (or id), read only when `owner` or `group` is managed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group: Option<String>,
}

impl Current {
    fn of(bytes: &[u8], stat: &FileStat, names: Option<&Ownership>) -> Current {
        Current {
            mode: stat.mode,
            size: bytes.len() as u64,
            sha256: sha256_hex(bytes),
            content: shown_text(bytes).map(str::to_string),
            uid: stat.uid,
            gid: stat.gid,
            owner: names.map(Ownership::user_shown),
            group: names.map(Ownership::group_shown),
        }
    }

    fn ownership(&self) -> Ownership {
        Ownership {
            uid: self.uid,
            gid: self.gid,
            user: self.owner.clone(),
            group: self.group.clone(),
        }
    }

    /// How a change shows the current content.
    fn content_value(&self) -> Value {
        match &self.content {
            Some(text) => Value::String(text.clone()),
            None => Value::String(summary(&self.sha256, self.size)),
        }
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn shown_text(bytes: &[u8]) -> Option<&str> {
    if bytes.len() <= SHOW_LIMIT {
        std::str::from_utf8(bytes).ok()
    } else {
        None
    }
}

fn summary(sha256: &str, size: u64) -> String {
    format!("sha256:{sha256} ({size} bytes)")
}

/// How a change shows the desired content.
fn desired_content_value(content: &str) -> Value {
    match shown_text(content.as_bytes()) {
        Some(text) => Value::String(text.to_string()),
        None => Value::String(summary(&sha256_hex(content.as_bytes()), content.len() as u64)),
    }
}

impl Adaptor for FileAdaptor {
    type Desired = Desired;
    type Current = Current;

    fn read(target: &Target, desired: &Desired) -> Result<Option<Current>> {
        let path = target.absolute_non_directory_path()?;
        let Some(stat) = node::stat(&target.node, path).context(format_args!("stat {path}"))? else {
            return Ok(None);
        };
        if stat.kind != FileKind::File {
            return Err(Error::permanent(format!(
                "{}: {path} is a {}, not a regular file; the file adaptor will not replace it",
                target.id,
                stat.kind.as_str()
            )));
        }
        // Removed between the two calls: absent, as the next read would say.
        let Some(bytes) = node::read_file(&target.node, path).context(format_args!("read {path}"))? else {
            return Ok(None);
        };
        let names = if desired.manages_owner() {
            node::owner(&target.node, path).context(format_args!("owner of {path}"))?
        } else {
            None
        };
        Ok(Some(Current::of(&bytes, &stat, names.as_ref())))
    }

    fn diff(target: &Target, desired: &Desired, current: Option<&Current>) -> Result<Vec<Change>> {
        target.absolute_non_directory_path()?;
        let Some(current) = current else {
            return Ok(Changes::new()
                .push(Change::new("content", None, Some(desired_content_value(&desired.content))))
                .compare("mode", None, &desired.mode.unwrap_or(DEFAULT_MODE))
                .compare_ownership(None, desired.owner.as_deref(), desired.group.as_deref())
                .into_vec());
        };
        let mut changes = Changes::new();
        if current.sha256 != sha256_hex(desired.content.as_bytes()) {
            changes = changes.push(Change::new(
                "content",
                Some(current.content_value()),
                Some(desired_content_value(&desired.content)),
            ));
        }
        Ok(changes
            .compare_ownership(Some(&current.ownership()), desired.owner.as_deref(), desired.group.as_deref())
            .compare_managed("mode", Some(&current.mode), desired.mode.as_ref())
            .into_vec())
    }

    fn apply(target: &Target, desired: &Desired, current: Option<&Current>, changes: &[Change]) -> Result<Vec<String>> {
        let path = target.absolute_non_directory_path()?;
        let bytes = desired.content.as_bytes();
        let Some(current) = current else {
            let mode = desired.mode.unwrap_or(DEFAULT_MODE);
            node::write_file(&target.node, path, bytes, Some(mode)).context(format_args!("write {path}"))?;
            let mut messages = vec![format!("created {path} ({} bytes, mode {mode})", bytes.len())];
            if desired.manages_owner() {
                messages.push(node::set_owner_of(
                    target,
                    path,
                    desired.owner.as_deref(),
                    desired.group.as_deref(),
                )?);
            }
            return Ok(messages);
        };
        let mode = desired.mode.unwrap_or(current.mode);
        let mut messages = Vec::new();
        let owner_changes = (
            desired.owner.as_deref().filter(|_| has_change(changes, "owner")),
            desired.group.as_deref().filter(|_| has_change(changes, "group")),
        );
        if has_change(changes, "content") {
            // The write sets the mode too, so a mode change needs no second call.
            node::write_file(&target.node, path, bytes, Some(mode)).context(format_args!("write {path}"))?;
            messages.push(format!("wrote {path} ({} bytes, was {})", bytes.len(), current.size));
            if mode != current.mode {
                messages.push(format!("set mode of {path} to {mode} (was {})", current.mode));
            }
            // The new file belongs to whoever the node writes as: a managed owner or group is
            // set again, an unmanaged one given back when the write changed it.
            let written = node::stat(&target.node, path)
                .context(format_args!("stat {path}"))?
                .ok_or_else(|| Error::retryable(format!("{}: {path} vanished after writing it", target.id)))?;
            let (uid, gid) = (current.uid.to_string(), current.gid.to_string());
            let user = desired.owner.as_deref().or((written.uid != current.uid).then_some(uid.as_str()));
            let group = desired.group.as_deref().or((written.gid != current.gid).then_some(gid.as_str()));
            if user.is_some() || group.is_some() {
                messages.push(node::set_owner_of(target, path, user, group)?);
            }
            return Ok(messages);
        }
        if mode != current.mode && has_change(changes, "mode") {
            node::set_mode(&target.node, path, mode).context(format_args!("chmod {path}"))?;
            messages.push(format!("set mode of {path} to {mode} (was {})", current.mode));
        }
        if owner_changes.0.is_some() || owner_changes.1.is_some() {
            messages.push(node::set_owner_of(target, path, owner_changes.0, owner_changes.1)?);
        }
        Ok(messages)
    }

    fn delete(target: &Target, _current: &Current) -> Result<Vec<String>> {
        let path = target.absolute_non_directory_path()?;
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
    use serde_json::json;

    fn target(key: &str, attributes: Value) -> Target {
        Target {
            id: format!("file[web1,{key}]"),
            resource_type: "file".into(),
            node: "web1".into(),
            key: key.into(),
            attributes_json: attributes.to_string(),
        }
    }

    fn stat(mode: u32) -> FileStat {
        FileStat {
            kind: FileKind::File,
            size: 0,
            mode: Mode::new(mode).unwrap(),
            uid: 1000,
            gid: 100,
            mtime_ms: 0,
        }
    }

    fn current(content: &[u8], mode: u32) -> String {
        serde_json::to_string(&Current::of(content, &stat(mode), None)).unwrap()
    }

    fn owned(content: &[u8], user: Option<&str>, group: Option<&str>) -> String {
        let names = Ownership {
            uid: 1000,
            gid: 100,
            user: user.map(str::to_string),
            group: group.map(str::to_string),
        };
        serde_json::to_string(&Current::of(content, &stat(0o644), Some(&names))).unwrap()
    }

    fn diff(attributes: Value, current: Option<String>) -> Result<Vec<Change>> {
        raw::diff::<FileAdaptor>(&target("/etc/motd", attributes), current.as_deref())
    }

    #[test]
    fn a_missing_file_is_created_with_0644_unless_told() {
        let changes = diff(json!({"content": "hello\n"}), None).unwrap();
        assert_eq!(
            changes,
            vec![
                Change::new("content", None, Some(json!("hello\n"))),
                Change::new("mode", None, Some(json!("0644")))
            ]
        );
        let changes = diff(json!({"content": "", "mode": 600}), None).unwrap();
        assert_eq!(changes[1], Change::new("mode", None, Some(json!("0600"))));
    }

    #[test]
    fn a_correct_file_has_no_changes_and_an_absent_mode_is_unmanaged() {
        assert!(
            diff(json!({"content": "hello\n", "mode": "0644"}), Some(current(b"hello\n", 0o644)))
                .unwrap()
                .is_empty()
        );
        assert!(
            diff(json!({"content": "hello\n"}), Some(current(b"hello\n", 0o600)))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn content_and_mode_changes_show_text_and_octal() {
        let changes = diff(json!({"content": "new\n", "mode": "0640"}), Some(current(b"old\n", 0o644))).unwrap();
        assert_eq!(
            changes,
            vec![
                Change::new("content", Some(json!("old\n")), Some(json!("new\n"))),
                Change::new("mode", Some(json!("0644")), Some(json!("0640")))
            ]
        );
    }

    #[test]
    fn large_and_binary_content_is_summarised() {
        let big = "x".repeat(SHOW_LIMIT + 1);
        let changes = diff(json!({"content": big}), Some(current(&[0xff, 0x00], 0o644))).unwrap();
        assert_eq!(changes.len(), 1);
        let c = &changes[0];
        assert_eq!(c.current, Some(json!(format!("sha256:{} (2 bytes)", sha256_hex(&[0xff, 0x00])))));
        assert_eq!(
            c.desired,
            Some(json!(format!("sha256:{} (4097 bytes)", sha256_hex(big.as_bytes()))))
        );
        // Exactly at the limit is still shown.
        let at_limit = "y".repeat(SHOW_LIMIT);
        assert_eq!(diff(json!({"content": at_limit}), None).unwrap()[0].desired, Some(json!(at_limit)));
    }

    #[test]
    fn current_state_carries_small_text_only() {
        let small: Value = serde_json::from_str(&current(b"hi", 0o644)).unwrap();
        assert_eq!(
            small,
            json!({"mode": "0644", "size": 2, "sha256": "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4", "content": "hi", "uid": 1000, "gid": 100})
        );
        let big: Value = serde_json::from_str(&current(&vec![b'a'; SHOW_LIMIT + 1], 0o600)).unwrap();
        assert!(big.get("content").is_none());
        assert_eq!(big["size"], json!(SHOW_LIMIT + 1));
    }

    #[test]
    fn owner_and_group_compare_by_name_or_id_and_only_when_given() {
        let attrs = json!({"content": "x", "owner": "www-data", "group": "100"});
        assert_eq!(
            diff(attrs.clone(), Some(owned(b"x", Some("alice"), Some("users")))).unwrap(),
            vec![Change::new("owner", Some(json!("alice")), Some(json!("www-data")))]
        );
        assert!(
            diff(json!({"content": "x", "owner": "1000"}), Some(owned(b"x", None, None)))
                .unwrap()
                .is_empty()
        );
        let changes = diff(json!({"content": "x", "group": "staff"}), Some(owned(b"x", Some("alice"), None))).unwrap();
        assert_eq!(changes, vec![Change::new("group", Some(json!("100")), Some(json!("staff")))]);
        let changes = diff(attrs, None).unwrap();
        let fields: Vec<&str> = changes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["content", "mode", "owner", "group"]);
        // Unmanaged: whatever the owner, no change.
        assert!(
            diff(json!({"content": "x"}), Some(owned(b"x", Some("alice"), Some("users"))))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn bad_attributes_and_keys_are_invalid_input() {
        let e = diff(json!({"content": "x", "mode": "rw-r--r--"}), None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert_eq!(
            e.message(),
            "file[web1,/etc/motd]: invalid attributes: `mode`: invalid mode \"rw-r--r--\": expected octal permission bits like \"0644\""
        );
        let e = diff(json!({"content": "x", "user": "root"}), None).unwrap_err();
        assert_eq!(
            e.message(),
            "file[web1,/etc/motd]: invalid attributes: unknown field `user`, expected one of `content`, `mode`, `owner`, `group`"
        );
        let e = diff(json!({"mode": "0644"}), None).unwrap_err();
        assert_eq!(e.message(), "file[web1,/etc/motd]: invalid attributes: missing field `content`");
        let e = raw::diff::<FileAdaptor>(&target("etc/motd", json!({"content": "x"})), None).unwrap_err();
        assert_eq!(
            e.message(),
            "file[web1,etc/motd]: the key must be an absolute path, got \"etc/motd\""
        );
    }
}
