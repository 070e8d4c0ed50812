//! The no-lock-out invariant: whatever sequence of changes to users and tokens is made, a way in
//! that can act as admin remains — an enabled admin with a password, or a token of an enabled
//! admin that is unscoped or whose scope includes `admin`. Checked against a model: generated
//! sequences of changes, each removal accepted exactly when the model says a way in remains,
//! refused (and changing nothing) otherwise; and two removals racing for the last two ways in.

use std::collections::BTreeMap;

use anyhow::{Result, ensure};
use orc_host::access::Scope;
use orc_host::store::{Store, StoreError, TokenId, UserChange, UserId, hash_token};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::harness::TestDb;

/// How many users a sequence plays with (beside the first admin).
const USERS: usize = 4;

/// A token as the model sees it: unscoped (`None`), or scoped with or without `admin`.
type TokenModel = Option<bool>;

#[derive(Debug, Clone, Default)]
struct UserModel {
    id: Option<UserId>,
    admin: bool,
    disabled: bool,
    password: bool,
    tokens: BTreeMap<TokenId, TokenModel>,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    CreateUser { user: usize, admin: bool, password: bool },
    CreateToken { user: usize, scope: TokenModel },
    DeleteToken { user: usize, nth: usize },
    Disable(usize, bool),
    Admin(usize, bool),
    Password(usize, bool),
    DeleteUser(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let user = 0..=USERS;
    prop_oneof![
        (user.clone(), any::<bool>(), any::<bool>()).prop_map(|(user, admin, password)| Op::CreateUser { user, admin, password }),
        (user.clone(), prop_oneof![Just(None), any::<bool>().prop_map(Some)]).prop_map(|(user, scope)| Op::CreateToken { user, scope }),
        (user.clone(), 0..3usize).prop_map(|(user, nth)| Op::DeleteToken { user, nth }),
        (user.clone(), any::<bool>()).prop_map(|(u, b)| Op::Disable(u, b)),
        (user.clone(), any::<bool>()).prop_map(|(u, b)| Op::Admin(u, b)),
        (user.clone(), any::<bool>()).prop_map(|(u, b)| Op::Password(u, b)),
        user.prop_map(Op::DeleteUser),
    ]
}

/// Whether the model has a way in that can act as admin.
fn ways_in(users: &[UserModel]) -> bool {
    users
        .iter()
        .any(|u| u.id.is_some() && u.admin && !u.disabled && (u.password || u.tokens.values().any(|scope| scope.is_none_or(|admin| admin))))
}

/// The same, read from what the store holds.
async fn stored_ways_in(store: &Store) -> Result<bool> {
    let users = store.list_users().await?;
    let tokens = store.list_tokens(None).await?;
    Ok(users.iter().any(|u| {
        u.admin && !u.disabled && (u.has_password || tokens.iter().any(|t| t.user_id == u.id && t.scope.as_ref().is_none_or(|s| s.admin)))
    }))
}

fn scope(model: TokenModel) -> Option<Scope> {
    model.map(|admin| Scope {
        admin,
        publisher: !admin,
        ..Scope::default()
    })
}

/// A stored password's hash (the store never checks it).
const HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA";

/// Runs `ops` on a store holding only the first admin (no password, one unscoped token), as a
/// first start leaves it, checking every answer against the model.
async fn run(store: &Store, ops: &[Op]) -> Result<()> {
    let mut users = vec![UserModel::default(); USERS + 1];
    let first = store.insert_user("admin", None, true, false).await?;
    let token = store.insert_token(&hash_token("first"), &first.id, None, "").await?;
    users[0] = UserModel {
        id: Some(first.id),
        admin: true,
        tokens: BTreeMap::from([(token.id, None)]),
        ..UserModel::default()
    };
    for (step, op) in ops.iter().enumerate() {
        let mut after = users.clone();
        // `None`: an addition (always taken), or a change of something not there.
        let outcome: Option<Result<(), StoreError>> = match *op {
            Op::CreateUser { user, admin, password } => {
                if users[user].id.is_none() {
                    let record = store
                        .insert_user(&format!("u{user}-{step}"), password.then_some(HASH), admin, false)
                        .await?;
                    users[user] = UserModel {
                        id: Some(record.id),
                        admin,
                        password,
                        ..UserModel::default()
                    };
                    after = users.clone();
                }
                None
            }
            Op::CreateToken { user, scope: model } => {
                if let Some(id) = users[user].id {
                    let token = store
                        .insert_token(&hash_token(&format!("t{step}")), &id, scope(model).as_ref(), "")
                        .await?;
                    users[user].tokens.insert(token.id, model);
                    after = users.clone();
                }
                None
            }
            Op::DeleteToken { user, nth } => match users[user].tokens.keys().nth(nth).copied() {
                Some(token) => {
                    after[user].tokens.remove(&token);
                    Some(store.delete_token(&token).await)
                }
                None => None,
            },
            Op::Disable(user, disabled) => match users[user].id {
                Some(id) => {
                    after[user].disabled = disabled;
                    let change = UserChange {
                        disabled: Some(disabled),
                        ..UserChange::default()
                    };
                    Some(store.update_user(&id, &change).await)
                }
                None => None,
            },
            Op::Admin(user, admin) => match users[user].id {
                Some(id) => {
                    after[user].admin = admin;
                    let change = UserChange {
                        admin: Some(admin),
                        ..UserChange::default()
                    };
                    Some(store.update_user(&id, &change).await)
                }
                None => None,
            },
            Op::Password(user, set) => match users[user].id {
                Some(id) => {
                    after[user].password = set;
                    let change = UserChange {
                        password_hash: Some(set.then(|| HASH.to_string())),
                        ..UserChange::default()
                    };
                    Some(store.update_user(&id, &change).await)
                }
                None => None,
            },
            Op::DeleteUser(user) => match users[user].id {
                Some(id) => {
                    after[user] = UserModel::default();
                    Some(store.delete_user(&id).await)
                }
                None => None,
            },
        };
        if let Some(outcome) = outcome {
            let allowed = ways_in(&after);
            match outcome {
                Ok(()) => {
                    ensure!(allowed, "step {step}: {op:?} was taken and left no way in that can act as admin");
                    users = after;
                }
                Err(StoreError::Conflict { what }) => {
                    ensure!(!allowed, "step {step}: {op:?} was refused though a way in remains: {what}");
                    ensure!(what.contains("can act as admin"), "step {step}: the refusal says why: {what}");
                }
                Err(e) => return Err(e.into()),
            }
        }
        ensure!(ways_in(&users), "step {step}: the model lost its way in");
        ensure!(
            stored_ways_in(store).await?,
            "step {step}: after {op:?} the store holds no way in that can act as admin"
        );
    }
    Ok(())
}

/// Generated sequences, each on a fresh database of `db`'s backend.
pub async fn no_sequence_of_changes_leaves_no_way_in_that_can_act_as_admin(db: &TestDb) -> Result<()> {
    let postgres = db.location.starts_with("postgres");
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let outcome = tokio::task::block_in_place(|| {
        runner.run(&proptest::collection::vec(op(), 10..60), |ops| {
            tokio::runtime::Handle::current()
                .block_on(async {
                    let fresh = if postgres {
                        super::harness::postgres().await?
                    } else {
                        super::harness::sqlite().await?
                    };
                    run(&fresh.store, &ops).await
                })
                .map_err(|e| TestCaseError::fail(format!("{e:#}")))
        })
    });
    outcome.map_err(|e| anyhow::anyhow!("{e}"))
}

/// Two admins with one token each, the only ways in, and both tokens deleted at once: one
/// removal is taken, the other refused, every time (on PostgreSQL the advisory lock makes the
/// second wait and see the first committed; without it both read the other's token as there).
pub async fn two_removals_racing_for_the_last_two_ways_in_leave_one(db: &TestDb) -> Result<()> {
    let store = &db.store;
    for round in 0..20 {
        let a = store.insert_user(&format!("race{round}-a"), None, true, false).await?;
        let b = store.insert_user(&format!("race{round}-b"), None, true, false).await?;
        let ta = store.insert_token(&hash_token(&format!("race{round}-a")), &a.id, None, "").await?;
        let tb = store.insert_token(&hash_token(&format!("race{round}-b")), &b.id, None, "").await?;
        // The earlier rounds' survivors go, so that these two are the only ways in.
        for user in store.list_users().await? {
            if user.id != a.id && user.id != b.id {
                store.delete_user(&user.id).await?;
            }
        }
        let (ra, rb) = tokio::join!(store.delete_token(&ta.id), store.delete_token(&tb.id));
        let taken = [ra.is_ok(), rb.is_ok()].into_iter().filter(|ok| *ok).count();
        ensure!(
            taken == 1,
            "round {round}: {taken} of two racing removals of the last two ways in were taken: {ra:?} {rb:?}"
        );
        ensure!(stored_ways_in(store).await?, "round {round}: no way in is left");
    }
    Ok(())
}
