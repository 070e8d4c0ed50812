//! The records the store keeps, as Rust values: environments, intent versions, resource states
//! and their status transitions, the action log, operations and dryrun reports, users, tokens, memberships and the audit trail,
//! nodes. (Typed ids are in `ids`, settings in [`crate::policy::settings`], the resource status
//! in [`crate::status`].) JSON documents (intents, changes, messages, reports) travel as JSON text: the store
//! keeps them verbatim and never looks inside.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::ids::*;
use crate::named::named_enum;
use crate::policy::settings::EnvironmentSettings;
use crate::status::{ErrorInfo, ResourceStatus};

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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    pub environment: EnvironmentId,
    pub version: i64,
    pub created_at: Millis,
    /// When it was last released (a rollback releases an older version again).
    pub released_at: Option<Millis>,
    /// It is the environment's released version.
    pub active: bool,
    /// The user who made it; `None`: the host itself (a cluster watcher), or made before users.
    pub author: Option<String>,
}

/// An intent version with its immutable document (JSON text).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntentVersion {
    #[serde(flatten)]
    pub info: VersionInfo,
    pub document: String,
}

/// The state of one resource in one environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatePage {
    pub items: Vec<ResourceState>,
    /// Pass as `after` for the next page; `None` on the last page.
    pub next_after: Option<String>,
}

/// One entry of the action log, as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedAction {
    /// Insertion order, increasing; the pagination cursor.
    pub seq: i64,
    #[serde(flatten)]
    pub action: ActionRecord,
}

/// Filters and page of [`Store::list_actions`](super::Store::list_actions). Newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionPage {
    pub items: Vec<LoggedAction>,
    /// Pass as `before` for the next (older) page; `None` on the last page.
    pub next_before: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DryrunReport {
    pub id: DryrunId,
    pub environment: EnvironmentId,
    pub version: i64,
    pub status: DryrunStatus,
    pub created_at: Millis,
    pub finished_at: Option<Millis>,
    /// JSON text, once finished.
    pub report: Option<String>,
    /// The user who started it.
    pub author: Option<String>,
}

/// A user-triggered deploy or repair and, once the scheduler has settled, its outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    pub id: OperationId,
    pub environment: EnvironmentId,
    pub kind: OperationKind,
    pub status: OperationStatus,
    pub created_at: Millis,
    pub finished_at: Option<Millis>,
    /// JSON text, once finished.
    pub result: Option<String>,
    /// The user who started it.
    pub author: Option<String>,
}

/// A user, as stored (the password's hash is read only to check a password).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRecord {
    pub id: UserId,
    pub name: String,
    pub admin: bool,
    pub publisher: bool,
    pub disabled: bool,
    pub has_password: bool,
    pub created_at: Millis,
}

/// An API token (never its secret): whose it is, the narrower roles it carries if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    pub id: TokenId,
    pub user_id: UserId,
    pub user: String,
    pub scope: Option<crate::access::Scope>,
    pub description: String,
    pub created_at: Millis,
}

/// A user's role in an environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub user_id: UserId,
    pub user: String,
    pub environment_id: EnvironmentId,
    pub environment: String,
    pub role: crate::access::Role,
}

/// One state-changing request, as the audit trail keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    pub id: AuditId,
    pub at: Millis,
    pub user_id: Option<UserId>,
    pub user: Option<String>,
    pub token_id: Option<TokenId>,
    pub method: String,
    pub route: String,
    pub path: String,
    pub environment: Option<String>,
    pub status: u16,
    pub code: Option<String>,
    /// The address the request came from (`None`: not known, or recorded before addresses were).
    pub source: Option<String>,
}

/// Which audit entries to list: newest first, before `before` (a cursor), at most `limit`.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub user: Option<String>,
    pub environment: Option<String>,
    pub since: Option<Millis>,
    pub until: Option<Millis>,
    /// Only refused or failed requests (status 400 and above), or only the others.
    pub failed: Option<bool>,
    pub before: Option<AuditId>,
    pub limit: u32,
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    pub facts: Option<serde_json::Value>,
    pub last_error: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub verified_at: Option<Millis>,
    /// The user who registered it or last changed it (labels, visibility, credential).
    pub changed_by: Option<String>,
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
    /// The user who registers it.
    pub changed_by: Option<String>,
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
    /// The user who makes the change.
    pub changed_by: Option<String>,
}
