//! JSON shapes request bodies must have, and the one JSON merge patch. serde's derived
//! `Deserialize` takes a struct from a JSON object and also from an array of its fields in order;
//! the OpenAPI document allows only the object, so a body or a field holding a struct is decoded
//! through these. [`merge_patch`] is what every settings, configuration and cluster change
//! applies, in every layer.

use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, Error};
use serde_json::Value;

/// What a JSON value is, for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A struct from a JSON object only.
pub fn object<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<T, D::Error> {
    let v = Value::deserialize(d)?;
    if !v.is_object() {
        return Err(D::Error::custom(format!("expected a JSON object, found {}", kind(&v))));
    }
    serde_json::from_value(v).map_err(D::Error::custom)
}

/// An optional struct from a JSON object or `null` only.
pub fn object_or_null<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        v @ Value::Object(_) => serde_json::from_value(v).map(Some).map_err(D::Error::custom),
        v => Err(D::Error::custom(format!("expected a JSON object or null, found {}", kind(&v)))),
    }
}

/// Applies `patch` to `target` as a JSON merge patch (RFC 7396): an object's fields merge
/// recursively, `null` removes a field, anything else replaces the target.
pub fn merge_patch(target: &mut serde_json::Value, patch: serde_json::Value) {
    let serde_json::Value::Object(fields) = patch else {
        *target = patch;
        return;
    };
    if !target.is_object() {
        *target = serde_json::Value::Object(Default::default());
    }
    let object = target.as_object_mut().expect("an object");
    for (key, value) in fields {
        if value.is_null() {
            object.remove(&key);
        } else {
            merge_patch(object.entry(key).or_insert(serde_json::Value::Null), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Inner {
        #[serde(default)]
        a: u32,
    }

    #[derive(Debug, Deserialize)]
    struct Outer {
        #[serde(default, deserialize_with = "object_or_null")]
        scope: Option<Inner>,
        #[serde(default, deserialize_with = "object")]
        #[allow(dead_code)]
        inner: Option<Inner>,
    }

    #[test]
    fn structs_come_from_objects_only() {
        let ok: Outer = serde_json::from_str(r#"{"scope": {"a": 1}}"#).unwrap();
        assert_eq!(ok.scope, Some(Inner { a: 1 }));
        assert!(serde_json::from_str::<Outer>(r#"{"scope": null}"#).unwrap().scope.is_none());
        assert!(serde_json::from_str::<Outer>(r#"{}"#).unwrap().scope.is_none());
        let e = serde_json::from_str::<Outer>(r#"{"scope": []}"#).unwrap_err();
        assert!(e.to_string().contains("expected a JSON object or null, found an array"), "{e}");
        assert!(serde_json::from_str::<Outer>(r#"{"inner": [1]}"#).is_err());
        // serde alone takes the array.
        assert_eq!(serde_json::from_str::<Inner>("[]").unwrap(), Inner { a: 0 });
    }
}
