//! Who may do what: the roles ([`Role`] per environment, [`ServerRole`] server-wide), what a
//! token carries ([`Scope`], [`Principal`]), the one table of which route needs which role
//! ([`rules`]) and the one decision ([`Principal::allows`]). Passwords are hashed and checked in
//! [`password`].
//!
//! Architecture invariant: authorization is decided here, once per request, before the
//! application layer (`api::auth` asks [`rules::rule`] and [`Principal::allows`]); the
//! application only narrows what a caller *lists* (environments, nodes, tokens) with the same
//! [`Principal`].

pub mod password;
pub mod rules;

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::named::named_enum;
use crate::store::{EnvironmentId, TokenId, UserId};

named_enum!(
    /// A user's role in one environment; each includes the ones before it.
    Role("role") {
        /// Reads everything of the environment: resources, versions, events, the action log.
        Viewer => "viewer",
        /// Also deploys, repairs, dryruns, halts and resumes, and runs cluster operations.
        Operator => "operator",
        /// Also changes settings, submits, releases and rolls back intents, edits templates and
        /// clusters, manages members, and makes nodes private to the environment.
        Owner => "owner",
    }
);

named_enum!(
    /// A server-wide role.
    ServerRole("server role") {
        /// Everything, in every environment: users, nodes, tokens, plugins, environments.
        Admin => "admin",
        /// Uploads plugins to the registry.
        Publisher => "publisher",
    }
);

/// The narrower set of roles a token carries instead of all of its user's. A role in it that
/// its user lacks grants nothing: what a token may do is always within what its user may do now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scope {
    #[serde(default)]
    pub admin: bool,
    #[serde(default)]
    pub publisher: bool,
    /// The role per environment, by id.
    #[serde(default)]
    pub environments: BTreeMap<EnvironmentId, Role>,
}

/// What the route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Nothing: no credential needed.
    Open,
    /// Any valid credential (what it shows is narrowed to the caller).
    Signed,
    /// A server-wide role (admin includes publisher).
    Server(ServerRole),
    /// A role in the environment the path names (`{env}`); admin has every role everywhere.
    Environment(Role),
}

impl Rule {
    /// The requirement in words, for the OpenAPI document and refusals.
    pub fn describe(self) -> String {
        match self {
            Rule::Open => "no credential".to_string(),
            Rule::Signed => "any valid token".to_string(),
            Rule::Server(role) => format!("the server-wide `{role}` role"),
            Rule::Environment(role) => format!("the `{role}` role in the environment"),
        }
    }
}

/// A user as the host knows it when a credential is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub id: UserId,
    pub name: String,
    pub admin: bool,
    pub publisher: bool,
    pub disabled: bool,
}

/// The caller of a request: its user and token, and the roles the token carries now (its
/// user's, narrowed by the token's scope).
#[derive(Debug, Clone)]
pub struct Principal {
    pub user_id: UserId,
    pub user: String,
    pub token_id: TokenId,
    /// The hash of the token (as stored), to check it again ([`crate::app::App::authenticate_hash`]).
    pub credential: String,
    admin: bool,
    publisher: bool,
    by_id: HashMap<EnvironmentId, Role>,
    by_name: HashMap<String, Role>,
    /// Its token carries a scope: what it may hand on is bounded by these roles, not its user's.
    scoped: bool,
}

impl Principal {
    /// `memberships`: the user's environments (id, name, role); for an admin user, `owner` in
    /// each environment its token's scope names. A disabled user has no principal (its tokens
    /// fail).
    pub fn new(
        account: &Account,
        token_id: TokenId,
        scope: Option<&Scope>,
        memberships: &[(EnvironmentId, String, Role)],
    ) -> Option<Principal> {
        if account.disabled {
            return None;
        }
        let mut by_id = HashMap::new();
        let mut by_name = HashMap::new();
        match scope {
            None => {
                for (id, name, role) in memberships {
                    by_id.insert(*id, *role);
                    by_name.insert(name.clone(), *role);
                }
            }
            Some(scope) => {
                for (id, name, held) in memberships {
                    if let Some(granted) = scope.environments.get(id) {
                        by_id.insert(*id, (*held).min(*granted));
                        by_name.insert(name.clone(), (*held).min(*granted));
                    }
                }
            }
        }
        Some(Principal {
            user_id: account.id,
            user: account.name.clone(),
            token_id,
            credential: String::new(),
            admin: account.admin && scope.is_none_or(|s| s.admin),
            publisher: (account.admin || account.publisher) && scope.is_none_or(|s| s.admin || s.publisher),
            by_id,
            by_name,
            scoped: scope.is_some(),
        })
    }

    /// The roles this caller carries, as a scope — for a token a scoped token creates, which may
    /// carry no more than its creator does; `None`: the caller carries all of its user's roles.
    pub fn narrowed(&self) -> Option<Scope> {
        self.scoped.then(|| Scope {
            admin: self.admin,
            publisher: self.publisher,
            environments: self.by_id.iter().map(|(id, role)| (*id, *role)).collect(),
        })
    }

    pub fn is_admin(&self) -> bool {
        self.admin
    }

    /// The role this caller holds in the environment named by `key` (a name or an id).
    pub fn role_in(&self, key: &str) -> Option<Role> {
        if self.admin {
            return Some(Role::Owner);
        }
        match key.parse::<EnvironmentId>() {
            Ok(id) => self.by_id.get(&id).copied(),
            Err(_) => self.by_name.get(key).copied(),
        }
    }

    /// The role this caller holds in the environment with this id.
    pub fn role_in_id(&self, id: &EnvironmentId) -> Option<Role> {
        if self.admin {
            Some(Role::Owner)
        } else {
            self.by_id.get(id).copied()
        }
    }

    /// Whether `rule` lets this caller through, for a path naming environment `env` (if any);
    /// a refusal says what is missing.
    pub fn allows(&self, rule: Rule, env: Option<&str>) -> Result<(), Forbidden> {
        let refuse = |message: String| Err(Forbidden { message });
        match rule {
            Rule::Open | Rule::Signed => Ok(()),
            Rule::Server(ServerRole::Admin) if self.admin => Ok(()),
            Rule::Server(ServerRole::Publisher) if self.publisher => Ok(()),
            Rule::Server(role) => refuse(format!(
                "this needs the server-wide `{role}` role, which the token of user `{}` does not carry",
                self.user
            )),
            Rule::Environment(needed) => {
                let Some(env) = env else {
                    return refuse(format!("this needs the `{needed}` role in an environment, and the path names none"));
                };
                match self.role_in(env) {
                    Some(held) if held >= needed => Ok(()),
                    Some(held) => refuse(format!(
                        "this needs the `{needed}` role in environment `{}`; the token of user `{}` carries `{held}` there",
                        shown(env),
                        self.user
                    )),
                    None => refuse(format!(
                        "this needs the `{needed}` role in environment `{}`; the token of user `{}` carries no role there",
                        shown(env),
                        self.user
                    )),
                }
            }
        }
    }
}

/// A key from a path, shortened for a message.
fn shown(key: &str) -> String {
    key.chars().take(100).collect()
}

/// A refusal for want of a role (403 `forbidden`), naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Forbidden {
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(admin: bool, publisher: bool) -> Account {
        Account {
            id: UserId::random(),
            name: "ann".into(),
            admin,
            publisher,
            disabled: false,
        }
    }

    #[test]
    fn roles_include_the_ones_before_them_and_a_scope_only_narrows() {
        let prod = EnvironmentId::random();
        let dev = EnvironmentId::random();
        let member = [(prod, "prod".to_string(), Role::Operator), (dev, "dev".to_string(), Role::Viewer)];
        let user = Principal::new(&account(false, false), TokenId::random(), None, &member).unwrap();
        assert!(user.allows(Rule::Environment(Role::Viewer), Some("prod")).is_ok());
        assert!(user.allows(Rule::Environment(Role::Operator), Some(&prod.to_string())).is_ok());
        let e = user.allows(Rule::Environment(Role::Owner), Some("prod")).unwrap_err();
        assert!(
            e.message.contains("`owner`") && e.message.contains("carries `operator`"),
            "{}",
            e.message
        );
        assert!(user.allows(Rule::Environment(Role::Viewer), Some("other")).is_err());
        assert!(user.allows(Rule::Server(ServerRole::Publisher), None).is_err());

        // A scope asking for more than the user holds gets what the user holds, no more.
        let scope = Scope {
            admin: true,
            publisher: true,
            environments: [(prod, Role::Owner)].into(),
        };
        let token = Principal::new(&account(false, false), TokenId::random(), Some(&scope), &member).unwrap();
        assert_eq!(token.role_in("prod"), Some(Role::Operator));
        assert_eq!(token.role_in("dev"), None, "not in the scope");
        assert!(!token.is_admin());
        assert!(token.allows(Rule::Server(ServerRole::Publisher), None).is_err());
    }

    #[test]
    fn an_admin_holds_everything_unless_its_token_is_scoped() {
        let prod = EnvironmentId::random();
        let admin = Principal::new(&account(true, false), TokenId::random(), None, &[]).unwrap();
        assert!(admin.allows(Rule::Environment(Role::Owner), Some("anything")).is_ok());
        assert!(admin.allows(Rule::Server(ServerRole::Publisher), None).is_ok());
        let scope = Scope {
            environments: [(prod, Role::Viewer)].into(),
            ..Scope::default()
        };
        let viewer = Principal::new(
            &account(true, false),
            TokenId::random(),
            Some(&scope),
            &[(prod, "prod".into(), Role::Owner)],
        )
        .unwrap();
        assert!(!viewer.is_admin());
        assert_eq!(viewer.role_in("prod"), Some(Role::Viewer));
        assert!(viewer.allows(Rule::Server(ServerRole::Admin), None).is_err());
        let disabled = Account {
            disabled: true,
            ..account(true, false)
        };
        assert!(Principal::new(&disabled, TokenId::random(), None, &[]).is_none());
    }
}
