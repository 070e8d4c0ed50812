//! JSON decoding whose errors name the field at fault.
//!
//! serde_json reports type errors by line and column, and the documents crossing the WIT
//! boundary are single-line text, so "invalid type: boolean `true`, expected a string" would not
//! say which attribute is wrong. The fast path decodes the text as it is. Only on a data error
//! is the document re-rendered with one value per line, remembering the path of each line, and
//! decoded again: the error's line then names the field (`mode`, `options.retries`, `items[2]`).

use serde::de::DeserializeOwned;
use serde_json::Value;

/// A decoding failure: the path of the offending value (empty for the document itself) and
/// serde_json's message without its meaningless line/column suffix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeError {
    pub path: String,
    pub message: String,
}

impl DecodeError {
    /// `what: `path`: message`, or `what: message` for the document itself.
    pub fn describe(&self, what: &str) -> String {
        if self.path.is_empty() {
            format!("{what}: {}", self.message)
        } else {
            format!("{what}: `{}`: {}", self.path, self.message)
        }
    }
}

pub(crate) fn decode<T: DeserializeOwned>(text: &str) -> Result<T, DecodeError> {
    let err = match serde_json::from_str::<T>(text) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    if !err.is_data() {
        return Err(DecodeError {
            path: String::new(),
            message: format!("not valid JSON: {}", strip_position(&err)),
        });
    }
    let fallback = DecodeError {
        path: String::new(),
        message: strip_position(&err),
    };
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        return Err(fallback);
    };
    let mut rendered = Rendered::default();
    rendered.value(&value, &mut Vec::new());
    rendered.end_line(&[]);
    match serde_json::from_str::<T>(&rendered.text) {
        Ok(_) => Err(fallback),
        Err(e) => {
            let message = strip_position(&e);
            let mut segments = e
                .line()
                .checked_sub(1)
                .and_then(|i| rendered.lines.get(i))
                .cloned()
                .unwrap_or_default();
            // serde reports an unknown field at its key; the message names it already, so the
            // useful path is the object that holds it.
            if message.starts_with("unknown field") {
                segments.pop();
            }
            Err(DecodeError {
                path: join(&segments),
                message,
            })
        }
    }
}

fn strip_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    if e.line() == 0 {
        return text;
    }
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
}

fn join(segments: &[Segment]) -> String {
    let mut out = String::new();
    for s in segments {
        match s {
            Segment::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// A JSON rendering with one member per line, and the path that each line belongs to.
#[derive(Default)]
struct Rendered {
    text: String,
    lines: Vec<Vec<Segment>>,
}

impl Rendered {
    fn end_line(&mut self, path: &[Segment]) {
        self.text.push('\n');
        self.lines.push(path.to_vec());
    }

    fn value(&mut self, value: &Value, path: &mut Vec<Segment>) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                self.text.push('{');
                self.end_line(path);
                let last = map.len() - 1;
                for (i, (k, v)) in map.iter().enumerate() {
                    path.push(Segment::Key(k.clone()));
                    self.text.push_str(&Value::String(k.clone()).to_string());
                    self.text.push(':');
                    self.value(v, path);
                    if i != last {
                        self.text.push(',');
                    }
                    self.end_line(path);
                    path.pop();
                }
                self.text.push('}');
            }
            Value::Array(items) if !items.is_empty() => {
                self.text.push('[');
                self.end_line(path);
                let last = items.len() - 1;
                for (i, v) in items.iter().enumerate() {
                    path.push(Segment::Index(i));
                    self.value(v, path);
                    if i != last {
                        self.text.push(',');
                    }
                    self.end_line(path);
                    path.pop();
                }
                self.text.push(']');
            }
            scalar_or_empty => self.text.push_str(&scalar_or_empty.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        retries: u32,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Attrs {
        content: String,
        #[serde(default)]
        options: Option<Inner>,
        #[serde(default)]
        items: Vec<Inner>,
    }

    fn err(text: &str) -> DecodeError {
        decode::<Attrs>(text).unwrap_err()
    }

    #[test]
    fn valid_documents_decode() {
        let a: Attrs = decode(r#"{"content":"x","options":{"retries":3}}"#).unwrap();
        assert_eq!(a.content, "x");
    }

    #[test]
    fn type_errors_name_the_field() {
        let e = err(r#"{"content":true}"#);
        assert_eq!(e.path, "content");
        assert_eq!(e.message, "invalid type: boolean `true`, expected a string");
        assert_eq!(
            e.describe("invalid attributes"),
            "invalid attributes: `content`: invalid type: boolean `true`, expected a string"
        );
    }

    #[test]
    fn nested_errors_name_the_path() {
        assert_eq!(err(r#"{"content":"x","options":{"retries":"3"}}"#).path, "options.retries");
        assert_eq!(
            err(r#"{"content":"x","items":[{"retries":1},{"retries":-1}]}"#).path,
            "items[1].retries"
        );
        assert_eq!(err(r#"{"content":"x","options":5}"#).path, "options");
        assert_eq!(err(r#"{"content":"x","options":["a"]}"#).path, "options[0]");
    }

    #[test]
    fn missing_and_unknown_fields_name_their_object() {
        let e = err(r#"{"mode":"0644"}"#);
        // The field order of the document decides which error serde meets first.
        assert_eq!(e.path, "");
        assert!(e.message.starts_with("unknown field `mode`"), "{e:?}");
        let e = err(r#"{}"#);
        assert_eq!((e.path.as_str(), e.message.as_str()), ("", "missing field `content`"));
        let e = err(r#"{"content":"x","options":{}}"#);
        assert_eq!((e.path.as_str(), e.message.as_str()), ("options", "missing field `retries`"));
        let e = err(r#"{"content":"x","options":{"retries":1,"x":2}}"#);
        assert_eq!(e.path, "options");
        assert!(e.message.starts_with("unknown field `x`"), "{e:?}");
    }

    #[test]
    fn syntax_errors_say_so() {
        let e = err(r#"{"content":"#);
        assert_eq!(e.path, "");
        assert!(e.message.starts_with("not valid JSON: EOF"), "{e:?}");
        assert!(!e.message.contains("line"), "{e:?}");
    }

    #[test]
    fn keys_with_quotes_render_correctly() {
        let e = err(r#"{"content":"x","we\"ird":1}"#);
        assert!(e.message.contains("we\"ird"), "{e:?}");
    }
}
