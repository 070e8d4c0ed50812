//! The API's own views of what the application hands back: environments, intent versions,
//! resource states, nodes, users, tokens and audit entries as JSON, apart from the store's rows, so the store
//! can change its records without changing the API (and the other way round). Each view is
//! made from its row by `From`; the schema names are the API's.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;

use crate::access::Role;
use crate::app;
use crate::policy::settings::EnvironmentSettings;
use crate::scheduler::{ErrorInfo, ResourceStatus};
use crate::store::{self, AuditId, CredentialKind, EnvironmentId, Millis, NodeStatus, TokenId, UserId};

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Environment {
    #[schema(value_type = String, format = Uuid)]
    id: EnvironmentId,
    name: String,
    settings: EnvironmentSettings,
    halted: bool,
    /// The highest version submitted so far (0 before the first).
    latest_version: i64,
    /// The version the scheduler drives towards, once one is released.
    released_version: Option<i64>,
    created_at: Millis,
    updated_at: Millis,
}

impl From<store::Environment> for Environment {
    fn from(e: store::Environment) -> Environment {
        Environment {
            id: e.id,
            name: e.name,
            settings: e.settings,
            halted: e.halted,
            latest_version: e.latest_version,
            released_version: e.released_version,
            created_at: e.created_at,
            updated_at: e.updated_at,
        }
    }
}

/// An intent version without its document.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct VersionInfo {
    #[schema(value_type = String, format = Uuid)]
    environment: EnvironmentId,
    version: i64,
    created_at: Millis,
    /// When it was last released (a rollback releases an older version again).
    released_at: Option<Millis>,
    /// It is the environment's released version.
    active: bool,
    /// The user who made it; `null`: the host itself (a cluster's watcher), or made before
    /// users existed.
    author: Option<String>,
}

impl From<store::VersionInfo> for VersionInfo {
    fn from(v: store::VersionInfo) -> VersionInfo {
        VersionInfo {
            environment: v.environment,
            version: v.version,
            created_at: v.created_at,
            released_at: v.released_at,
            active: v.active,
            author: v.author,
        }
    }
}

/// The state of one resource.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ResourceState {
    /// `type[node,key]`.
    resource_id: String,
    resource_type: String,
    node: String,
    /// Hash of the desired attributes in `version`.
    desired_hash: String,
    /// Hash of the attributes last enforced successfully.
    deployed_hash: Option<String>,
    status: ResourceStatus,
    /// The intent version this state belongs to.
    version: i64,
    last_deploy_at: Option<Millis>,
    last_verified_at: Option<Millis>,
    attempts: i64,
    last_error: Option<ErrorInfo>,
    next_retry_at: Option<Millis>,
}

impl From<store::ResourceState> for ResourceState {
    fn from(s: store::ResourceState) -> ResourceState {
        ResourceState {
            resource_id: s.resource_id,
            resource_type: s.resource_type,
            node: s.node,
            desired_hash: s.desired_hash,
            deployed_hash: s.deployed_hash,
            status: s.status,
            version: s.version,
            last_deploy_at: s.last_deploy_at,
            last_verified_at: s.last_verified_at,
            attempts: s.attempts,
            last_error: s.last_error,
            next_retry_at: s.next_retry_at,
        }
    }
}

/// A page of resource states, in resource-id order.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct StatePage {
    items: Vec<ResourceState>,
    /// Pass as `after` for the next page; absent on the last page.
    next_after: Option<String>,
}

impl From<store::StatePage> for StatePage {
    fn from(p: store::StatePage) -> StatePage {
        StatePage {
            items: p.items.into_iter().map(ResourceState::from).collect(),
            next_after: p.next_after,
        }
    }
}

/// A node, without its credential.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Node {
    name: String,
    address: String,
    port: u16,
    user: String,
    credential: CredentialKind,
    labels: BTreeMap<String, String>,
    /// The environment it is private to; absent: public.
    #[schema(value_type = Option<String>, format = Uuid)]
    environment: Option<EnvironmentId>,
    /// That environment's name.
    environment_name: Option<String>,
    status: NodeStatus,
    /// The pinned host key fingerprint (`SHA256:…`).
    host_key: Option<String>,
    /// A different host key the node presented, refused until accepted.
    presented_host_key: Option<String>,
    /// Facts gathered at the last verification.
    #[schema(value_type = Option<Object>)]
    facts: Option<serde_json::Value>,
    last_error: Option<String>,
    created_at: Millis,
    updated_at: Millis,
    verified_at: Option<Millis>,
    /// The user who registered it or last changed it (labels, visibility, credential).
    changed_by: Option<String>,
}

impl From<store::NodeRecord> for Node {
    fn from(n: store::NodeRecord) -> Node {
        Node {
            name: n.name,
            address: n.address,
            port: n.port,
            user: n.user,
            credential: n.credential,
            labels: n.labels,
            environment: n.environment,
            environment_name: n.environment_name,
            status: n.status,
            host_key: n.host_key,
            presented_host_key: n.presented_host_key,
            facts: n.facts,
            last_error: n.last_error,
            created_at: n.created_at,
            updated_at: n.updated_at,
            verified_at: n.verified_at,
            changed_by: n.changed_by,
        }
    }
}

/// An API token (its id, never its secret): whose it is, and the roles it carries.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Token {
    #[schema(value_type = String, format = Uuid)]
    pub id: TokenId,
    /// The user it belongs to.
    pub user: String,
    pub description: String,
    pub created_at: Millis,
    /// `null`: all of its user's roles, as they are now; else the narrower set it carries (a
    /// role its user no longer holds grants nothing).
    pub scope: Option<TokenScope>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct TokenScope {
    pub admin: bool,
    pub publisher: bool,
    /// The role per environment, by name.
    #[schema(value_type = Object)]
    pub environments: BTreeMap<String, Role>,
}

impl From<app::TokenView> for Token {
    fn from(t: app::TokenView) -> Token {
        let scope = t.record.scope.map(|s| TokenScope {
            admin: s.admin,
            publisher: s.publisher,
            environments: t.environments.unwrap_or_default(),
        });
        Token {
            id: t.record.id,
            user: t.record.user,
            description: t.record.description,
            created_at: t.record.created_at,
            scope,
        }
    }
}

/// A user (never its password or its hash).
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct User {
    #[schema(value_type = String, format = Uuid)]
    pub id: UserId,
    pub name: String,
    /// Server-wide: everything, in every environment.
    pub admin: bool,
    /// Server-wide: uploads plugins to the registry.
    pub publisher: bool,
    /// A disabled user's tokens fail, and it cannot sign in.
    pub disabled: bool,
    /// Whether it can sign in with a password (`POST /login`).
    pub has_password: bool,
    pub created_at: Millis,
    /// Its role per environment, by name.
    #[schema(value_type = Object)]
    pub environments: BTreeMap<String, Role>,
}

impl User {
    pub fn new(u: store::UserRecord, memberships: &[store::Membership]) -> User {
        User {
            id: u.id,
            name: u.name,
            admin: u.admin,
            publisher: u.publisher,
            disabled: u.disabled,
            has_password: u.has_password,
            created_at: u.created_at,
            environments: memberships.iter().map(|m| (m.environment.clone(), m.role)).collect(),
        }
    }
}

/// A user's role in an environment.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Member {
    pub user: String,
    pub environment: String,
    pub role: Role,
}

impl From<store::Membership> for Member {
    fn from(m: store::Membership) -> Member {
        Member {
            user: m.user,
            environment: m.environment,
            role: m.role,
        }
    }
}

/// One state-changing request of the audit trail.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct AuditEntry {
    #[schema(value_type = String, format = Uuid)]
    pub id: AuditId,
    pub at: Millis,
    /// The user who asked; `null` when the request carried no token the host knows.
    pub user: Option<String>,
    #[schema(value_type = Option<String>, format = Uuid)]
    pub token_id: Option<TokenId>,
    pub method: String,
    /// The route as this document names it (`/environments/{env}/deploy`).
    pub route: String,
    /// The path as requested.
    pub path: String,
    pub environment: Option<String>,
    /// The answer's status.
    pub status: u16,
    /// The error's `code`, when the answer was an error.
    pub code: Option<String>,
    /// The address the request came from, when known.
    pub source: Option<String>,
}

impl From<store::AuditRecord> for AuditEntry {
    fn from(a: store::AuditRecord) -> AuditEntry {
        AuditEntry {
            id: a.id,
            at: a.at,
            user: a.user,
            token_id: a.token_id,
            method: a.method,
            route: a.route,
            path: a.path,
            environment: a.environment,
            status: a.status,
            code: a.code,
            source: a.source,
        }
    }
}
