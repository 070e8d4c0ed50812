//! An environment's settings: its scheduler's limits and intervals, and what its plugins may
//! reach — capabilities granted, outgoing HTTP and host-held secrets, the kv quota, and the
//! sandbox of local commands. Each setting is bounded and checked by name
//! ([`EnvironmentSettings::validate`]); they are stored with the environment and enforced by
//! [`super::outbound`], the scheduler and the runtime.

use orc_manifest::Capability;
use orc_node::CommandLimits;
use orc_runtime::Grants;
use orc_runtime::capability::KvQuota;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An environment's knobs: its scheduler's limits and intervals, and what its plugins' calls may
/// use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct EnvironmentSettings {
    /// Self-healing: a resource not verified for this long is re-read and restored (0: off).
    pub repair_interval_s: u64,
    /// Failed resources are retried after this long (the scheduler adds backoff and jitter).
    pub retry_interval_s: u64,
    /// Most actions in flight against one node.
    pub per_node_concurrency: u32,
    /// Most actions in flight in the environment.
    pub env_concurrency: u32,
    /// Release every submitted version at once.
    pub auto_deploy: bool,
    /// Longest one plugin call (a read, a diff, an apply) may run, in seconds: 1 to 86,400.
    /// Long installs (a package from a slow mirror) need more than the default.
    pub call_timeout_s: u64,
    /// Outgoing HTTP of the environment's plugins; none by default.
    pub http: HttpSettings,
    /// Which capabilities the environment's plugins may have (`log` always): by default node
    /// files and `kv`, not node commands nor HTTP.
    pub capabilities: CapabilitySettings,
    /// How much key/value state the environment's plugins may keep, all of them together.
    pub kv_quota: KvQuotaSettings,
    /// How commands on the environment's local node are confined: network, and limits.
    pub local_commands: LocalCommandSettings,
    /// What the environment's users may ask of the host: against a noisy tenant.
    pub limits: RequestLimits,
}

/// Limits on what an environment's users may ask, each answered with a clear refusal (413 or
/// 429 with `Retry-After`) that loses nothing already accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RequestLimits {
    /// Most resources in one submitted intent (413 `too_many_resources`): 1 to 1,000,000;
    /// default 200,000.
    pub max_resources_per_intent: u64,
    /// Most intent versions made in any hour (429 `rate_limited`, with `Retry-After`): 1 to
    /// 1,000,000; default 3,600.
    pub versions_per_hour: u64,
    /// Most dryruns running at once (429 `rate_limited`): 1 to 64; default 4.
    pub concurrent_dryruns: u64,
    /// Largest request body for this environment's routes, in bytes (413 `too_large`): 1,024 to
    /// 1 GiB; `null` (the default): the host's `max_body_bytes` alone. The host's limit always
    /// holds too.
    pub max_body_bytes: Option<u64>,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_resources_per_intent: 200_000,
            versions_per_hour: 3_600,
            concurrent_dryruns: 4,
            max_body_bytes: None,
        }
    }
}

/// The sandbox of commands on an environment's local node (`capability::sandbox`): whether they
/// reach the host's network, and what each command may use. A limit reached stops the command
/// (or the process that passed it), never the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LocalCommandSettings {
    /// The host's network; off by default (a loopback of the command's own).
    pub network: bool,
    /// CPU seconds per process: 1 to 86,400; default 600.
    pub cpu_seconds: u64,
    /// Memory of all of a command's processes together, in bytes: 16 MiB to 1 TiB; default 1 GiB.
    pub memory_bytes: u64,
    /// Processes and threads of a command at once: 8 to 1,000,000; default 512.
    pub processes: u64,
    /// Largest file a command may write, in bytes: 1 MiB to 16 TiB; default 1 GiB.
    pub file_size_bytes: u64,
}

impl Default for LocalCommandSettings {
    fn default() -> Self {
        LocalCommandSettings::from(CommandLimits::default())
    }
}

impl From<CommandLimits> for LocalCommandSettings {
    fn from(l: CommandLimits) -> Self {
        LocalCommandSettings {
            network: l.network,
            cpu_seconds: l.cpu_seconds,
            memory_bytes: l.memory_bytes,
            processes: l.processes,
            file_size_bytes: l.file_size_bytes,
        }
    }
}

impl LocalCommandSettings {
    /// What the local node confines its commands with.
    pub fn limits(&self) -> CommandLimits {
        CommandLimits {
            network: self.network,
            cpu_seconds: self.cpu_seconds,
            memory_bytes: self.memory_bytes,
            processes: self.processes,
            file_size_bytes: self.file_size_bytes,
        }
    }
}

/// The quota of an environment's plugin key/value state (`kv`), all plugins together: keys, and
/// bytes of keys and values. A write that would take the environment past either is refused
/// with a permanent `quota_exceeded` error; deleting keys frees room. Lowering it below what the
/// environment holds keeps what is there and refuses only writes that would grow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct KvQuotaSettings {
    /// Most keys: 1 to 10,000,000; default 20,000.
    pub max_keys: u64,
    /// Most bytes of keys and values: 1 to 17,179,869,184 (16 GiB); default 33,554,432 (32 MiB).
    pub max_bytes: u64,
}

impl Default for KvQuotaSettings {
    fn default() -> Self {
        let quota = KvQuota::default();
        KvQuotaSettings {
            max_keys: quota.max_keys,
            max_bytes: quota.max_bytes,
        }
    }
}

impl KvQuotaSettings {
    /// What the runtime checks plugin writes against.
    pub fn quota(&self) -> KvQuota {
        KvQuota {
            max_keys: self.max_keys,
            max_bytes: self.max_bytes,
        }
    }
}

/// Which host capabilities an environment grants its plugins (`log` is always granted). A plugin
/// whose manifest requests one not granted is refused when an intent, a template or a cluster
/// naming it is submitted (422 `capability_not_granted`), and again when it is loaded. Revoking
/// one that the released version's plugins use is refused (409 `capability_in_use`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CapabilitySettings {
    /// `node-files`: read and write files, directories, links, modes and owners on the
    /// environment's nodes (the `file`, `directory` and `symlink` adaptors). Default: granted.
    pub node_files: bool,
    /// `node-commands`: run commands on the environment's nodes (`command`, `process`,
    /// `package`, the `shell` and `redis` automators). Default: not granted — a command reaches
    /// far more of a node than the files an intent names.
    pub node_commands: bool,
    /// `http`: outgoing HTTP, within `http.allowed_origins` (`http-object`). Default: not granted.
    pub http: bool,
    /// `kv`: the plugin's own key/value state, scoped to the environment. Default: granted.
    pub kv: bool,
}

impl Default for CapabilitySettings {
    fn default() -> Self {
        CapabilitySettings {
            node_files: true,
            node_commands: false,
            http: false,
            kv: true,
        }
    }
}

impl CapabilitySettings {
    /// Every capability: embedded mode (the operator runs their own intent) and environments
    /// stored before grants existed (they had everything; see `store::environments`).
    pub fn everything() -> CapabilitySettings {
        CapabilitySettings {
            node_files: true,
            node_commands: true,
            http: true,
            kv: true,
        }
    }

    /// Whether `capability` is granted (`log` always is).
    pub fn allows(&self, capability: Capability) -> bool {
        match capability {
            Capability::Log => true,
            Capability::Kv => self.kv,
            Capability::NodeFiles => self.node_files,
            Capability::NodeCommands => self.node_commands,
            Capability::Http => self.http,
        }
    }

    /// What the runtime is given at load.
    pub fn grants(&self) -> Grants {
        Capability::ALL
            .into_iter()
            .filter(|c| self.allows(*c))
            .fold(Grants::none(), Grants::with)
    }

    /// The setting that grants `capability`, as an operator writes it (`capabilities.http`).
    pub fn setting(capability: Capability) -> &'static str {
        match capability {
            Capability::Log => "(always granted)",
            Capability::Kv => "capabilities.kv",
            Capability::NodeFiles => "capabilities.node_files",
            Capability::NodeCommands => "capabilities.node_commands",
            Capability::Http => "capabilities.http",
        }
    }
}

/// Longest [`EnvironmentSettings::call_timeout_s`]: a day.
pub const MAX_CALL_TIMEOUT_S: u64 = 86_400;
/// Longest [`EnvironmentSettings::repair_interval_s`]: a year.
pub const MAX_REPAIR_INTERVAL_S: u64 = 365 * 86_400;
/// Longest [`EnvironmentSettings::retry_interval_s`]: a day (backoff doubles it up to an hour or
/// to it, whichever is longer).
pub const MAX_RETRY_INTERVAL_S: u64 = 86_400;
/// Most [`EnvironmentSettings::env_concurrency`]: the Wasm instance pool's size.
pub const MAX_ENV_CONCURRENCY: u32 = 1_000;
/// Most [`EnvironmentSettings::per_node_concurrency`].
pub const MAX_NODE_CONCURRENCY: u32 = 256;
/// Most [`KvQuotaSettings::max_keys`]: ten million.
pub const MAX_KV_KEYS: u64 = 10_000_000;
/// Most [`KvQuotaSettings::max_bytes`]: 16 GiB.
pub const MAX_KV_BYTES: u64 = 16 << 30;

impl EnvironmentSettings {
    /// Refuses values the scheduler cannot run with, naming the field, its bound (and the entry).
    pub fn validate(&self) -> Result<(), String> {
        let bounded = [
            (
                "per_node_concurrency",
                u64::from(self.per_node_concurrency),
                1,
                u64::from(MAX_NODE_CONCURRENCY),
                "",
            ),
            (
                "env_concurrency",
                u64::from(self.env_concurrency),
                1,
                u64::from(MAX_ENV_CONCURRENCY),
                "",
            ),
            ("retry_interval_s", self.retry_interval_s, 1, MAX_RETRY_INTERVAL_S, " (a day)"),
            (
                "repair_interval_s",
                self.repair_interval_s,
                0,
                MAX_REPAIR_INTERVAL_S,
                " (a year; 0 turns self-healing off)",
            ),
            ("call_timeout_s", self.call_timeout_s, 1, MAX_CALL_TIMEOUT_S, " (a day)"),
            ("kv_quota.max_keys", self.kv_quota.max_keys, 1, MAX_KV_KEYS, " (ten million)"),
            ("kv_quota.max_bytes", self.kv_quota.max_bytes, 1, MAX_KV_BYTES, " (16 GiB)"),
            ("local_commands.cpu_seconds", self.local_commands.cpu_seconds, 1, 86_400, " (a day)"),
            (
                "local_commands.memory_bytes",
                self.local_commands.memory_bytes,
                16 << 20,
                1 << 40,
                " (1 TiB)",
            ),
            ("local_commands.processes", self.local_commands.processes, 8, 1_000_000, ""),
            (
                "local_commands.file_size_bytes",
                self.local_commands.file_size_bytes,
                1 << 20,
                16 << 40,
                " (16 TiB)",
            ),
            (
                "limits.max_resources_per_intent",
                self.limits.max_resources_per_intent,
                1,
                1_000_000,
                "",
            ),
            ("limits.versions_per_hour", self.limits.versions_per_hour, 1, 1_000_000, ""),
            ("limits.concurrent_dryruns", self.limits.concurrent_dryruns, 1, 64, ""),
            (
                "limits.max_body_bytes",
                self.limits.max_body_bytes.unwrap_or(1024),
                1024,
                1 << 30,
                " (1 GiB)",
            ),
        ];
        for (field, value, min, max, why) in bounded {
            if value < min {
                return Err(format!("`{field}` must be at least {min}"));
            }
            if value > max {
                return Err(format!("`{field}` must be at most {max}{why}; it is {value}"));
            }
        }
        self.http.parse().map(drop)
    }
}

impl Default for EnvironmentSettings {
    fn default() -> Self {
        EnvironmentSettings {
            repair_interval_s: 600,
            retry_interval_s: 60,
            per_node_concurrency: 16,
            env_concurrency: 256,
            auto_deploy: true,
            call_timeout_s: 30,
            http: HttpSettings::default(),
            capabilities: CapabilitySettings::default(),
            kv_quota: KvQuotaSettings::default(),
            local_commands: LocalCommandSettings::default(),
            limits: RequestLimits::default(),
        }
    }
}

/// Where an environment's plugins may send HTTP requests, and with which host-held secrets. The
/// host checks every request against it before connecting (origin), and every address the name
/// resolves to (addresses); a secret is sent as the `Authorization` header by the host, so the
/// plugin never holds its value, and only to an origin the secret is bound to, over `https://`
/// unless `secrets_over_plain_http`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// Origins (`scheme://host[:port]`, http or https, no path) requests may go to; none: no
    /// outgoing HTTP at all.
    #[schema(example = json!(["https://api.example.com", "http://10.1.2.3:8080"]))]
    pub allowed_origins: Vec<String>,
    /// Which addresses those hosts may resolve to (or be): `"public"` (the default: globally
    /// routable only), `"public_and_private"` (also RFC 1918 and unique-local; never loopback,
    /// link-local or cloud metadata), or a list of networks (`["10.0.0.0/8", "127.0.0.1"]`):
    /// only those, the one way to reach loopback or link-local services.
    pub addresses: AddressRule,
    /// Names of host-held secrets (the host configuration's `[secrets]`) this environment's
    /// plugins may send as `Authorization`, each only to the origins the host binds it to (at
    /// least one of which must be allowed here). Values are never stored here nor shown.
    #[schema(example = json!(["billing-api"]))]
    pub secrets: Vec<String>,
    /// Whether secrets may be sent over plain `http://` (to origins they are bound to). Default
    /// false: a secret goes over `https://` only, and a request that would send one over plain
    /// HTTP is refused before it is sent.
    pub secrets_over_plain_http: bool,
}

/// [`HttpSettings::addresses`]: a named rule or a list of networks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum AddressRule {
    /// `public` or `public_and_private`.
    Named(String),
    /// CIDR networks (`10.0.0.0/8`) or single addresses.
    Networks(Vec<String>),
}

impl Default for AddressRule {
    fn default() -> Self {
        AddressRule::Named("public".into())
    }
}

/// [`HttpSettings`] checked and parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedHttp {
    pub allowed: Vec<orc_runtime::capability::Origin>,
    pub addresses: orc_runtime::capability::AddressPolicy,
}

impl HttpSettings {
    /// Parses the origins and the address rule; the error names the setting and the entry.
    pub fn parse(&self) -> Result<ParsedHttp, String> {
        use orc_runtime::capability::{AddressPolicy, IpNet, Origin};
        let allowed = self
            .allowed_origins
            .iter()
            .map(|text| Origin::parse(text).map_err(|why| format!("`http.allowed_origins`: {why}")))
            .collect::<Result<Vec<_>, _>>()?;
        let addresses = match &self.addresses {
            AddressRule::Named(name) if name == "public" => AddressPolicy::Public,
            AddressRule::Named(name) if name == "public_and_private" => AddressPolicy::PublicAndPrivate,
            AddressRule::Named(other) => {
                return Err(format!(
                    "`http.addresses`: `{}` is none of `public`, `public_and_private` or a list of networks",
                    other.chars().take(100).collect::<String>()
                ));
            }
            AddressRule::Networks(nets) if nets.is_empty() => {
                return Err("`http.addresses`: an empty list of networks allows nothing; leave it out for `public`".into());
            }
            AddressRule::Networks(nets) => AddressPolicy::Networks(
                nets.iter()
                    .map(|text| {
                        text.parse::<IpNet>()
                            .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
                            .map_err(|_| {
                                format!(
                                    "`http.addresses`: `{}` is not a network (`10.0.0.0/8`) or an address",
                                    text.chars().take(100).collect::<String>()
                                )
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        for name in &self.secrets {
            if !valid_secret_name(name) {
                return Err(format!(
                    "`http.secrets`: `{}` is not a secret name (1 to 64 of `A-Z a-z 0-9 - _ .`)",
                    name.chars().take(100).collect::<String>()
                ));
            }
        }
        Ok(ParsedHttp { allowed, addresses })
    }
}

/// A host-held secret's name ([`orc_manifest::names::SECRET`]).
pub fn valid_secret_name(name: &str) -> bool {
    orc_manifest::names::SECRET.accepts(name)
}
