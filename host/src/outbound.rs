//! What an environment's plugin calls may reach beyond nodes and kv: outgoing HTTP under the
//! environment's [`HttpSettings`], with the host-held secrets it may use, and the call deadline.
//! Secrets come from the host (its configuration's `[secrets]`, or `orc-host deploy --secret`),
//! are read once at start, and are never stored with an environment, returned by the API or
//! logged: an environment names the secrets it may use, and the runtime's HTTP capability sends
//! a secret's value as the `Authorization` header of the requests that name it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use orc_runtime::CallContext;
use orc_runtime::capability::{HttpAccess, HttpPolicy};
use serde::Deserialize;

use crate::store::{EnvironmentSettings, HttpSettings, valid_secret_name};

/// Where a host-held secret's value comes from. Its value is the `Authorization` header as
/// sent, e.g. `Bearer 5f0c…` or `Basic …`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SecretSource {
    /// An environment variable of the host process.
    Env(String),
    /// A file (one trailing line break is dropped).
    File(PathBuf),
}

/// Why a host-held secret could not be read. Never carries the value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("secret `{0}`: not a secret name (1 to 64 of `A-Z a-z 0-9 - _ .`)")]
    InvalidName(String),
    #[error("secret `{name}`: environment variable `{var}` is not set (or not UTF-8)")]
    MissingVar { name: String, var: String },
    #[error("secret `{name}`: cannot read {path}")]
    File {
        name: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("secret `{name}`: the value is empty or not a valid header value (visible ASCII only)")]
    InvalidValue { name: String },
}

/// The host-held secrets, by name. `Debug` shows the names only.
#[derive(Clone, Default)]
pub struct HostSecrets(Arc<BTreeMap<String, String>>);

impl fmt::Debug for HostSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HostSecrets").field(&self.0.keys().collect::<Vec<_>>()).finish()
    }
}

impl HostSecrets {
    /// Reads every secret from its source.
    pub fn load(sources: &BTreeMap<String, SecretSource>) -> Result<HostSecrets, SecretError> {
        let mut values = BTreeMap::new();
        for (name, source) in sources {
            if !valid_secret_name(name) {
                return Err(SecretError::InvalidName(name.chars().take(100).collect()));
            }
            let value = match source {
                SecretSource::Env(var) => std::env::var(var).map_err(|_| SecretError::MissingVar {
                    name: name.clone(),
                    var: var.clone(),
                })?,
                SecretSource::File(path) => {
                    let text = std::fs::read_to_string(path).map_err(|source| SecretError::File {
                        name: name.clone(),
                        path: path.clone(),
                        source,
                    })?;
                    let text = text.strip_suffix('\n').unwrap_or(&text);
                    text.strip_suffix('\r').unwrap_or(text).to_string()
                }
            };
            // What a header may carry: a value with a line break could smuggle headers.
            if value.is_empty() || !value.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)) {
                return Err(SecretError::InvalidValue { name: name.clone() });
            }
            values.insert(name.clone(), value);
        }
        Ok(HostSecrets(Arc::new(values)))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// Refuses settings that name a secret this host does not hold, naming it.
    pub fn check(&self, http: &HttpSettings) -> Result<(), String> {
        match http.secrets.iter().find(|name| !self.contains(name)) {
            None => Ok(()),
            Some(name) => {
                let held: Vec<String> = self.names().map(|n| format!("`{n}`")).collect();
                let held = if held.is_empty() { "none".to_string() } else { held.join(", ") };
                Err(format!("`http.secrets`: `{name}` is not a secret of this host (it holds: {held})"))
            }
        }
    }
}

/// The HTTP access of an environment: its policy, with the values of the secrets it may use.
/// No allowed origin: no client at all. A named secret the host no longer holds (its
/// configuration changed since) is left out with a warning: requests naming it are refused.
pub fn http_access(environment: &str, http: &HttpSettings, secrets: &HostSecrets) -> Result<HttpAccess, String> {
    let parsed = http.parse()?;
    if parsed.allowed.is_empty() {
        return Ok(HttpAccess::deny_all());
    }
    let mut values = HashMap::new();
    for name in &http.secrets {
        match secrets.0.get(name) {
            Some(value) => {
                values.insert(name.clone(), value.clone());
            }
            None => tracing::warn!(environment, secret = %name, "the environment names a secret this host does not hold"),
        }
    }
    HttpAccess::new(HttpPolicy {
        allowed: parsed.allowed,
        addresses: parsed.addresses,
        secrets: values,
        ..HttpPolicy::default()
    })
}

/// `base` (nodes, kv) with what `settings` say about HTTP, the call deadline, the kv quota and
/// the local node's commands.
pub fn call_context(base: &CallContext, settings: &EnvironmentSettings, secrets: &HostSecrets) -> Result<CallContext, String> {
    Ok(CallContext {
        http: Arc::new(http_access(&base.environment, &settings.http, secrets)?),
        ..settled_context(base, settings)
    })
}

/// `base` with what `settings` say about the call deadline, the kv quota and the local node's
/// commands (not HTTP).
pub fn settled_context(base: &CallContext, settings: &EnvironmentSettings) -> CallContext {
    CallContext {
        deadline: Some(Duration::from_secs(settings.call_timeout_s.max(1))),
        kv_quota: settings.kv_quota.quota(),
        command_limits: settings.local_commands.limits(),
        ..base.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_come_from_files_and_the_environment_and_debug_hides_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "Bearer from-a-file\n").unwrap();
        // PATH is set in any test process: its value stands in for a secret.
        let path = std::env::var("PATH").unwrap();
        let sources = BTreeMap::from([
            ("a".to_string(), SecretSource::File(file)),
            ("b".to_string(), SecretSource::Env("PATH".into())),
        ]);
        let secrets = HostSecrets::load(&sources).unwrap();
        assert_eq!(secrets.0["a"], "Bearer from-a-file");
        assert_eq!(secrets.0["b"], path);
        let shown = format!("{secrets:?}");
        assert!(shown.contains("\"a\"") && !shown.contains("from-a-file"), "{shown}");

        let missing = BTreeMap::from([("c".to_string(), SecretSource::Env("ORC_TEST_SURELY_UNSET_VAR".into()))]);
        let err = HostSecrets::load(&missing).unwrap_err().to_string();
        assert!(err.contains("`c`") && err.contains("ORC_TEST_SURELY_UNSET_VAR"), "{err}");
        let two_lines = dir.path().join("two");
        std::fs::write(&two_lines, "Bearer x\nX-Injected: 1\n").unwrap();
        let err = HostSecrets::load(&BTreeMap::from([("d".to_string(), SecretSource::File(two_lines))]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`d`") && !err.contains("Injected"), "{err}");
    }

    #[test]
    fn settings_naming_an_unknown_secret_are_refused_by_name() {
        let secrets = HostSecrets(Arc::new(BTreeMap::from([("known".to_string(), "v".to_string())])));
        let http = HttpSettings {
            secrets: vec!["known".into(), "other".into()],
            ..HttpSettings::default()
        };
        let err = secrets.check(&http).unwrap_err();
        assert!(
            err.contains("`other`") && err.contains("`known`") && !err.contains("\"v\""),
            "{err}"
        );
    }
}
