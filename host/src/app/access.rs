//! Users, their roles per environment, their tokens, signing in with a password, and the audit
//! trail. [`App::authenticate`] turns a bearer token into the [`Principal`] the API's
//! authorization layer decides with; principals are cached by token hash and the cache is
//! dropped on every change of users, roles, tokens or environment names, which also wakes open
//! event streams ([`App::access_changed`]) so they check their token again.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use std::num::NonZeroU32;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tokio::sync::watch;

use super::{AccessError, App, EnvError};
use crate::access::{Principal, Role, Scope, password};
use crate::store::{
    AuditFilter, AuditId, AuditRecord, ConsoleSession, Membership, Millis, StoreError, TokenId, TokenRecord, UserChange, UserRecord,
    hash_token,
};

/// Most principals kept; past it the cache starts over.
const CACHE_ENTRIES: usize = 10_000;

/// The cache of principals by token hash, the generation of access (bumped on each change),
/// and each token's request rate.
pub(super) struct AccessCache {
    principals: std::sync::Mutex<HashMap<String, Arc<Principal>>>,
    changed: watch::Sender<u64>,
    rates: Option<DefaultKeyedRateLimiter<TokenId>>,
}

impl AccessCache {
    /// `per_s` requests per second per token on average, `burst` at once above it; no limit
    /// when `per_s` is 0.
    pub(super) fn new(per_s: u32, burst: u32) -> AccessCache {
        let rates = NonZeroU32::new(per_s).map(|per_s| {
            let burst = NonZeroU32::new(burst).unwrap_or(per_s);
            RateLimiter::keyed(Quota::per_second(per_s).allow_burst(burst))
        });
        AccessCache {
            principals: std::sync::Mutex::new(HashMap::new()),
            changed: watch::channel(0).0,
            rates,
        }
    }
}

/// A user to create. No `Debug`: it holds a password.
#[derive(Clone, Default)]
pub struct NewUser {
    pub name: String,
    pub password: Option<String>,
    pub admin: bool,
    pub publisher: bool,
}

/// A change of a user; `None` leaves a field. `password: Some(None)` removes the password. No
/// `Debug`: it holds a password.
#[derive(Clone, Default)]
pub struct UserPatch {
    pub password: Option<Option<String>>,
    pub admin: Option<bool>,
    pub publisher: Option<bool>,
    pub disabled: Option<bool>,
}

/// The roles a new token asks for, environments by name or id; `None` in a request: all of its
/// user's.
#[derive(Debug, Clone, Default)]
pub struct ScopeRequest {
    pub admin: bool,
    pub publisher: bool,
    pub environments: BTreeMap<String, Role>,
}

/// A token as shown: its record and its scope's environments by name.
#[derive(Debug, Clone)]
pub struct TokenView {
    pub record: TokenRecord,
    pub environments: Option<BTreeMap<String, Role>>,
}

/// The longest user name.
pub const MAX_USER_NAME: usize = 64;
/// The longest token description.
pub const MAX_DESCRIPTION: usize = 200;

fn validate_user_name(name: &str) -> Result<(), AccessError> {
    let invalid = |reason: &str| AccessError::InvalidUser {
        field: "name",
        reason: reason.to_string(),
    };
    if name.is_empty() || name.len() > MAX_USER_NAME {
        return Err(invalid(&format!("must have 1–{MAX_USER_NAME} characters")));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
    {
        return Err(invalid("may hold only ASCII letters, digits, `-`, `_`, `.` and `@`"));
    }
    Ok(())
}

/// A new secret (a token's, a console session's): `orc_` and 64 hex digits.
pub(crate) fn new_secret() -> String {
    // Two v4 UUIDs: 244 bits from the operating system's random source.
    format!("orc_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

impl App {
    /// Records a console session (what its cookie stands for; `console::session` decides the
    /// rest), forgetting those unused since `idle_before` and, past `max`, the least recent.
    pub async fn start_console_session(&self, session: &ConsoleSession, idle_before: Millis, max: i64) -> Result<(), StoreError> {
        self.store.start_console_session(session, idle_before, max).await
    }

    /// The console session whose cookie hashes to `key`, on whichever replica it started.
    pub async fn console_session(&self, key: &str) -> Result<Option<ConsoleSession>, StoreError> {
        self.store.find_console_session(key).await
    }

    /// Notes that console session `key` was used at `at`.
    pub async fn touch_console_session(&self, key: &str, at: Millis) -> Result<(), StoreError> {
        self.store.touch_console_session(key, at).await
    }

    /// Ends console session `key`, answering what it was.
    pub async fn end_console_session(&self, key: &str) -> Result<Option<ConsoleSession>, StoreError> {
        self.store.end_console_session(key).await
    }

    /// Hashes a password on the password pool ([`super::sign_in`]), off the async workers.
    async fn hash_password(&self, password: String) -> Result<String, AccessError> {
        self.sign_in
            .run(move || password::hash(&password))
            .await?
            .ok_or_else(|| AccessError::Password(password::PasswordError::Hash("the check stopped".into())))?
            .map_err(AccessError::Password)
    }

    /// On a first start (no user yet): the user `admin` (server-wide admin, no password) and a
    /// token for it, returned to be shown once (the store keeps only its sha256). Of replicas
    /// starting together on an empty database, one makes it
    /// ([`crate::store::Store::create_first_admin`]).
    pub(crate) async fn ensure_first_admin(&self) -> Result<Option<String>, StoreError> {
        if self.store.count_users().await? > 0 {
            return Ok(None);
        }
        let secret = new_secret();
        let made = self.store.create_first_admin(&hash_token(&secret)).await?;
        Ok(made.then_some(secret))
    }

    /// The principal of a bearer token: `None` for an unknown token or a disabled user.
    pub async fn authenticate(&self, token: &str) -> Result<Option<Arc<Principal>>, StoreError> {
        self.authenticate_hash(&hash_token(token)).await
    }

    /// The principal of a token by its hash: checks a principal again after a change.
    pub async fn authenticate_hash(&self, hash: &str) -> Result<Option<Arc<Principal>>, StoreError> {
        if let Some(p) = self.access.principals.lock().expect("principal cache").get(hash) {
            return Ok(Some(p.clone()));
        }
        let generation = *self.access.changed.borrow();
        let Some((token_id, scope, account)) = self.store.find_credential(hash).await? else {
            return Ok(None);
        };
        let memberships: Vec<(crate::store::EnvironmentId, String, Role)> = if account.admin {
            // An admin holds every role; a scoped token of an admin names where it is used.
            let mut held = Vec::new();
            for id in scope.iter().flat_map(|s| s.environments.keys()) {
                if let Ok(env) = self.store.get_environment(id).await {
                    held.push((env.id, env.name, Role::Owner));
                }
            }
            held
        } else {
            self.store
                .memberships_of(&account.id)
                .await?
                .into_iter()
                .map(|m| (m.environment_id, m.environment, m.role))
                .collect()
        };
        let Some(mut principal) = Principal::new(&account, token_id, scope.as_ref(), &memberships) else {
            return Ok(None);
        };
        principal.credential = hash.to_string();
        let principal = Arc::new(principal);
        let mut cache = self.access.principals.lock().expect("principal cache");
        // A change while this was read leaves the principal uncached: it may be stale (and so
        // may anything read while other replicas' changes cannot be heard).
        if *self.access.changed.borrow() == generation && self.store.copies_trusted() {
            if cache.len() >= CACHE_ENTRIES {
                cache.clear();
            }
            cache.insert(hash.to_string(), principal.clone());
        }
        Ok(Some(principal))
    }

    /// Counts one request of `caller`'s token: `Err(seconds)` to wait when it is past its rate.
    pub fn count_request(&self, caller: &Principal) -> Result<(), u64> {
        let Some(rates) = &self.access.rates else {
            return Ok(());
        };
        if let Err(not_until) = rates.check_key(&caller.token_id) {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            return Err(wait.as_secs() + u64::from(wait.subsec_nanos() > 0));
        }
        // Forget tokens idle long enough to be back at a full burst, now and then.
        if rates.len() > CACHE_ENTRIES {
            rates.retain_recent();
        }
        Ok(())
    }

    /// The largest body a request for environment `key` may carry, when the environment
    /// narrows the host's limit (`limits.max_body_bytes`).
    pub async fn body_limit(&self, key: &str) -> Option<u64> {
        self.get(key).await.ok().and_then(|env| env.settings.limits.max_body_bytes)
    }

    /// Changes when users, roles, tokens or environment names change: an open event stream
    /// checks its token again.
    pub fn access_changed(&self) -> watch::Receiver<u64> {
        self.access.changed.subscribe()
    }

    /// Forgets every cached principal; the next request of each token reads the store.
    pub(super) fn access_invalidated(&self) {
        self.forget_principals();
        self.store.announce_access_change();
    }

    fn forget_principals(&self) {
        let mut cache = self.access.principals.lock().expect("principal cache");
        cache.clear();
        self.access.changed.send_modify(|g| *g += 1);
    }

    /// Forgets the principals kept whenever another replica changes users, roles or tokens, for
    /// as long as the host runs.
    pub(super) fn follow_access_changes(self: &Arc<Self>) {
        let mut changes = self.store.access_changes();
        let app = Arc::downgrade(self);
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                let Some(app) = app.upgrade() else { return };
                app.forget_principals();
            }
        });
    }

    // Users.

    pub async fn create_user(&self, new: NewUser) -> Result<UserRecord, AccessError> {
        validate_user_name(&new.name)?;
        let hash = match new.password {
            Some(p) => Some(self.hash_password(p).await?),
            None => None,
        };
        let user = self.store.insert_user(&new.name, hash.as_deref(), new.admin, new.publisher).await?;
        tracing::info!(user = %user.name, admin = user.admin, publisher = user.publisher, "user created");
        Ok(user)
    }

    pub async fn users(&self) -> Result<Vec<UserRecord>, AccessError> {
        Ok(self.store.list_users().await?)
    }

    pub async fn user(&self, name: &str) -> Result<UserRecord, AccessError> {
        self.store
            .find_user(name)
            .await?
            .ok_or_else(|| AccessError::UnknownUser(name.chars().take(100).collect()))
    }

    /// The environments a user has a role in.
    pub async fn user_memberships(&self, user: &UserRecord) -> Result<Vec<Membership>, AccessError> {
        Ok(self.store.memberships_of(&user.id).await?)
    }

    /// Changes a user; disabling one fails its tokens at once. Refused when no enabled admin
    /// would keep a way in.
    pub async fn change_user(&self, name: &str, patch: UserPatch) -> Result<UserRecord, AccessError> {
        let user = self.user(name).await?;
        let password_hash = match patch.password {
            Some(Some(p)) => Some(Some(self.hash_password(p).await?)),
            Some(None) => Some(None),
            None => None,
        };
        let change = UserChange {
            password_hash,
            admin: patch.admin,
            publisher: patch.publisher,
            disabled: patch.disabled,
        };
        self.store.update_user(&user.id, &change).await?;
        self.access_invalidated();
        tracing::info!(user = %user.name, "user changed");
        self.user(name).await
    }

    /// Deletes a user with its tokens (which fail at once) and roles.
    pub async fn delete_user(&self, name: &str) -> Result<(), AccessError> {
        let user = self.user(name).await?;
        self.store.delete_user(&user.id).await?;
        self.access_invalidated();
        tracing::info!(user = %user.name, "user deleted");
        Ok(())
    }

    // Memberships.

    pub async fn members(&self, env: &str) -> Result<Vec<Membership>, AccessError> {
        let env = self.get(env).await?;
        Ok(self.store.members(&env.id).await?)
    }

    pub async fn set_member(&self, env: &str, user: &str, role: Role) -> Result<Membership, AccessError> {
        let env = self.get(env).await?;
        let user = self.user(user).await?;
        self.store.set_membership(&user.id, &env.id, role).await?;
        self.access_invalidated();
        Ok(Membership {
            user_id: user.id,
            user: user.name,
            environment_id: env.id,
            environment: env.name,
            role,
        })
    }

    pub async fn remove_member(&self, env: &str, user: &str) -> Result<(), AccessError> {
        let env = self.get(env).await?;
        let user = self.user(user).await?;
        if !self.store.delete_membership(&user.id, &env.id).await? {
            return Err(StoreError::not_found(format!("a role of user `{}` in environment `{}`", user.name, env.name)).into());
        }
        self.access_invalidated();
        Ok(())
    }

    // Tokens.

    /// A new token of `user` carrying `scope` (all of the user's roles when `None`): the record
    /// and the secret, which only its creator ever sees. A scope may not ask for a role the user
    /// does not hold.
    pub async fn create_token(
        &self,
        user: &str,
        scope: Option<ScopeRequest>,
        description: &str,
    ) -> Result<(TokenView, String), AccessError> {
        let user = self.user(user).await?;
        let scope = match scope {
            Some(request) => Some(self.resolve_scope(&user, request).await?),
            None => None,
        };
        self.issue_token(&user, scope.as_ref(), description).await
    }

    /// A new token of the caller's own user. A caller whose token is scoped hands on no more
    /// than it carries: without `scope` the new token carries the caller's roles, and a `scope`
    /// asking for more is refused, naming the role.
    pub async fn create_own_token(
        &self,
        caller: &Principal,
        scope: Option<ScopeRequest>,
        description: &str,
    ) -> Result<(TokenView, String), AccessError> {
        let Some(bound) = caller.narrowed() else {
            return self.create_token(&caller.user, scope, description).await;
        };
        let user = self.user(&caller.user).await?;
        let scope = match scope {
            None => bound,
            Some(request) => {
                let scope = self.resolve_scope(&user, request).await?;
                self.check_within(&scope, &bound, &caller.user).await?;
                scope
            }
        };
        self.issue_token(&user, Some(&scope), description).await
    }

    /// Refuses a scope that asks for a role `bound` (the caller's token's) does not carry.
    async fn check_within(&self, scope: &Scope, bound: &Scope, user: &str) -> Result<(), AccessError> {
        let beyond = |what: String| {
            Err(AccessError::InvalidScope(format!(
                "{what}, more than the token of user `{user}` making this request carries"
            )))
        };
        if scope.admin && !bound.admin {
            return beyond("`admin`".into());
        }
        if scope.publisher && !(bound.publisher || bound.admin) {
            return beyond("`publisher`".into());
        }
        if bound.admin {
            return Ok(());
        }
        for (id, role) in &scope.environments {
            if bound.environments.get(id).is_none_or(|held| held < role) {
                let name = self
                    .store
                    .get_environment(id)
                    .await
                    .map(|e| e.name)
                    .unwrap_or_else(|_| id.to_string());
                return beyond(format!("`{role}` in environment `{name}`"));
            }
        }
        Ok(())
    }

    /// Stores a new token of `user` carrying `scope`: the view and the secret.
    async fn issue_token(&self, user: &UserRecord, scope: Option<&Scope>, description: &str) -> Result<(TokenView, String), AccessError> {
        if user.disabled {
            return Err(AccessError::InvalidUser {
                field: "user",
                reason: format!("`{}` is disabled", user.name),
            });
        }
        if description.chars().count() > MAX_DESCRIPTION {
            return Err(AccessError::InvalidUser {
                field: "description",
                reason: format!("may have at most {MAX_DESCRIPTION} characters"),
            });
        }
        let secret = new_secret();
        let record = self.store.insert_token(&hash_token(&secret), &user.id, scope, description).await?;
        tracing::info!(user = %user.name, token = %record.id, scoped = record.scope.is_some(), "token created");
        Ok((self.token_view(record).await?, secret))
    }

    async fn resolve_scope(&self, user: &UserRecord, request: ScopeRequest) -> Result<Scope, AccessError> {
        if request.admin && !user.admin {
            return Err(AccessError::InvalidScope(format!("user `{}` is not an admin", user.name)));
        }
        if request.publisher && !(user.publisher || user.admin) {
            return Err(AccessError::InvalidScope(format!("user `{}` is not a publisher", user.name)));
        }
        let held = self.store.memberships_of(&user.id).await?;
        let mut environments = BTreeMap::new();
        for (key, role) in request.environments {
            let env = self.get(&key).await.map_err(|e| match e {
                EnvError::UnknownEnvironment(_) => AccessError::InvalidScope(format!(
                    "environment `{}` does not exist",
                    key.chars().take(100).collect::<String>()
                )),
                other => other.into(),
            })?;
            if !user.admin {
                match held.iter().find(|m| m.environment_id == env.id) {
                    Some(m) if m.role >= role => {}
                    Some(m) => {
                        return Err(AccessError::InvalidScope(format!(
                            "`{role}` in environment `{}`, where user `{}` holds `{}`",
                            env.name, user.name, m.role
                        )));
                    }
                    None => {
                        return Err(AccessError::InvalidScope(format!(
                            "`{role}` in environment `{}`, where user `{}` has no role",
                            env.name, user.name
                        )));
                    }
                }
            }
            environments.insert(env.id, role);
        }
        Ok(Scope {
            admin: request.admin,
            publisher: request.publisher,
            environments,
        })
    }

    async fn token_view(&self, record: TokenRecord) -> Result<TokenView, AccessError> {
        let environments = match &record.scope {
            None => None,
            Some(scope) => {
                let mut named = BTreeMap::new();
                for (id, role) in &scope.environments {
                    // An environment deleted since keeps its id in the scope, granting nothing.
                    let name = match self.store.get_environment(id).await {
                        Ok(env) => env.name,
                        Err(StoreError::NotFound { .. }) => id.to_string(),
                        Err(e) => return Err(e.into()),
                    };
                    named.insert(name, *role);
                }
                Some(named)
            }
        };
        Ok(TokenView { record, environments })
    }

    /// The tokens `caller` may see: its own, or everyone's for an admin.
    pub async fn tokens(&self, caller: &Principal) -> Result<Vec<TokenView>, AccessError> {
        let records = if caller.is_admin() {
            self.store.list_tokens(None).await?
        } else {
            self.store.list_tokens(Some(&caller.user_id)).await?
        };
        let mut views = Vec::with_capacity(records.len());
        for record in records {
            views.push(self.token_view(record).await?);
        }
        Ok(views)
    }

    /// Revokes a token at once (also the one making this call); another user's token is
    /// unknown to a caller who is not an admin.
    pub async fn delete_token(&self, caller: &Principal, id: &TokenId) -> Result<(), AccessError> {
        let record = match self.store.get_token(id).await {
            Ok(record) => record,
            Err(StoreError::NotFound { .. }) => return Err(AccessError::UnknownToken(id.to_string())),
            Err(e) => return Err(e.into()),
        };
        if record.user_id != caller.user_id && !caller.is_admin() {
            return Err(AccessError::UnknownToken(id.to_string()));
        }
        self.store.delete_token(id).await?;
        self.access_invalidated();
        tracing::info!(user = %record.user, token = %id, "token revoked");
        Ok(())
    }

    /// Signs in with a name and password from `source` (the client's address, when known): a
    /// new token of the user (with `scope`, if given). Every wrong name, wrong password and
    /// disabled user takes as long and says the same; throttled and busy attempts are refused
    /// before the store is read ([`super::sign_in`]).
    pub async fn login(
        &self,
        name: &str,
        password: &str,
        scope: Option<ScopeRequest>,
        description: &str,
        source: Option<std::net::IpAddr>,
    ) -> Result<(TokenView, String), AccessError> {
        self.sign_in.attempt(source, name)?;
        let turn = self.sign_in.turn().await?;
        let found = self.store.find_user_with_password(name).await?;
        let stored = found.as_ref().and_then(|(_, hash)| hash.clone());
        let password = password.to_string();
        let matches = turn
            .run(move || password::verify(&password, stored.as_deref()))
            .await
            .unwrap_or(false);
        match found {
            Some((user, _)) if matches && !user.disabled => self.create_token(&user.name, scope, description).await,
            _ => Err(AccessError::WrongCredentials),
        }
    }

    // The audit trail.

    /// Records one state-changing request, written shortly (see [`super::audit`]). A failure is
    /// logged, not answered: the request's outcome stands.
    pub fn record_audit(&self, entry: AuditRecord) {
        self.audit.record(entry);
    }

    /// The entries `filter` selects, every entry recorded before this call among them.
    pub async fn audit(&self, filter: &AuditFilter) -> Result<(Vec<AuditRecord>, Option<AuditId>), AccessError> {
        self.audit.flush().await;
        Ok(self.store.list_audit(filter).await?)
    }
}
