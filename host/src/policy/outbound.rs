//! What an environment's plugin calls may reach beyond nodes and kv: outgoing HTTP under the
//! environment's [`HttpSettings`], with the host-held secrets it may use, and the call deadline.
//! Secrets come from the host (its configuration's `[secrets]`, or `orc-host deploy --secret`),
//! are read once at start, and are never stored with an environment, returned by the API or
//! logged: an environment names the secrets it may use, and the runtime's HTTP capability sends
//! a secret's value as the `Authorization` header of the requests that name it — only to the
//! origins the host binds the secret to, and over `https://` unless the environment's
//! `http.secrets_over_plain_http` allows plain HTTP.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use orc_runtime::CallContext;
use orc_runtime::capability::{BoundSecret, HttpAccess, HttpPolicy, Origin, list_origins};
use serde::Deserialize;

use crate::policy::settings::{EnvironmentSettings, HttpSettings, valid_secret_name};

/// Where a host-held secret's value comes from. Its value is the `Authorization` header as
/// sent, e.g. `Bearer 5f0c…` or `Basic …`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// An environment variable of the host process.
    Env(String),
    /// A file (one trailing line break is dropped).
    File(PathBuf),
}

/// A host-held secret as configured: where its value comes from, and the origins it may be sent
/// to (`scheme://host[:port]`, as in `http.allowed_origins`; at least one). In the host's TOML:
/// `name = { env = "VAR", origins = ["https://api.example.com"] }`, or `file = "/path"` for `env`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "SecretToml")]
pub struct SecretConfig {
    pub source: SecretSource,
    pub origins: Vec<String>,
}

/// [`SecretConfig`] as written in TOML. `origins` may be left out here so that its absence is
/// refused by [`check_config`], naming the secret (serde's error would not).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretToml {
    env: Option<String>,
    file: Option<PathBuf>,
    #[serde(default)]
    origins: Vec<String>,
}

impl TryFrom<SecretToml> for SecretConfig {
    type Error = String;

    fn try_from(toml: SecretToml) -> Result<SecretConfig, String> {
        let source = match (toml.env, toml.file) {
            (Some(var), None) => SecretSource::Env(var),
            (None, Some(path)) => SecretSource::File(path),
            _ => return Err("a secret takes one of `env = \"VAR\"` or `file = \"/path\"`".into()),
        };
        Ok(SecretConfig {
            source,
            origins: toml.origins,
        })
    }
}

impl SecretConfig {
    /// A secret as `orc-host deploy --secret` gives it: `NAME=VAR@ORIGIN[,ORIGIN…]`, the value
    /// read from environment variable VAR, sent only to the origins listed.
    pub fn from_flag(text: &str) -> Result<(String, SecretConfig), String> {
        let form = "give NAME=VAR@ORIGIN[,ORIGIN…] (e.g. api-token=API_TOKEN@https://api.example.com)";
        let (name, rest) = text.split_once('=').ok_or_else(|| format!("--secret `{text}`: {form}"))?;
        let no_origin = || format!("--secret `{text}`: no origin: a secret is sent only to the origins it names; {form}");
        let (var, origins) = rest.split_once('@').ok_or_else(no_origin)?;
        if var.is_empty() {
            return Err(format!("--secret `{text}`: no variable; {form}"));
        }
        let origins: Vec<String> = origins.split(',').map(|o| o.trim().to_string()).filter(|o| !o.is_empty()).collect();
        if origins.is_empty() {
            return Err(no_origin());
        }
        Ok((
            name.to_string(),
            SecretConfig {
                source: SecretSource::Env(var.to_string()),
                origins,
            },
        ))
    }
}

/// Why a host-held secret could not be loaded: a bad name, no or bad origins, or a value that
/// cannot be read or sent. Never carries the value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("secret `{0}`: not a secret name (1 to 64 of `A-Z a-z 0-9 - _ .`)")]
    InvalidName(String),
    #[error(
        "secret `{name}`: no `origins`: a secret is sent only to the origins it is bound to; name them, e.g. `origins = [\"https://api.example.com\"]`"
    )]
    NoOrigins { name: String },
    #[error("secret `{name}`: `origins`: {why}")]
    InvalidOrigin { name: String, why: String },
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

/// Checks what a configuration says of its secrets without reading their values: each name is a
/// secret name and each secret is bound to at least one origin, every one an origin. Called when
/// the configuration file is parsed, and again by [`HostSecrets::load`].
pub fn check_config(secrets: &BTreeMap<String, SecretConfig>) -> Result<(), SecretError> {
    secrets.iter().try_for_each(|(name, config)| bound_origins(name, config).map(drop))
}

fn bound_origins(name: &str, config: &SecretConfig) -> Result<Vec<Origin>, SecretError> {
    if !valid_secret_name(name) {
        return Err(SecretError::InvalidName(name.chars().take(100).collect()));
    }
    if config.origins.is_empty() {
        return Err(SecretError::NoOrigins { name: name.to_string() });
    }
    config
        .origins
        .iter()
        .map(|text| {
            Origin::parse(text).map_err(|why| SecretError::InvalidOrigin {
                name: name.to_string(),
                why,
            })
        })
        .collect()
}

/// The host-held secrets by name, each with the origins it is bound to. `Debug` shows the names
/// only.
#[derive(Clone, Default)]
pub struct HostSecrets(Arc<BTreeMap<String, BoundSecret>>);

impl fmt::Debug for HostSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HostSecrets").field(&self.0.keys().collect::<Vec<_>>()).finish()
    }
}

impl HostSecrets {
    /// Checks every secret's name and origins, then reads its value from its source.
    pub fn load(configs: &BTreeMap<String, SecretConfig>) -> Result<HostSecrets, SecretError> {
        let mut secrets = BTreeMap::new();
        for (name, config) in configs {
            let origins = bound_origins(name, config)?;
            let value = match &config.source {
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
            secrets.insert(name.clone(), BoundSecret { value, origins });
        }
        Ok(HostSecrets(Arc::new(secrets)))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// Refuses settings that name a secret this host does not hold, or one bound to none of the
    /// origins the settings allow (it could never be sent), naming it and both lists.
    pub fn check(&self, http: &HttpSettings) -> Result<(), String> {
        let allowed = http.parse()?.allowed;
        for name in &http.secrets {
            let Some(secret) = self.0.get(name) else {
                let held: Vec<String> = self.names().map(|n| format!("`{n}`")).collect();
                let held = if held.is_empty() { "none".to_string() } else { held.join(", ") };
                return Err(format!("`http.secrets`: `{name}` is not a secret of this host (it holds: {held})"));
            };
            if !secret.origins.iter().any(|o| allowed.contains(o)) {
                return Err(format!(
                    "`http.secrets`: `{name}` is bound to {}, none of which `http.allowed_origins` allows (it allows: {})",
                    list_origins(&secret.origins),
                    list_origins(&allowed)
                ));
            }
        }
        Ok(())
    }
}

/// The HTTP access of an environment: its policy, with the values and bound origins of the
/// secrets it may use. No allowed origin: no client at all. A named secret the host no longer
/// holds (its configuration changed since) is left out with a warning: requests naming it are
/// refused; one now bound to none of the allowed origins is warned about (requests naming it are
/// refused by its binding).
pub fn http_access(environment: &str, http: &HttpSettings, secrets: &HostSecrets) -> Result<HttpAccess, String> {
    let parsed = http.parse()?;
    if parsed.allowed.is_empty() {
        return Ok(HttpAccess::deny_all());
    }
    let mut bound = HashMap::new();
    for name in &http.secrets {
        match secrets.0.get(name) {
            Some(secret) => {
                if !secret.origins.iter().any(|o| parsed.allowed.contains(o)) {
                    tracing::warn!(
                        environment,
                        secret = %name,
                        bound_to = %list_origins(&secret.origins),
                        "the environment names a secret bound to none of its allowed origins"
                    );
                }
                bound.insert(name.clone(), secret.clone());
            }
            None => tracing::warn!(environment, secret = %name, "the environment names a secret this host does not hold"),
        }
    }
    HttpAccess::new(HttpPolicy {
        allowed: parsed.allowed,
        addresses: parsed.addresses,
        secrets: bound,
        secrets_over_plain_http: http.secrets_over_plain_http,
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

    fn config(source: SecretSource, origins: &[&str]) -> SecretConfig {
        SecretConfig {
            source,
            origins: origins.iter().map(|o| o.to_string()).collect(),
        }
    }

    const API: &str = "https://api.example.com";

    #[test]
    fn secrets_come_from_files_and_the_environment_and_debug_hides_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "Bearer from-a-file\n").unwrap();
        // PATH is set in any test process: its value stands in for a secret.
        let path = std::env::var("PATH").unwrap();
        let sources = BTreeMap::from([
            ("a".to_string(), config(SecretSource::File(file), &[API])),
            ("b".to_string(), config(SecretSource::Env("PATH".into()), &["http://10.0.0.5:8080"])),
        ]);
        let secrets = HostSecrets::load(&sources).unwrap();
        assert_eq!(secrets.0["a"].value, "Bearer from-a-file");
        assert_eq!(secrets.0["a"].origins, [Origin::parse(API).unwrap()]);
        assert_eq!(secrets.0["b"].value, path);
        let shown = format!("{secrets:?}");
        assert!(shown.contains("\"a\"") && !shown.contains("from-a-file"), "{shown}");

        let missing = BTreeMap::from([(
            "c".to_string(),
            config(SecretSource::Env("ORC_TEST_SURELY_UNSET_VAR".into()), &[API]),
        )]);
        let err = HostSecrets::load(&missing).unwrap_err().to_string();
        assert!(err.contains("`c`") && err.contains("ORC_TEST_SURELY_UNSET_VAR"), "{err}");
        let two_lines = dir.path().join("two");
        std::fs::write(&two_lines, "Bearer x\nX-Injected: 1\n").unwrap();
        let err = HostSecrets::load(&BTreeMap::from([("d".to_string(), config(SecretSource::File(two_lines), &[API]))]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`d`") && !err.contains("Injected"), "{err}");
    }

    #[test]
    fn a_secret_bound_to_no_origin_or_to_a_non_origin_is_refused_at_load_by_name() {
        // PATH is set: only the binding can refuse these.
        let path = || SecretSource::Env("PATH".into());
        for (origins, says) in [
            (&[][..], "secret `billing`: no `origins`"),
            (
                &["https://api.example.com/v1"][..],
                "secret `billing`: `origins`: `https://api.example.com/v1` is not an origin",
            ),
            (
                &["ftp://files.example.com"][..],
                "secret `billing`: `origins`: `ftp://files.example.com` has no host or an unsupported scheme",
            ),
            (
                &[API, "api.example.com"][..],
                "secret `billing`: `origins`: `api.example.com` is not a URL",
            ),
        ] {
            let configs = BTreeMap::from([("billing".to_string(), config(path(), origins))]);
            let err = HostSecrets::load(&configs).unwrap_err().to_string();
            assert!(err.starts_with(says), "{origins:?}: {err}");
            assert_eq!(check_config(&configs).unwrap_err().to_string(), err);
        }
        let fine = BTreeMap::from([("billing".to_string(), config(path(), &[API, "http://10.0.0.5:8080/"]))]);
        check_config(&fine).unwrap();
        let loaded = HostSecrets::load(&fine).unwrap();
        let origins: Vec<String> = loaded.0["billing"].origins.iter().map(ToString::to_string).collect();
        assert_eq!(origins, ["https://api.example.com:443", "http://10.0.0.5:8080"]);
    }

    #[test]
    fn the_deploy_flag_names_the_variable_and_the_origins() {
        let (name, secret) = SecretConfig::from_flag("api-token=API_TOKEN@https://api.example.com").unwrap();
        assert_eq!(name, "api-token");
        assert_eq!(secret, config(SecretSource::Env("API_TOKEN".into()), &[API]));
        let (_, two) = SecretConfig::from_flag("t=V@https://a.example.com, http://10.0.0.5:8080").unwrap();
        assert_eq!(two.origins, ["https://a.example.com", "http://10.0.0.5:8080"]);
        for (flag, says) in [
            ("api-token=API_TOKEN", "no origin"),
            ("api-token=API_TOKEN@", "no origin"),
            ("api-token", "give NAME=VAR@ORIGIN"),
            ("api-token=@https://api.example.com", "no variable"),
        ] {
            let err = SecretConfig::from_flag(flag).unwrap_err();
            assert!(err.contains(&format!("`{flag}`")) && err.contains(says), "{flag}: {err}");
        }
    }

    fn held(origins: &[&str]) -> HostSecrets {
        let bound = BoundSecret {
            value: "v-of-the-secret".to_string(),
            origins: origins.iter().map(|o| Origin::parse(o).unwrap()).collect(),
        };
        HostSecrets(Arc::new(BTreeMap::from([("known".to_string(), bound)])))
    }

    #[test]
    fn settings_naming_an_unknown_secret_are_refused_by_name() {
        let http = HttpSettings {
            allowed_origins: vec![API.into()],
            secrets: vec!["known".into(), "other".into()],
            ..HttpSettings::default()
        };
        let err = held(&[API]).check(&http).unwrap_err();
        assert!(
            err.contains("`other`") && err.contains("`known`") && !err.contains("v-of-the-secret"),
            "{err}"
        );
    }

    #[test]
    fn settings_naming_a_secret_bound_to_none_of_their_origins_are_refused_naming_both_lists() {
        let secrets = held(&["https://billing.example.com", "https://billing.example.net"]);
        let http = |allowed: &[&str]| HttpSettings {
            allowed_origins: allowed.iter().map(|o| o.to_string()).collect(),
            secrets: vec!["known".into()],
            ..HttpSettings::default()
        };
        let err = secrets.check(&http(&[API, "http://billing.example.com"])).unwrap_err();
        assert_eq!(
            err,
            "`http.secrets`: `known` is bound to https://billing.example.com:443, https://billing.example.net:443, \
             none of which `http.allowed_origins` allows (it allows: https://api.example.com:443, http://billing.example.com:80)"
        );
        let err = secrets.check(&http(&[])).unwrap_err();
        assert!(err.ends_with("(it allows: none)"), "{err}");
        // One shared origin is enough; the others are refused per request.
        secrets.check(&http(&[API, "https://billing.example.net:443"])).unwrap();
        // Without secrets, nothing to bind.
        secrets.check(&HttpSettings::default()).unwrap();
    }
}
