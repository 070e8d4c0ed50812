//! A process's configuration against its service's schema: refused naming the first culprit
//! (`check_config`), and its secrets (the values the schema marks `writeOnly` or `format:
//! password`) found (`secret_pointers`) and never shown (`redacted`).

use serde_json::Value;

use super::ServicesError;

/// Refuses a configuration its service's schema does not accept, naming the first culprit by
/// its JSON pointer.
pub(crate) fn check_config(schema: &Value, config: &Value) -> Result<(), ServicesError> {
    let validator = jsonschema::validator_for(schema).map_err(|e| ServicesError::InvalidConfig {
        path: String::new(),
        message: format!("the service's configuration schema does not compile: {e}"),
    })?;
    if let Some(e) = validator.iter_errors(config).next() {
        return Err(ServicesError::InvalidConfig {
            path: e.instance_path().to_string(),
            message: e.to_string(),
        });
    }
    Ok(())
}

/// `config` with the values `schema` marks secret replaced (see [`secret_pointers`]).
pub(crate) fn redacted(schema: &Value, config: &Value) -> Value {
    let mut shown = config.clone();
    crate::intent::redact(&mut shown, &secret_pointers(schema, config));
    shown
}

/// JSON pointers to the values of `config` that `schema` marks secret (`writeOnly`, `format:
/// password`), in nested objects at any depth.
pub(crate) fn secret_pointers(schema: &Value, config: &Value) -> Vec<String> {
    fn walk(schema: &Value, config: &Value, at: &str, out: &mut Vec<String>) {
        let (Value::Object(map), Some(properties)) = (config, schema.get("properties").and_then(Value::as_object)) else {
            return;
        };
        for (key, value) in map {
            let Some(p) = properties.get(key) else { continue };
            let here = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
            if p.get("writeOnly") == Some(&Value::Bool(true)) || p.get("format").and_then(Value::as_str) == Some("password") {
                out.push(here);
            } else {
                walk(p, value, &here, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(schema, config, "", &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_the_schema_marks_are_redacted_at_any_depth() {
        let schema = json!({"type": "object", "properties": {
            "password": {"type": "string", "writeOnly": true},
            "db": {"type": "object", "properties": {"token": {"type": "string", "format": "password"}, "host": {"type": "string"}}},
            "port": {"type": "integer"}
        }});
        let config = json!({"password": "p", "db": {"token": "t", "host": "h"}, "port": 1, "extra": "x"});
        assert_eq!(
            redacted(&schema, &config),
            json!({"password": "<redacted>", "db": {"token": "<redacted>", "host": "h"}, "port": 1, "extra": "x"})
        );
    }

    #[test]
    fn a_configuration_is_refused_naming_its_first_culprit() {
        let schema = json!({"type": "object", "additionalProperties": false, "properties": {"size": {"type": "integer", "minimum": 1}}});
        check_config(&schema, &json!({"size": 2})).unwrap();
        match check_config(&schema, &json!({"size": 0})) {
            Err(ServicesError::InvalidConfig { path, .. }) => assert_eq!(path, "/size"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            check_config(&schema, &json!({"other": 1})),
            Err(ServicesError::InvalidConfig { .. })
        ));
    }
}
