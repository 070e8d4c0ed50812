//! Adaptors: read one resource, diff it against its desired attributes, enforce them.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{Error, Result, json};

/// The resource the host hands to an adaptor call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The full id, e.g. `file[web1,/etc/motd]`.
    pub id: String,
    /// The resource type, e.g. `file`.
    pub resource_type: String,
    /// The node the resource lives on; pass it to [`crate::node`] calls.
    pub node: String,
    /// The key within the node, e.g. `/etc/motd`.
    pub key: String,
    /// The desired attributes, as JSON text.
    pub attributes_json: String,
}

impl Target {
    /// Decodes the attributes; errors are `invalid-input` and name the resource and the field.
    pub fn attributes<T: DeserializeOwned>(&self) -> Result<T> {
        json::decode(&self.attributes_json).map_err(|e| Error::invalid(e.describe(&format!("{}: invalid attributes", self.id))))
    }

    /// The key as an absolute path on the node, for resource types keyed by path (`file`,
    /// `directory`, `symlink`). Anything else is an `invalid-input` error naming the resource
    /// and the key.
    ///
    /// ```
    /// # use orc_sdk::Target;
    /// let t = Target { id: "directory[web1,srv/www]".into(), resource_type: "directory".into(),
    ///     node: "web1".into(), key: "srv/www".into(), attributes_json: "{}".into() };
    /// assert_eq!(
    ///     t.absolute_path().unwrap_err().message(),
    ///     r#"directory[web1,srv/www]: the key must be an absolute path, got "srv/www""#
    /// );
    /// ```
    pub fn absolute_path(&self) -> Result<&str> {
        let key = self.key.as_str();
        if !key.starts_with('/') {
            return Err(Error::invalid(format!(
                "{}: the key must be an absolute path, got {key:?}",
                self.id
            )));
        }
        Ok(key)
    }

    /// Like [`Target::absolute_path`], for a resource that is not a directory (a file, a
    /// symlink): a key ending in `/` names a directory and is refused too, naming the resource
    /// type it cannot be.
    pub fn absolute_non_directory_path(&self) -> Result<&str> {
        let key = self.absolute_path()?;
        if key.ends_with('/') {
            return Err(Error::invalid(format!(
                "{}: the key {key:?} names a directory, not a {}",
                self.id, self.resource_type
            )));
        }
        Ok(key)
    }

    /// Decodes one top-level attribute, `None` when absent or `null`.
    ///
    /// Meant for [`Adaptor::delete`], which may run for a purged resource whose remaining
    /// attributes no longer form a complete desired state.
    pub fn attribute<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>> {
        let invalid = |msg: String| Error::invalid(format!("{}: invalid attributes: `{name}`: {msg}", self.id));
        let mut doc: serde_json::Map<String, Value> =
            json::decode(&self.attributes_json).map_err(|e| Error::invalid(e.describe(&format!("{}: invalid attributes", self.id))))?;
        match doc.remove(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => serde_json::from_value(v).map(Some).map_err(|e| invalid(e.to_string())),
        }
    }
}

/// One difference between the current and the desired state; values are JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The attribute that differs, e.g. `content` or `mode`.
    pub field: String,
    /// The current value; `None` when the resource or the field does not exist.
    pub current: Option<Value>,
    /// The desired value; `None` when the field is to be removed.
    pub desired: Option<Value>,
}

impl Change {
    pub fn new(field: impl Into<String>, current: Option<Value>, desired: Option<Value>) -> Self {
        Change {
            field: field.into(),
            current,
            desired,
        }
    }
}

/// Builds a change list, recording only the fields that differ.
///
/// ```
/// use orc_sdk::Changes;
/// let current_mode = Some("0600");
/// let changes = Changes::new()
///     .compare("mode", current_mode.as_ref(), &"0644")
///     .compare("owner", Some(&"root"), &"root")
///     .into_vec();
/// assert_eq!(changes.len(), 1);
/// assert_eq!(changes[0].field, "mode");
/// assert_eq!(changes[0].current, Some(serde_json::json!("0600")));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Changes {
    changes: Vec<Change>,
}

impl Changes {
    pub fn new() -> Self {
        Changes::default()
    }

    /// Records `field` when `current` (`None`: the resource or field does not exist) differs
    /// from `desired`. Values are compared as JSON.
    #[must_use]
    pub fn compare<T: Serialize + ?Sized>(self, field: &str, current: Option<&T>, desired: &T) -> Self {
        self.compare_optional(field, current, Some(desired))
    }

    /// Like [`Changes::compare`], but a `None` desired value means the field is unmanaged:
    /// nothing is recorded, whatever the current value.
    #[must_use]
    pub fn compare_managed<T: Serialize + ?Sized>(self, field: &str, current: Option<&T>, desired: Option<&T>) -> Self {
        match desired {
            Some(d) => self.compare(field, current, d),
            None => self,
        }
    }

    /// Records `field` when `current` differs from `desired`, where `None` on either side means
    /// absent (a `None` desired value is a removal).
    #[must_use]
    pub fn compare_optional<T: Serialize + ?Sized>(mut self, field: &str, current: Option<&T>, desired: Option<&T>) -> Self {
        let current = current.map(to_value);
        let desired = desired.map(to_value);
        if current != desired {
            self.changes.push(Change::new(field, current, desired));
        }
        self
    }

    /// Records `owner` and `group` where the managed ones (`None`: unmanaged) differ from
    /// `current` (`None`: the path is still to be made). A name and its numeric id are the same
    /// owner; a change shows the name when the node has one.
    #[must_use]
    pub fn compare_ownership(mut self, current: Option<&crate::node::Ownership>, owner: Option<&str>, group: Option<&str>) -> Self {
        if let Some(user) = owner
            && !current.is_some_and(|c| c.is_user(user))
        {
            self.changes
                .push(Change::new("owner", current.map(|c| c.user_shown().into()), Some(user.into())));
        }
        if let Some(group) = group
            && !current.is_some_and(|c| c.is_group(group))
        {
            self.changes
                .push(Change::new("group", current.map(|c| c.group_shown().into()), Some(group.into())));
        }
        self
    }

    /// Records a change unconditionally, e.g. with summarised values the plugin compared itself.
    #[must_use]
    pub fn push(mut self, change: Change) -> Self {
        self.changes.push(change);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    pub fn len(&self) -> usize {
        self.changes.len()
    }

    pub fn into_vec(self) -> Vec<Change> {
        self.changes
    }
}

impl From<Changes> for Vec<Change> {
    fn from(c: Changes) -> Self {
        c.changes
    }
}

/// Whether `changes` has one for `field`; handy in [`Adaptor::apply`].
pub fn has_change(changes: &[Change], field: &str) -> bool {
    changes.iter().any(|c| c.field == field)
}

/// Serialises a value for a change list. Serialising plain data to a `Value` cannot fail;
/// a type whose `Serialize` does fail (a map with non-string keys) is shown as its error.
pub fn to_value<T: Serialize + ?Sized>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or_else(|e| Value::String(format!("<unserialisable: {e}>")))
}

/// A smart adaptor, with the plugin's own types for the desired and current state.
///
/// The host calls `read`, then `diff`, then (when there are changes and it is not a dryrun)
/// `apply`, on one instance; `delete` for a resource marked for removal. Every call decodes
/// the attributes into `Desired` afresh, so keep that type cheap to decode.
pub trait Adaptor {
    /// The desired attributes. Use `#[serde(deny_unknown_fields)]` to catch typos.
    type Desired: DeserializeOwned;
    /// The current state, as `read` reports it; the host hands it back to `diff` and `apply`.
    type Current: Serialize + DeserializeOwned;

    /// The current state on the device; `None` when the resource does not exist.
    fn read(target: &Target, desired: &Self::Desired) -> Result<Option<Self::Current>>;

    /// The changes that would bring `current` to `desired`; empty when it is already right.
    fn diff(target: &Target, desired: &Self::Desired, current: Option<&Self::Current>) -> Result<Vec<Change>>;

    /// Enforces the desired state; returns messages for the action log.
    fn apply(target: &Target, desired: &Self::Desired, current: Option<&Self::Current>, changes: &[Change]) -> Result<Vec<String>>;

    /// Removes a resource marked for removal; returns messages for the action log. Use
    /// [`Target::attribute`] for options such as a recursive purge.
    fn delete(target: &Target, current: &Self::Current) -> Result<Vec<String>> {
        let _ = current;
        Err(Error::invalid(format!(
            "{}: purge not supported by {}",
            target.id, target.resource_type
        )))
    }
}

/// Decodes the current state the host hands back. It came from this plugin's own `read`, so a
/// failure is a plugin defect (or a state written by another plugin version), not bad input.
fn decode_current<T: DeserializeOwned>(target: &Target, text: &str) -> Result<T> {
    json::decode(text).map_err(|e| Error::permanent(e.describe(&format!("{}: current state does not match this plugin", target.id))))
}

fn encode<T: Serialize>(target: &Target, what: &str, value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| Error::permanent(format!("{}: cannot encode {what}: {e}", target.id)))
}

/// The calls of [`Adaptor`] on JSON text, as the WIT interface has them. The export glue and
/// native tests use these; a plugin author does not need them.
pub mod raw {
    use super::*;

    pub fn read<A: Adaptor>(target: &Target) -> Result<Option<String>> {
        let desired = target.attributes::<A::Desired>()?;
        match A::read(target, &desired)? {
            Some(current) => encode(target, "the current state", &current).map(Some),
            None => Ok(None),
        }
    }

    pub fn diff<A: Adaptor>(target: &Target, current: Option<&str>) -> Result<Vec<Change>> {
        let desired = target.attributes::<A::Desired>()?;
        let current = current.map(|c| decode_current::<A::Current>(target, c)).transpose()?;
        A::diff(target, &desired, current.as_ref())
    }

    pub fn apply<A: Adaptor>(target: &Target, current: Option<&str>, changes: &[Change]) -> Result<Vec<String>> {
        let desired = target.attributes::<A::Desired>()?;
        let current = current.map(|c| decode_current::<A::Current>(target, c)).transpose()?;
        A::apply(target, &desired, current.as_ref(), changes)
    }

    pub fn delete<A: Adaptor>(target: &Target, current: &str) -> Result<Vec<String>> {
        let current = decode_current::<A::Current>(target, current)?;
        A::delete(target, &current)
    }
}

#[cfg(feature = "adaptor")]
mod export {
    use super::{Adaptor, Change, Target, raw};
    use crate::bindings::adaptor::exports::orc::plugin::resource_adaptor as wit;
    use crate::bindings::types;

    fn target(t: wit::Target) -> Target {
        Target {
            id: t.id,
            resource_type: t.resource_type,
            node: t.node,
            key: t.key,
            attributes_json: t.attributes,
        }
    }

    fn change_to_wit(c: Change) -> types::Change {
        types::Change {
            field: c.field,
            current: c.current.map(|v| v.to_string()),
            desired: c.desired.map(|v| v.to_string()),
        }
    }

    /// The host hands back the changes `diff` produced; a value that is not JSON (from some other
    /// producer) is kept as a JSON string rather than refused.
    fn change_from_wit(c: types::Change) -> Change {
        let value = |s: String| serde_json::from_str(&s).unwrap_or(serde_json::Value::String(s));
        Change {
            field: c.field,
            current: c.current.map(value),
            desired: c.desired.map(value),
        }
    }

    impl<A: Adaptor> wit::Guest for A {
        fn read(t: wit::Target) -> Result<Option<String>, types::Error> {
            crate::panic::install_hook();
            Ok(raw::read::<A>(&target(t))?)
        }

        fn diff(t: wit::Target, current: Option<String>) -> Result<Vec<types::Change>, types::Error> {
            crate::panic::install_hook();
            Ok(raw::diff::<A>(&target(t), current.as_deref())?
                .into_iter()
                .map(change_to_wit)
                .collect())
        }

        fn apply(t: wit::Target, current: Option<String>, changes: Vec<types::Change>) -> Result<Vec<String>, types::Error> {
            crate::panic::install_hook();
            let changes: Vec<Change> = changes.into_iter().map(change_from_wit).collect();
            Ok(raw::apply::<A>(&target(t), current.as_deref(), &changes)?)
        }

        fn delete(t: wit::Target, current: String) -> Result<Vec<String>, types::Error> {
            crate::panic::install_hook();
            Ok(raw::delete::<A>(&target(t), &current)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use serde::Deserialize;
    use serde_json::json;

    fn target(attributes: &str) -> Target {
        Target {
            id: "thing[n1,k]".into(),
            resource_type: "thing".into(),
            node: "n1".into(),
            key: "k".into(),
            attributes_json: attributes.into(),
        }
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Desired {
        size: u32,
    }

    #[derive(Debug, Serialize, Deserialize)]
    struct Current {
        size: u32,
    }

    struct Thing;

    impl Adaptor for Thing {
        type Desired = Desired;
        type Current = Current;

        fn read(_: &Target, _: &Desired) -> Result<Option<Current>> {
            Ok(Some(Current { size: 1 }))
        }

        fn diff(_: &Target, desired: &Desired, current: Option<&Current>) -> Result<Vec<Change>> {
            Ok(Changes::new().compare("size", current.map(|c| &c.size), &desired.size).into_vec())
        }

        fn apply(_: &Target, _: &Desired, _: Option<&Current>, changes: &[Change]) -> Result<Vec<String>> {
            Ok(changes.iter().map(|c| format!("set {}", c.field)).collect())
        }
    }

    #[test]
    fn raw_calls_round_trip_json() {
        let t = target(r#"{"size":2}"#);
        assert_eq!(raw::read::<Thing>(&t).unwrap().as_deref(), Some(r#"{"size":1}"#));
        let changes = raw::diff::<Thing>(&t, Some(r#"{"size":1}"#)).unwrap();
        assert_eq!(changes, vec![Change::new("size", Some(json!(1)), Some(json!(2)))]);
        assert!(raw::diff::<Thing>(&t, Some(r#"{"size":2}"#)).unwrap().is_empty());
        assert_eq!(raw::diff::<Thing>(&t, None).unwrap()[0].current, None);
        assert_eq!(raw::apply::<Thing>(&t, None, &changes).unwrap(), vec!["set size"]);
    }

    #[test]
    fn attribute_errors_are_invalid_input_naming_resource_and_field() {
        let e = raw::read::<Thing>(&target(r#"{"size":"big"}"#)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert_eq!(
            e.message(),
            "thing[n1,k]: invalid attributes: `size`: invalid type: string \"big\", expected u32"
        );
        let e = raw::read::<Thing>(&target(r#"{"size":1,"colour":"red"}"#)).unwrap_err();
        assert_eq!(
            e.message(),
            "thing[n1,k]: invalid attributes: unknown field `colour`, expected `size`"
        );
    }

    #[test]
    fn a_foreign_current_state_is_a_permanent_error() {
        let e = raw::diff::<Thing>(&target(r#"{"size":2}"#), Some(r#"{"bytes":1}"#)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Permanent);
        assert!(e.message().contains("current state does not match this plugin"), "{e}");
    }

    #[test]
    fn delete_defaults_to_unsupported() {
        let e = raw::delete::<Thing>(&target(r#"{"size":2}"#), r#"{"size":1}"#).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert_eq!(e.message(), "thing[n1,k]: purge not supported by thing");
    }

    #[test]
    fn single_attributes_decode_leniently() {
        let t = target(r#"{"purge_recursive":true,"other":1}"#);
        assert_eq!(t.attribute::<bool>("purge_recursive").unwrap(), Some(true));
        assert_eq!(t.attribute::<bool>("absent").unwrap(), None);
        let e = t.attribute::<bool>("other").unwrap_err();
        assert_eq!(
            e.message(),
            "thing[n1,k]: invalid attributes: `other`: invalid type: integer `1`, expected a boolean"
        );
    }

    fn keyed(resource_type: &str, key: &str) -> Target {
        Target {
            id: format!("{resource_type}[n1,{key}]"),
            resource_type: resource_type.into(),
            node: "n1".into(),
            key: key.into(),
            attributes_json: "{}".into(),
        }
    }

    #[test]
    fn an_absolute_path_key_is_handed_back_as_is() {
        assert_eq!(keyed("directory", "/srv/www").absolute_path().unwrap(), "/srv/www");
        assert_eq!(keyed("directory", "/srv/www/").absolute_path().unwrap(), "/srv/www/");
        assert_eq!(keyed("directory", "/").absolute_path().unwrap(), "/");
        assert_eq!(keyed("file", "/etc/motd").absolute_non_directory_path().unwrap(), "/etc/motd");
    }

    #[test]
    fn a_relative_key_is_invalid_input_naming_the_resource_and_the_key() {
        for key in ["etc/motd", "", "./x", "~/x"] {
            for check in [Target::absolute_path, Target::absolute_non_directory_path] {
                let e = check(&keyed("file", key)).unwrap_err();
                assert_eq!(e.kind(), ErrorKind::InvalidInput);
                assert_eq!(
                    e.message(),
                    format!("file[n1,{key}]: the key must be an absolute path, got {key:?}")
                );
            }
        }
    }

    #[test]
    fn a_key_ending_in_a_slash_names_a_directory_not_a_file_or_link() {
        let e = keyed("symlink", "/srv/current/").absolute_non_directory_path().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert_eq!(
            e.message(),
            r#"symlink[n1,/srv/current/]: the key "/srv/current/" names a directory, not a symlink"#
        );
        let e = keyed("file", "/").absolute_non_directory_path().unwrap_err();
        assert_eq!(e.message(), r#"file[n1,/]: the key "/" names a directory, not a file"#);
    }

    #[test]
    fn changes_record_only_differences() {
        let changes = Changes::new()
            .compare("a", Some(&1), &1)
            .compare("b", None, &"x")
            .compare_managed::<str>("c", Some("old"), None)
            .compare_optional::<u8>("d", Some(&1), None);
        assert_eq!(changes.len(), 2);
        let v = changes.into_vec();
        assert_eq!(v[0], Change::new("b", None, Some(json!("x"))));
        assert_eq!(v[1], Change::new("d", Some(json!(1)), None));
        assert!(has_change(&v, "d"));
        assert!(!has_change(&v, "a"));
    }
}
