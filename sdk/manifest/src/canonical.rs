//! Canonical JSON: object keys sorted, no whitespace — the one text of a JSON value that its
//! digest is taken over, whatever key order or spacing it arrived with and whichever map type
//! `serde_json` was built with.

use serde_json::Value;

use crate::Digest;

/// The canonical text of `value`.
pub fn to_string(value: &Value) -> String {
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// The digest of `value`'s canonical text.
pub fn digest(value: &Value) -> Digest {
    Digest::of(to_string(value).as_bytes())
}

fn write(value: &Value, out: &mut String) {
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
                write(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_order_and_spacing_do_not_change_the_text() {
        let a: Value = serde_json::from_str(r#"{"b": [1, {"y": 2, "x": "é"}], "a": null}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":null,"b":[1,{"x":"é","y":2}]}"#).unwrap();
        assert_eq!(to_string(&a), r#"{"a":null,"b":[1,{"x":"é","y":2}]}"#);
        assert_eq!(digest(&a), digest(&b));
        assert_ne!(digest(&a), digest(&serde_json::json!({"a": null})));
    }
}
