//! What changed between two intent versions, resource by resource: added, removed, and for each
//! resource in both, every differing field — `adaptor`, `purged`, `requires`, and attributes down
//! to the leaf (`attributes/mode`, `attributes/env/PATH`; arrays compare whole).

use std::collections::{BTreeSet, HashMap};

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::intent::{Intent, ResourceSpec};

/// The difference from one version (`from`) to another (`to`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct IntentDiff {
    pub from: i64,
    pub to: i64,
    /// Resource ids only in `to`.
    pub added: Vec<String>,
    /// Resource ids only in `from`.
    pub removed: Vec<String>,
    /// Resources in both whose desired state or dependencies differ.
    pub changed: Vec<ResourceDiff>,
    /// How many resources are the same in both.
    pub unchanged: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ResourceDiff {
    pub resource: String,
    pub fields: Vec<FieldDiff>,
}

/// One differing field; `from` / `to` absent: the field is not there on that side.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct FieldDiff {
    /// `adaptor`, `purged`, `requires` or `attributes/<path>` (`/`-separated, `~` and `/` in keys
    /// escaped as in a JSON pointer).
    pub field: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<Value>,
}

/// Compares two versions; resources keep the order of the version they come from.
pub fn diff(from_version: i64, from: &Intent, to_version: i64, to: &Intent) -> IntentDiff {
    let old: HashMap<String, &ResourceSpec> = from.resources.iter().map(|r| (r.id.to_string(), r)).collect();
    let new_ids: BTreeSet<String> = to.resources.iter().map(|r| r.id.to_string()).collect();
    let mut result = IntentDiff {
        from: from_version,
        to: to_version,
        added: Vec::new(),
        removed: from
            .resources
            .iter()
            .map(|r| r.id.to_string())
            .filter(|id| !new_ids.contains(id))
            .collect(),
        changed: Vec::new(),
        unchanged: 0,
    };
    for r in &to.resources {
        let id = r.id.to_string();
        let Some(before) = old.get(&id) else {
            result.added.push(id);
            continue;
        };
        let fields = resource_fields(before, r);
        if fields.is_empty() {
            result.unchanged += 1;
        } else {
            result.changed.push(ResourceDiff { resource: id, fields });
        }
    }
    result
}

fn resource_fields(from: &ResourceSpec, to: &ResourceSpec) -> Vec<FieldDiff> {
    let mut fields = Vec::new();
    let mut differ = |field: &str, a: Value, b: Value| {
        if a != b {
            fields.push(FieldDiff {
                field: field.to_string(),
                from: Some(a),
                to: Some(b),
            });
        }
    };
    differ(
        "adaptor",
        Value::String(from.adaptor.to_string()),
        Value::String(to.adaptor.to_string()),
    );
    differ("purged", Value::Bool(from.purged), Value::Bool(to.purged));
    let requires = |r: &ResourceSpec| {
        let set: BTreeSet<String> = r.requires.iter().map(ToString::to_string).collect();
        Value::from(set.into_iter().collect::<Vec<_>>())
    };
    differ("requires", requires(from), requires(to));
    if from.attributes != to.attributes {
        let (a, b) = (from.attributes.to_value(), to.attributes.to_value());
        let first = fields.len();
        values(&mut fields, "attributes".to_string(), Some(&a), Some(&b));
        // A sensitive value (on either side) is said to differ, never shown.
        let redacted = || Some(Value::String(crate::intent::REDACTED.into()));
        for f in &mut fields[first..] {
            let pointer = &f.field["attributes".len()..];
            if from.is_sensitive(pointer) || to.is_sensitive(pointer) {
                f.from = f.from.as_ref().and_then(|_| redacted());
                f.to = f.to.as_ref().and_then(|_| redacted());
            }
        }
    }
    fields
}

/// Every leaf where `a` and `b` differ; objects are walked key by key (in key order).
fn values(out: &mut Vec<FieldDiff>, path: String, a: Option<&Value>, b: Option<&Value>) {
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for key in keys {
                let escaped = key.replace('~', "~0").replace('/', "~1");
                values(out, format!("{path}/{escaped}"), x.get(key), y.get(key));
            }
        }
        (a, b) if a != b => out.push(FieldDiff {
            field: path,
            from: a.cloned(),
            to: b.cloned(),
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn intent(resources: Value) -> Intent {
        Intent::parse(json!({ "resources": resources }).to_string().as_bytes()).unwrap()
    }

    #[test]
    fn a_sensitive_value_is_said_to_differ_and_never_shown() {
        let a = intent(json!([
            { "id": "file[local,/a]", "adaptor": "file@0.1.0", "sensitive": ["/secret"],
              "attributes": { "secret": {"k": "old"}, "mode": "0600" } },
        ]));
        let b = intent(json!([
            { "id": "file[local,/a]", "adaptor": "file@0.1.0",
              "attributes": { "secret": {"k": "new", "j": "added"}, "mode": "0600" } },
        ]));
        for d in [diff(1, &a, 2, &b), diff(2, &b, 1, &a)] {
            let fields: Vec<_> = d.changed[0]
                .fields
                .iter()
                .map(|f| (f.field.as_str(), f.from.clone(), f.to.clone()))
                .collect();
            let r = || Some(json!("<redacted>"));
            let (j_from, j_to) = if d.from == 1 { (None, r()) } else { (r(), None) };
            assert_eq!(
                fields,
                vec![("attributes/secret/j", j_from, j_to), ("attributes/secret/k", r(), r())],
                "{d:?}"
            );
        }
        assert!(!serde_json::to_string(&diff(1, &a, 2, &b)).unwrap().contains("old"));
    }

    #[test]
    fn reports_added_removed_and_each_changed_leaf() {
        let a = intent(json!([
            { "id": "file[local,/a]", "adaptor": "file@0.1.0", "attributes": { "content": "x", "meta": { "mode": "0644", "a/b": 1 } } },
            { "id": "file[local,/gone]", "adaptor": "file@0.1.0" },
            { "id": "file[local,/same]", "adaptor": "file@0.1.0", "attributes": { "content": "s" } },
        ]));
        let b = intent(json!([
            { "id": "file[local,/same]", "adaptor": "file@0.1.0", "attributes": { "content": "s" } },
            { "id": "file[local,/a]", "adaptor": "file@0.2.0", "purged": true, "requires": ["file[local,/new]"],
              "attributes": { "content": "x", "meta": { "mode": "0600", "owner": "root" } } },
            { "id": "file[local,/new]", "adaptor": "file@0.1.0" },
        ]));
        let d = diff(1, &a, 2, &b);
        assert_eq!((d.from, d.to, d.unchanged), (1, 2, 1));
        assert_eq!(d.added, vec!["file[local,/new]"]);
        assert_eq!(d.removed, vec!["file[local,/gone]"]);
        assert_eq!(d.changed.len(), 1);
        let fields: Vec<(&str, Option<&Value>, Option<&Value>)> = d.changed[0]
            .fields
            .iter()
            .map(|f| (f.field.as_str(), f.from.as_ref(), f.to.as_ref()))
            .collect();
        assert_eq!(
            fields,
            vec![
                ("adaptor", Some(&json!("file@0.1.0")), Some(&json!("file@0.2.0"))),
                ("purged", Some(&json!(false)), Some(&json!(true))),
                ("requires", Some(&json!([])), Some(&json!(["file[local,/new]"]))),
                ("attributes/meta/a~1b", Some(&json!(1)), None),
                ("attributes/meta/mode", Some(&json!("0644")), Some(&json!("0600"))),
                ("attributes/meta/owner", None, Some(&json!("root"))),
            ]
        );
    }

    #[test]
    fn a_version_against_itself_is_all_unchanged() {
        let a = intent(json!([{ "id": "file[local,/a]", "adaptor": "file@0.1.0", "attributes": { "v": [1, 2] } }]));
        let d = diff(3, &a, 3, &a);
        assert!(d.added.is_empty() && d.removed.is_empty() && d.changed.is_empty());
        assert_eq!(d.unchanged, 1);
    }
}
