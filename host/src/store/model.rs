//! The records the store keeps, as Rust values: typed ids, environments and their settings, intent
//! versions, resource states and their status transitions, the action log, dryrun reports, admin
//! tokens. JSON documents (intents, changes, messages, reports) travel as JSON text: the store
//! keeps them verbatim and never looks inside.

use std::fmt;
use std::str::FromStr;

use orc_manifest::Capability;
use orc_node::CommandLimits;
use orc_runtime::Grants;
use orc_runtime::capability::KvQuota;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// Milliseconds since the Unix epoch: the one time format of the store, on both backends.
pub type Millis = i64;

/// Now, in [`Millis`].
pub fn now_ms() -> Millis {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// A new random (v4) id.
            pub fn random() -> $name {
                $name(Uuid::new_v4())
            }
            pub fn as_uuid(&self) -> &Uuid {
                &self.0
            }
        }

        impl From<Uuid> for $name {
            fn from(u: Uuid) -> $name {
                $name(u)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                // Hyphenated lowercase: the form stored in the database.
                fmt::Display::fmt(&self.0.hyphenated(), f)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<$name, uuid::Error> {
                Uuid::parse_str(s).map($name)
            }
        }
    };
}

uuid_id!(
    /// An environment (a tenant). Stored as hyphenated UUID text.
    EnvironmentId
);
uuid_id!(
    /// One entry of the action log.
    ActionId
);

impl ActionId {
    /// A new time-ordered (UUIDv7) id: entries written together get neighbouring ids, so the
    /// log's unique index grows at its end instead of taking random inserts (a third faster for
    /// a 10,000-entry batch on SQLite).
    pub fn new() -> ActionId {
        ActionId(Uuid::now_v7())
    }
}

impl Default for ActionId {
    fn default() -> Self {
        ActionId::new()
    }
}
uuid_id!(
    /// One dryrun report.
    DryrunId
);
uuid_id!(
    /// One admin token (the id, not the secret).
    TokenId
);
uuid_id!(
    /// One user-triggered deploy or repair.
    OperationId
);

/// A stored enum value that is not one of the known names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} `{value}`")]
pub struct UnknownName {
    pub kind: &'static str,
    pub value: String,
}

macro_rules! named_enum {
    ($(#[$doc:meta])* $name:ident ($kind:literal) { $($(#[$vdoc:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The name stored in the database and used in the API.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownName;
            fn from_str(s: &str) -> Result<$name, UnknownName> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownName { kind: $kind, value: s.chars().take(100).collect() }),
                }
            }
        }
    };
}

named_enum!(
    /// Where a resource stands: `available` → `deploying` → `deployed` | `failed` | `skipped` |
    /// `unavailable`.
    ResourceStatus("resource status") {
        /// Waiting to be deployed (new, changed, or recovered after a crash).
        Available => "available",
        /// An action is in flight. Never left behind: see `Store::recover_deploying`.
        Deploying => "deploying",
        Deployed => "deployed",
        Failed => "failed",
        /// A resource it requires did not succeed.
        Skipped => "skipped",
        /// Its node cannot be reached.
        Unavailable => "unavailable",
    }
);

named_enum!(
    /// What an action-log entry did.
    ActionKind("action kind") {
        Deploy => "deploy",
        Repair => "repair",
        Dryrun => "dryrun",
        Read => "read",
        Delete => "delete",
    }
);

named_enum!(
    /// What a user asked the scheduler to do now.
    OperationKind("operation kind") {
        /// Retry every failed, skipped or unavailable resource.
        Deploy => "deploy",
        /// Re-read and restore every resource.
        Repair => "repair",
    }
);

named_enum!(
    /// Where an operation stands.
    OperationStatus("operation status") {
        Running => "running",
        /// The scheduler settled; the result says how.
        Done => "done",
        /// The host stopped before the scheduler settled.
        Interrupted => "interrupted",
    }
);

named_enum!(
    /// Where a dryrun report stands.
    DryrunStatus("dryrun status") {
        Running => "running",
        Done => "done",
        Failed => "failed",
    }
);

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
}

/// The sandbox of commands on an environment's local node (`orc_node::sandbox`): whether they
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

/// A host-held secret's name: 1 to 64 of `A-Z a-z 0-9 - _ .`.
pub fn valid_secret_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Environment {
    pub id: EnvironmentId,
    pub name: String,
    pub settings: EnvironmentSettings,
    pub halted: bool,
    /// The highest version submitted so far (0 before the first).
    pub latest_version: i64,
    /// The version the scheduler drives towards, once one is released.
    pub released_version: Option<i64>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// An intent version without its document (for listings).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VersionInfo {
    pub environment: EnvironmentId,
    pub version: i64,
    pub created_at: Millis,
    /// When it was last released (a rollback releases an older version again).
    pub released_at: Option<Millis>,
    /// It is the environment's released version.
    pub active: bool,
}

/// An intent version with its immutable document (JSON text).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct IntentVersion {
    #[serde(flatten)]
    pub info: VersionInfo,
    pub document: String,
}

/// A failure as the log and the state keep it: a stable code and a message naming the culprit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorInfo {
    pub code: String,
    pub message: String,
}

/// The state of one resource in one environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ResourceState {
    /// `type[node,key]`.
    pub resource_id: String,
    pub resource_type: String,
    pub node: String,
    /// Hash of the desired attributes in `version`.
    pub desired_hash: String,
    /// Hash of the attributes last enforced successfully.
    pub deployed_hash: Option<String>,
    pub status: ResourceStatus,
    /// The intent version this state belongs to.
    pub version: i64,
    pub last_deploy_at: Option<Millis>,
    pub last_verified_at: Option<Millis>,
    pub attempts: i64,
    pub last_error: Option<ErrorInfo>,
    pub next_retry_at: Option<Millis>,
}

/// What a status transition does to the attempt counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Attempts {
    #[default]
    Keep,
    Increment,
    Reset,
}

/// One status transition of [`Store::set_status`](super::Store::set_status). `None` in the
/// `deployed_hash` / `last_*_at` fields keeps the stored value; `last_error` and `next_retry_at`
/// are always written (`None` clears them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusChange {
    pub resource_id: String,
    pub status: ResourceStatus,
    pub deployed_hash: Option<String>,
    pub last_deploy_at: Option<Millis>,
    pub last_verified_at: Option<Millis>,
    pub attempts: Attempts,
    pub last_error: Option<ErrorInfo>,
    pub next_retry_at: Option<Millis>,
    /// Apply only if the stored state still belongs to this version: a change computed for a
    /// superseded version is dropped instead of overwriting the newer state.
    pub if_version: Option<i64>,
}

impl StatusChange {
    /// Sets `status`; keeps everything else except `last_error` and `next_retry_at` (cleared).
    pub fn new(resource_id: impl Into<String>, status: ResourceStatus) -> StatusChange {
        StatusChange {
            resource_id: resource_id.into(),
            status,
            deployed_hash: None,
            last_deploy_at: None,
            last_verified_at: None,
            attempts: Attempts::Keep,
            last_error: None,
            next_retry_at: None,
            if_version: None,
        }
    }
}

/// Filters and page of [`Store::list_states`](super::Store::list_states). States come in
/// resource-id order (bytewise); `after` is the keyset cursor (the last id of the previous page).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct StateFilter {
    pub status: Option<ResourceStatus>,
    pub resource_type: Option<String>,
    pub node: Option<String>,
    /// Case-insensitive (ASCII) substring of the resource id.
    pub text: Option<String>,
    pub after: Option<String>,
    /// 1..=[`MAX_PAGE`]; 0 means [`DEFAULT_PAGE`].
    pub limit: u32,
}

impl Default for StateFilter {
    fn default() -> Self {
        StateFilter {
            status: None,
            resource_type: None,
            node: None,
            text: None,
            after: None,
            limit: DEFAULT_PAGE,
        }
    }
}

pub const DEFAULT_PAGE: u32 = 100;
pub const MAX_PAGE: u32 = 10_000;

pub(crate) fn page_size(limit: u32) -> u32 {
    match limit {
        0 => DEFAULT_PAGE,
        n => n.min(MAX_PAGE),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StatePage {
    pub items: Vec<ResourceState>,
    /// Pass as `after` for the next page; `None` on the last page.
    pub next_after: Option<String>,
}

/// One entry of the action log, as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ActionRecord {
    pub id: ActionId,
    pub environment: EnvironmentId,
    pub resource_id: String,
    pub kind: ActionKind,
    /// The intent version the action worked for.
    pub version: Option<i64>,
    pub started_at: Millis,
    pub finished_at: Millis,
    /// The executor's outcome (`unchanged`, `changed`, `would_change`, `failed`, …).
    pub outcome: String,
    /// JSON array of changes (field, current, desired).
    pub changes: String,
    /// JSON array of messages.
    pub messages: String,
    pub error: Option<ErrorInfo>,
}

/// An action-log entry as read back, with its place in the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LoggedAction {
    /// Insertion order, increasing; the pagination cursor.
    pub seq: i64,
    #[serde(flatten)]
    pub action: ActionRecord,
}

/// Filters and page of [`Store::list_actions`](super::Store::list_actions). Newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ActionFilter {
    pub resource_id: Option<String>,
    pub kind: Option<ActionKind>,
    pub outcome: Option<String>,
    pub version: Option<i64>,
    /// `started_at >= since`.
    pub since: Option<Millis>,
    /// `started_at < until`.
    pub until: Option<Millis>,
    /// Keyset cursor: entries with `seq < before`.
    pub before: Option<i64>,
    pub limit: u32,
}

impl Default for ActionFilter {
    fn default() -> Self {
        ActionFilter {
            resource_id: None,
            kind: None,
            outcome: None,
            version: None,
            since: None,
            until: None,
            before: None,
            limit: DEFAULT_PAGE,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ActionPage {
    pub items: Vec<LoggedAction>,
    /// Pass as `before` for the next (older) page; `None` on the last page.
    pub next_before: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DryrunReport {
    pub id: DryrunId,
    pub environment: EnvironmentId,
    pub version: i64,
    pub status: DryrunStatus,
    pub created_at: Millis,
    pub finished_at: Option<Millis>,
    /// JSON text, once finished.
    pub report: Option<String>,
}

/// A user-triggered deploy or repair and, once the scheduler has settled, its outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Operation {
    pub id: OperationId,
    pub environment: EnvironmentId,
    pub kind: OperationKind,
    pub status: OperationStatus,
    pub created_at: Millis,
    pub finished_at: Option<Millis>,
    /// JSON text, once finished.
    pub result: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AdminToken {
    pub id: TokenId,
    pub created_at: Millis,
}

/// The hash under which a token is stored and looked up: lowercase hex of its sha256.
pub fn hash_token(token: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

named_enum!(
    /// Where a node stands: `unidentified` until the host has reached it and pinned its host key,
    /// then `public` (any environment may use it) or `private` (one environment); `unreachable`,
    /// `auth_failed` and `host_key_changed` when the last attempt to reach it failed that way.
    NodeStatus("node status") {
        /// Registered, not yet reached.
        Unidentified => "unidentified",
        /// Verified; any environment may use it.
        Public => "public",
        /// Verified; only its environment may use it.
        Private => "private",
        /// The last connection attempt found nothing answering; retried.
        Unreachable => "unreachable",
        /// The node refused the credential (or the key could not be used).
        AuthFailed => "auth_failed",
        /// The node presented a host key other than the pinned one: unusable until an operator
        /// accepts the new key.
        HostKeyChanged => "host_key_changed",
    }
);

impl NodeStatus {
    /// The status of a node that was just verified.
    pub fn verified(private: bool) -> NodeStatus {
        if private { NodeStatus::Private } else { NodeStatus::Public }
    }

    pub fn is_verified(self) -> bool {
        matches!(self, NodeStatus::Public | NodeStatus::Private)
    }
}

named_enum!(
    /// How the host logs in to a node (the secret itself is never shown).
    CredentialKind("credential kind") {
        PrivateKey => "private_key",
        Password => "password",
    }
);

/// A node as the store keeps it, without its credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeRecord {
    pub name: String,
    pub address: String,
    pub port: u16,
    pub user: String,
    pub credential: CredentialKind,
    pub labels: std::collections::BTreeMap<String, String>,
    /// The environment it is private to; `None`: public.
    pub environment: Option<EnvironmentId>,
    /// That environment's name.
    pub environment_name: Option<String>,
    pub status: NodeStatus,
    /// The pinned host key fingerprint (`SHA256:…`).
    pub host_key: Option<String>,
    /// A different host key the node presented, refused until accepted.
    pub presented_host_key: Option<String>,
    /// Facts gathered at the last verification (JSON).
    #[schema(value_type = Option<Object>)]
    pub facts: Option<serde_json::Value>,
    pub last_error: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub verified_at: Option<Millis>,
}

/// A new node to store (status `unidentified`).
#[derive(Debug, Clone)]
pub struct NewNode {
    pub name: String,
    pub address: String,
    pub port: u16,
    pub user: String,
    pub credential: CredentialKind,
    pub labels: std::collections::BTreeMap<String, String>,
    pub environment: Option<EnvironmentId>,
    pub host_key: Option<String>,
}

/// A credential encrypted with the host's secret key. Only the node registry can open it.
#[derive(Clone, PartialEq, Eq)]
pub struct SealedCredential {
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

impl fmt::Debug for SealedCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SealedCredential(<encrypted>)")
    }
}

/// What a verification (or an observation of a node in use) found.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeObservation {
    pub status: NodeStatus,
    /// A new pinned key (first verification, or an accepted key); `None` keeps the stored one.
    pub host_key: Option<String>,
    /// The refused key, with `host_key_changed`; cleared otherwise.
    pub presented_host_key: Option<String>,
    /// New facts; `None` keeps the stored ones.
    pub facts: Option<serde_json::Value>,
    pub last_error: Option<String>,
    /// Set when the node was reached and its key checked.
    pub verified_at: Option<Millis>,
}

/// Changes to a node's labels, visibility or credential.
#[derive(Debug, Clone, Default)]
pub struct NodePatch {
    pub labels: Option<std::collections::BTreeMap<String, String>>,
    /// `Some(None)`: make public; `Some(Some(env))`: private to `env`.
    pub environment: Option<Option<EnvironmentId>>,
    pub credential: Option<(CredentialKind, SealedCredential)>,
}
