//! `HostConfig`: what `orc-host serve` runs with — listen address, data directory, database,
//! the settings new environments start with, request limits. Deserialised from TOML (unknown keys
//! are an error); only the binary reads flags, `ORC_*` variables and the file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::app::sign_in::SignInLimits;
use crate::policy::outbound::{self, SecretConfig};
use crate::policy::settings::EnvironmentSettings;
use crate::scheduler::subscribers::DEFAULT_BUFFER_BYTES;
use crate::store::SQLITE_FILE;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HostConfig {
    /// Address the API listens on (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// Registry, compiled plugins, node roots and (by default) the SQLite database.
    pub data_dir: PathBuf,
    /// `sqlite:PATH` or `postgres://…`; default: the SQLite file `DATA_DIR/orc.db`.
    pub database: Option<String>,
    /// Largest request body accepted, in bytes; a larger one is answered 413.
    pub max_body_bytes: usize,
    /// Requests per second each token may make on average (429 `rate_limited` with
    /// `Retry-After` past it); 0: no limit.
    pub token_requests_per_s: u32,
    /// How many requests a token may make at once above that rate.
    pub token_burst: u32,
    /// At shutdown, how long actions in flight get to finish (and be recorded) before they are
    /// abandoned; a restart runs abandoned actions again.
    pub shutdown_grace_s: u64,
    /// The settings an environment gets when its creation names none.
    pub environment_defaults: EnvironmentSettings,
    /// The key node credentials are encrypted with (64 hex characters, created with mode 0600
    /// if missing); default `DATA_DIR/secret.key`. Replicas on one database share one file.
    pub secret_key_file: Option<PathBuf>,
    /// Nodes not verified yet or unreachable are tried again this often, in seconds.
    pub node_reverify_interval_s: u64,
    /// Host-held secrets for plugins' outgoing HTTP, by name: `name = { env = "VAR", origins =
    /// ["https://api.example.com"] }` (or `file = "/path"` for `env`), read at start. The value
    /// is sent as the `Authorization` header of the requests that name the secret, from
    /// environments whose `http.secrets` list it, only to the origins given (required).
    pub secrets: BTreeMap<String, SecretConfig>,
    /// Signing in with a password: the password pool and the throttle.
    pub sign_in: SignInLimits,
    /// Bytes of events each event stream subscriber may fall behind by before it is told it
    /// lagged and its stream ends (a reader that does not read costs at most this).
    pub event_buffer_bytes: usize,
    /// How long each environment's recorded events are kept, in seconds: a client whose
    /// stream broke resumes (`Last-Event-ID`) on any replica if it comes back within this.
    pub event_log_s: u64,
    /// Where operators and the other replicas reach this replica's API (`GET /api/v1/replicas`,
    /// and the owner a `run_elsewhere` answer names), as `host:port` or a URL; default: the
    /// address it listens on.
    pub advertise: Option<String>,
    /// The leases' timings (not configurable: `crate::replicas::Timings` says why these).
    #[serde(skip)]
    pub replicas: crate::replicas::Timings,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8420)),
            data_dir: PathBuf::from(".orc"),
            database: None,
            max_body_bytes: 16 * 1024 * 1024,
            token_requests_per_s: 1_000,
            token_burst: 2_000,
            shutdown_grace_s: 30,
            environment_defaults: EnvironmentSettings::default(),
            secret_key_file: None,
            node_reverify_interval_s: 30,
            secrets: BTreeMap::new(),
            sign_in: SignInLimits::default(),
            event_buffer_bytes: DEFAULT_BUFFER_BYTES,
            event_log_s: 3600,
            advertise: None,
            replicas: crate::replicas::Timings::default(),
        }
    }
}

/// The bounds of `event_buffer_bytes`: 64 KiB to 1 GiB.
pub const MIN_EVENT_BUFFER_BYTES: usize = 64 * 1024;
pub const MAX_EVENT_BUFFER_BYTES: usize = 1024 * 1024 * 1024;
/// The bounds of `event_log_s`: a minute to 30 days.
pub const EVENT_LOG_S: std::ops::RangeInclusive<u64> = 60..=30 * 86_400;

#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(String);

impl HostConfig {
    /// Parses a TOML document; keys it does not know are refused by name, and so is a secret
    /// bound to no origin.
    pub fn from_toml(text: &str) -> Result<HostConfig, ConfigError> {
        let config: HostConfig = toml::from_str(text).map_err(|e| ConfigError(e.message().to_string()))?;
        config
            .environment_defaults
            .validate()
            .map_err(|e| ConfigError(format!("environment_defaults: {e}")))?;
        outbound::check_config(&config.secrets).map_err(|e| ConfigError(e.to_string()))?;
        if !(MIN_EVENT_BUFFER_BYTES..=MAX_EVENT_BUFFER_BYTES).contains(&config.event_buffer_bytes) {
            return Err(ConfigError(format!(
                "event_buffer_bytes: {} is outside {MIN_EVENT_BUFFER_BYTES}–{MAX_EVENT_BUFFER_BYTES}",
                config.event_buffer_bytes
            )));
        }
        if !EVENT_LOG_S.contains(&config.event_log_s) {
            return Err(ConfigError(format!(
                "event_log_s: {} is outside {}–{}",
                config.event_log_s,
                EVENT_LOG_S.start(),
                EVENT_LOG_S.end()
            )));
        }
        Ok(config)
    }

    /// The database location the store connects to.
    pub fn database_url(&self) -> String {
        match &self.database {
            Some(url) => url.clone(),
            None => sqlite_url(&self.data_dir.join(SQLITE_FILE)),
        }
    }
}

fn sqlite_url(path: &Path) -> String {
    format!("sqlite:{}", path.display())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::outbound::SecretSource;

    #[test]
    fn the_shipped_example_parses() {
        let text = include_str!("../../orc-host.example.toml");
        let config = HostConfig::from_toml(text).unwrap();
        assert_eq!(config.listen, "127.0.0.1:8420".parse().unwrap());
        assert_eq!(config.data_dir, PathBuf::from("/var/lib/orc"));
        assert_eq!(config.database_url(), "sqlite:/var/lib/orc/orc.db");
        assert_eq!(config.environment_defaults.retry_interval_s, 60);
        assert_eq!(config.environment_defaults.call_timeout_s, 30);
        assert_eq!(config.sign_in, SignInLimits::default());
        assert_eq!(config.event_buffer_bytes, DEFAULT_BUFFER_BYTES);
        assert_eq!(
            config.environment_defaults.kv_quota,
            crate::policy::settings::KvQuotaSettings::default()
        );
        // The commented-out sections parse too, once uncommented.
        let uncommented: String = text
            .lines()
            .map(|l| {
                l.strip_prefix("# [")
                    .map(|rest| format!("[{rest}"))
                    .unwrap_or_else(|| l.to_string())
            })
            .map(|l| {
                let mut parts = l.splitn(2, " = ");
                match (parts.next(), parts.next()) {
                    (Some(key), Some(value)) if key.starts_with("# ") && !key[2..].contains(' ') => {
                        format!("{} = {value}", &key[2..])
                    }
                    _ => l,
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let full = HostConfig::from_toml(&uncommented).unwrap();
        assert_eq!(full.environment_defaults.http.secrets, ["billing-api"]);
        assert_eq!(full.secrets.len(), 2);
        assert_eq!(full.secrets["billing-api"].origins, full.environment_defaults.http.allowed_origins);
        assert!(!full.environment_defaults.http.secrets_over_plain_http);
        assert_eq!(full.database_url(), "postgres://orc@localhost/orc");
    }

    #[test]
    fn an_unknown_key_is_refused_by_name() {
        let err = HostConfig::from_toml("listen = \"127.0.0.1:1\"\nlisten_port = 3\n").unwrap_err();
        assert!(err.to_string().contains("listen_port"), "{err}");
        let err = HostConfig::from_toml("[environment_defaults]\nrepair_interval_s = 9223372036854775808\n").unwrap_err();
        assert!(err.to_string().contains("`repair_interval_s` must be at most"), "{err}");
        let err = HostConfig::from_toml("[environment_defaults]\nauto_deploi = true\n").unwrap_err();
        assert!(err.to_string().contains("auto_deploi"), "{err}");
        let err = HostConfig::from_toml("[environment_defaults.kv_quota]\nmax_keys = 0\n").unwrap_err();
        assert!(err.to_string().contains("`kv_quota.max_keys` must be at least 1"), "{err}");
        let err = HostConfig::from_toml("[environment_defaults.kv_quota]\nmax_values = 3\n").unwrap_err();
        assert!(err.to_string().contains("max_values"), "{err}");
        let err = HostConfig::from_toml("[sign_in]\nper_user_per_minute = 3\n").unwrap_err();
        assert!(err.to_string().contains("per_user_per_minute"), "{err}");
        let err = HostConfig::from_toml("event_buffer_bytes = 100\n").unwrap_err();
        assert!(err.to_string().contains("event_buffer_bytes: 100 is outside"), "{err}");
    }

    #[test]
    fn secrets_name_their_source_and_origins() {
        let config = HostConfig::from_toml(
            "[secrets]\nbilling = { env = \"BILLING_TOKEN\", origins = [\"https://billing.example.com\"] }\n\
             github = { file = \"/etc/orc/github\", origins = [\"https://api.github.com\", \"http://10.0.0.5:8080\"] }\n",
        )
        .unwrap();
        assert_eq!(
            config.secrets["billing"],
            SecretConfig {
                source: SecretSource::Env("BILLING_TOKEN".into()),
                origins: vec!["https://billing.example.com".into()],
            }
        );
        assert_eq!(config.secrets["github"].source, SecretSource::File("/etc/orc/github".into()));
        assert_eq!(config.secrets["github"].origins, ["https://api.github.com", "http://10.0.0.5:8080"]);
        for (text, says) in [
            ("x = { value = \"Bearer 1\", origins = [\"https://a.example.com\"] }", "value"),
            ("x = { origins = [\"https://a.example.com\"] }", "one of `env"),
            (
                "x = { env = \"A\", file = \"/a\", origins = [\"https://a.example.com\"] }",
                "one of `env",
            ),
        ] {
            let err = HostConfig::from_toml(&format!("[secrets]\n{text}\n")).unwrap_err();
            assert!(err.to_string().contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn a_secret_without_origins_is_refused_naming_it() {
        for origins in ["", ", origins = []"] {
            let text = format!(
                "[secrets]\nok = {{ env = \"A\", origins = [\"https://a.example.com\"] }}\nbilling = {{ env = \"BILLING_TOKEN\"{origins} }}\n"
            );
            let err = HostConfig::from_toml(&text).unwrap_err().to_string();
            assert!(err.starts_with("invalid configuration: secret `billing`: no `origins`"), "{err}");
        }
        let err = HostConfig::from_toml("[secrets]\nbilling = { env = \"A\", origins = [\"https://billing.example.com/v1\"] }\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("secret `billing`: `origins`: `https://billing.example.com/v1` is not an origin"),
            "{err}"
        );
    }

    #[test]
    fn an_empty_file_is_the_defaults() {
        assert_eq!(HostConfig::from_toml("").unwrap(), HostConfig::default());
    }
}
