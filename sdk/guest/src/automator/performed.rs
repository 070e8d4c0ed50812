//! Performed records: how the default [`Automator::check`](super::Automator::check) knows that a
//! task has taken effect when the automator cannot look at the node.
//!
//! After every successful `perform`, the export glue records the task's
//! [`inputs_digest`](super::Task::inputs_digest) in the plugin's `kv` under a key for (cluster,
//! service, node, action). [`check`] reports no change when the record holds the task's digest,
//! and one change `performed` (recorded digest, or none → the task's digest) otherwise: a task
//! never performed, or performed with another configuration or layout, is performed again.
//!
//! The records follow the service's lifecycle on the node:
//! - a successful `remove` forgets every record of that (cluster, service, node), then records
//!   itself, so an install after a removal is performed again;
//! - `start` forgets `stop`'s record and `stop` forgets `start`'s, so a stopped service is
//!   started again (and a started one stopped again);
//! - any other action forgets `remove`'s record, so a reinstalled service can be removed again.
//!
//! Keys are `orc-sdk/performed/<cluster>/<service>/<node>/<action>`, each part with `%` and `/`
//! percent-encoded. The plugin's own keys should not start with `orc-sdk/`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::{Action, Task};
use crate::solver::Placement;
use crate::{Change, Error, ErrorKind, Result};

/// The field of the change the default check reports.
pub const FIELD: &str = "performed";

/// The prefix of every key the SDK writes in the plugin's `kv`.
const PREFIX: &str = "orc-sdk/performed/";

/// `sha256:<hex>` of the task's inputs: `{"action", "config", "layout"}` as canonical JSON
/// (object keys sorted, no whitespace; the layout as placements sorted by node), so the same
/// configuration sent with other whitespace or key order has the same digest.
///
/// The host calls `check` and then `perform` on one instance with the same task: the last digest
/// is kept (per instance) and handed out again for the same inputs, so a task is parsed,
/// canonicalised and hashed once, not twice.
pub fn inputs_digest(action: Action, config: &str, layout: &[Placement]) -> Result<String> {
    LAST_DIGEST.with(|last| {
        if let Some((a, c, l, digest)) = &*last.borrow()
            && (*a, c.as_str(), l.as_slice()) == (action, config, layout)
        {
            return Ok(digest.clone());
        }
        let digest = compute_inputs_digest(action, config, layout)?;
        *last.borrow_mut() = Some((action, config.to_string(), layout.to_vec(), digest.clone()));
        Ok(digest)
    })
}

/// The inputs of the last digest computed, and that digest.
type LastDigest = Option<(Action, String, Vec<Placement>, String)>;

thread_local! {
    static LAST_DIGEST: std::cell::RefCell<LastDigest> = const { std::cell::RefCell::new(None) };
}

fn compute_inputs_digest(action: Action, config: &str, layout: &[Placement]) -> Result<String> {
    let config: Value = serde_json::from_str(config).map_err(|e| Error::invalid(format!("invalid configuration: not valid JSON: {e}")))?;
    let mut placements: Vec<&Placement> = layout.iter().collect();
    placements.sort_by(|a, b| a.node.cmp(&b.node));
    let layout = Value::Array(
        placements
            .into_iter()
            .map(|p| serde_json::json!({ "node": p.node, "services": p.services }))
            .collect(),
    );
    let inputs = serde_json::json!({ "action": action.as_str(), "config": config, "layout": layout });
    let mut text = String::new();
    canonical(&inputs, &mut text);
    let hash: [u8; 32] = Sha256::digest(text.as_bytes()).into();
    Ok(format!("sha256:{}", hash.iter().map(|b| format!("{b:02x}")).collect::<String>()))
}

/// Writes `value` as JSON with object keys sorted, whatever map type serde_json was built with.
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Where performed records are kept: the plugin's `kv` on the host ([`HostKv`]), a map in tests.
// Written only by the export glue (feature `automator`).
#[cfg_attr(not(feature = "automator"), allow(dead_code))]
pub(crate) trait RecordStore {
    fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>>;
    fn set(&mut self, key: &str, value: &[u8]) -> Result<()>;
    fn delete(&mut self, key: &str) -> Result<bool>;
    fn list_keys(&mut self, prefix: &str) -> Result<Vec<String>>;
}

/// The plugin's `kv` (capability `kv`).
pub(crate) struct HostKv;

impl RecordStore for HostKv {
    fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>> {
        crate::kv::get(key)
    }
    fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        crate::kv::set(key, value)
    }
    fn delete(&mut self, key: &str) -> Result<bool> {
        crate::kv::delete(key)
    }
    fn list_keys(&mut self, prefix: &str) -> Result<Vec<String>> {
        crate::kv::list_keys(prefix)
    }
}

/// A stored record.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    digest: String,
}

/// The default check: no change when the task's inputs were the last performed for its
/// (cluster, service, node, action); else one change [`FIELD`], recorded digest (none when
/// never performed or forgotten) → [`Task::inputs_digest`]. Reads the plugin's `kv`.
pub fn check<C>(task: &Task<C>) -> Result<Vec<Change>> {
    check_in(&mut HostKv, &Performed::of(task))
}

/// What the default check says when the automator turned records off
/// ([`Automator::PERFORMED_RECORDS`](super::Automator::PERFORMED_RECORDS) `false`) but kept the
/// default check.
pub(crate) fn no_records<C>(task: &Task<C>) -> Error {
    Error::invalid(format!(
        "{}/{} on {}: this automator cannot check `{}`: it turned the SDK's performed records off, so \
         it must implement `Automator::check` (or keep the records and request capability `kv`)",
        task.cluster, task.service, task.node, task.action
    ))
}

/// The identity and inputs of one performed task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Performed {
    cluster: String,
    service: String,
    node: String,
    action: Action,
    digest: String,
}

impl Performed {
    pub(crate) fn of<C>(task: &Task<C>) -> Performed {
        Performed {
            cluster: task.cluster.clone(),
            service: task.service.clone(),
            node: task.node.clone(),
            action: task.action,
            digest: task.inputs_digest.clone(),
        }
    }

    /// `orc-sdk/performed/<cluster>/<service>/<node>/`.
    fn prefix(&self) -> String {
        format!(
            "{PREFIX}{}/{}/{}/",
            escape(&self.cluster),
            escape(&self.service),
            escape(&self.node)
        )
    }

    fn key(&self, action: Action) -> String {
        format!("{}{}", self.prefix(), action.as_str())
    }

    fn who(&self) -> String {
        format!("{}/{} on {}", self.cluster, self.service, self.node)
    }

    /// Records a successful `perform`, keeping the records right across the lifecycle (see the
    /// module's documentation).
    #[cfg_attr(not(feature = "automator"), allow(dead_code))]
    pub(crate) fn remember(&self, store: &mut impl RecordStore) -> Result<()> {
        let kv = |e: Error| kv_error(e, &self.who(), &format!("recording that `{}` was performed", self.action));
        match self.action {
            Action::Remove => {
                for key in store.list_keys(&self.prefix()).map_err(kv)? {
                    store.delete(&key).map_err(kv)?;
                }
            }
            other => {
                store.delete(&self.key(Action::Remove)).map_err(kv)?;
                let opposite = match other {
                    Action::Start => Some(Action::Stop),
                    Action::Stop => Some(Action::Start),
                    _ => None,
                };
                if let Some(opposite) = opposite {
                    store.delete(&self.key(opposite)).map_err(kv)?;
                }
            }
        }
        let record = serde_json::to_vec(&Record {
            digest: self.digest.clone(),
        })
        .map_err(|e| Error::permanent(format!("{}: cannot encode the performed record: {e}", self.who())))?;
        store.set(&self.key(self.action), &record).map_err(kv)
    }
}

pub(crate) fn check_in(store: &mut impl RecordStore, task: &Performed) -> Result<Vec<Change>> {
    let key = task.key(task.action);
    let stored = store
        .get(&key)
        .map_err(|e| kv_error(e, &task.who(), &format!("reading the performed record of `{}`", task.action)))?;
    let recorded = stored.map(|bytes| match serde_json::from_slice::<Record>(&bytes) {
        Ok(r) => r.digest,
        // Not written by this SDK: shown as is, and replaced by the next perform.
        Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
    });
    if recorded.as_deref() == Some(task.digest.as_str()) {
        return Ok(Vec::new());
    }
    Ok(vec![Change::new(
        FIELD,
        recorded.map(Value::String),
        Some(Value::String(task.digest.clone())),
    )])
}

/// A `kv` failure, said plainly when the host refused `kv`.
fn kv_error(e: Error, who: &str, doing: &str) -> Error {
    if e.kind() == ErrorKind::Denied {
        Error::denied(format!(
            "{who}: {doing}: the SDK's default check keeps performed records in the plugin's kv, which the host \
             refused ({}): request capability `kv` in the plugin's manifest or implement `Automator::check`",
            e.message()
        ))
    } else {
        e.context(format_args!("{who}: {doing}"))
    }
}

/// Percent-encodes `%` and `/`, so a name cannot reach into another record's key.
fn escape(part: &str) -> String {
    part.replace('%', "%25").replace('/', "%2F")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Default)]
    struct Map(BTreeMap<String, Vec<u8>>, bool);

    impl RecordStore for Map {
        fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>> {
            if self.1 {
                return Err(Error::denied("capability `kv` not granted"));
            }
            Ok(self.0.get(key).cloned())
        }
        fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
            self.0.insert(key.to_string(), value.to_vec());
            Ok(())
        }
        fn delete(&mut self, key: &str) -> Result<bool> {
            Ok(self.0.remove(key).is_some())
        }
        fn list_keys(&mut self, prefix: &str) -> Result<Vec<String>> {
            Ok(self.0.keys().filter(|k| k.starts_with(prefix)).cloned().collect())
        }
    }

    fn task(node: &str, action: Action, config: &str) -> Performed {
        Performed {
            cluster: "c1".into(),
            service: "web".into(),
            node: node.into(),
            action,
            digest: inputs_digest(action, config, &[Placement::new(node, ["web"])]).unwrap(),
        }
    }

    fn holds(store: &mut Map, t: &Performed) -> bool {
        check_in(store, t).unwrap().is_empty()
    }

    #[test]
    fn digests_ignore_whitespace_and_key_order() {
        let layout = [Placement::new("n2", ["db"]), Placement::new("n1", ["web"])];
        let a = inputs_digest(Action::Start, r#"{"a":1,"b":{"y":2,"x":[1,2]}}"#, &layout).unwrap();
        let b = inputs_digest(
            Action::Start,
            "{ \"b\": {\"x\": [1, 2], \"y\": 2}, \"a\": 1 }",
            &[layout[1].clone(), layout[0].clone()],
        )
        .unwrap();
        assert_eq!(a, b);
        assert!(a.starts_with("sha256:") && a.len() == 7 + 64, "{a}");
        assert_ne!(a, inputs_digest(Action::Stop, r#"{"a":1,"b":{"y":2,"x":[1,2]}}"#, &layout).unwrap());
        assert_ne!(
            a,
            inputs_digest(Action::Start, r#"{"a":2,"b":{"y":2,"x":[1,2]}}"#, &layout).unwrap()
        );
        assert_ne!(
            a,
            inputs_digest(Action::Start, r#"{"a":1,"b":{"y":2,"x":[1,2]}}"#, &layout[..1]).unwrap()
        );
    }

    /// The digest kept for `check` → `perform` is handed out only for the very same inputs: the
    /// same as computed afresh, and never for inputs that differ in any part.
    #[test]
    fn the_kept_digest_is_the_one_the_inputs_have() {
        let layout = [Placement::new("n1", ["web"])];
        let inputs = [
            (Action::Start, r#"{"a":1}"#, &layout[..]),
            (Action::Start, r#"{"a":1}"#, &layout[..]),
            (Action::Stop, r#"{"a":1}"#, &layout[..]),
            (Action::Stop, r#"{"a":2}"#, &layout[..]),
            (Action::Stop, r#"{"a":2}"#, &[][..]),
            (Action::Start, r#"{"a":1}"#, &layout[..]),
        ];
        for (action, config, layout) in inputs {
            assert_eq!(
                inputs_digest(action, config, layout).unwrap(),
                compute_inputs_digest(action, config, layout).unwrap(),
                "{action} {config} {layout:?}"
            );
        }
    }

    #[test]
    fn a_task_holds_once_performed_with_the_same_inputs() {
        let mut store = Map::default();
        let install = task("n1", Action::Install, r#"{"v":1}"#);
        let changes = check_in(&mut store, &install).unwrap();
        assert_eq!(changes, vec![Change::new(FIELD, None, Some(Value::String(install.digest.clone())))]);
        install.remember(&mut store).unwrap();
        assert!(holds(&mut store, &install));
        // Another configuration: the recorded digest is the current value.
        let changed = task("n1", Action::Install, r#"{"v":2}"#);
        let changes = check_in(&mut store, &changed).unwrap();
        assert_eq!(changes[0].current, Some(Value::String(install.digest.clone())));
        assert_eq!(changes[0].desired, Some(Value::String(changed.digest.clone())));
        // Other nodes and actions have their own records.
        assert!(!holds(&mut store, &task("n2", Action::Install, r#"{"v":1}"#)));
        assert!(!holds(&mut store, &task("n1", Action::Configure, r#"{"v":1}"#)));
    }

    #[test]
    fn records_follow_the_lifecycle() {
        let mut store = Map::default();
        let config = r#"{"v":1}"#;
        let [install, start, stop, remove] = [Action::Install, Action::Start, Action::Stop, Action::Remove].map(|a| task("n1", a, config));
        let other_node = task("n2", Action::Install, config);
        for t in [&install, &start, &other_node] {
            t.remember(&mut store).unwrap();
        }
        stop.remember(&mut store).unwrap();
        assert!(holds(&mut store, &stop) && !holds(&mut store, &start) && holds(&mut store, &install));
        start.remember(&mut store).unwrap();
        assert!(holds(&mut store, &start) && !holds(&mut store, &stop));
        remove.remember(&mut store).unwrap();
        assert!(holds(&mut store, &remove));
        assert!(!holds(&mut store, &install) && !holds(&mut store, &start));
        assert!(holds(&mut store, &other_node), "another node's records stay");
        install.remember(&mut store).unwrap();
        assert!(!holds(&mut store, &remove), "a reinstall forgets the removal");
    }

    #[test]
    fn names_cannot_reach_into_other_keys() {
        let mut a = task("n1", Action::Install, "{}");
        a.service = "web/n9".into();
        assert_eq!(a.key(Action::Install), "orc-sdk/performed/c1/web%2Fn9/n1/install");
        a.node = "50%".into();
        assert_eq!(a.prefix(), "orc-sdk/performed/c1/web%2Fn9/50%25/");
    }

    #[test]
    fn a_refused_kv_says_what_to_do() {
        let mut store = Map(BTreeMap::new(), true);
        let e = check_in(&mut store, &task("n1", Action::Start, "{}")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Denied);
        assert!(
            e.message().starts_with("c1/web on n1: reading the performed record of `start`: "),
            "{}",
            e.message()
        );
        assert!(e.message().contains("request capability `kv`") && e.message().contains("implement `Automator::check`"));
    }

    #[test]
    fn foreign_records_are_changes_not_errors() {
        let mut store = Map::default();
        let t = task("n1", Action::Start, "{}");
        store.set(&t.key(Action::Start), b"garbage").unwrap();
        assert_eq!(check_in(&mut store, &t).unwrap()[0].current, Some(Value::String("garbage".into())));
    }
}
