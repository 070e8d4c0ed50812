//! Relayed requests (`commands`) under contention: replicas that take the environment from each
//! other at random and claim what waits while a submitter withdraws what waits at random. A
//! command is claimed by one replica at most, only by the lease's holder, and never both
//! claimed and withdrawn; its answer comes back as written.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use orc_host::policy::settings::EnvironmentSettings;
use orc_host::store::{CommandAnswer, CommandId, CommandRecord, CommandState, EnvironmentId, ReplicaId};

use super::harness::{Dice, TestDb};

const COMMANDS: usize = 300;
const REPLICAS: usize = 3;
/// The lease each replica takes: short, so that the holder changes often.
const TTL: Duration = Duration::from_millis(60);

fn command(env: EnvironmentId, by: ReplicaId, i: usize) -> CommandRecord {
    CommandRecord {
        id: CommandId::random(),
        env,
        method: "POST".into(),
        target: format!("/api/v1/environments/prod/deploy?n={i}"),
        headers: vec![("content-type".into(), "application/json".into())],
        body: format!("{{\"n\":{i}}}").into_bytes(),
        credential: "hash".into(),
        submitted_by: by,
    }
}

pub async fn a_relayed_command_is_claimed_once_by_the_holder_or_withdrawn(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = store.create_environment("relayed", &EnvironmentSettings::default()).await?.id;
    let replicas: Vec<ReplicaId> = (0..REPLICAS).map(|_| ReplicaId::random()).collect();
    let submitter = ReplicaId::random();

    // Only the lease's holder claims; an answer reads back as written.
    let first = command(env, submitter, 0);
    store.submit_command(&first).await?;
    ensure!(
        store.claim_commands(&env, replicas[0], 8).await?.is_empty(),
        "no lease: nothing claimed"
    );
    store.claim(&env, replicas[0], Duration::from_secs(60), None).await?.expect("free");
    ensure!(
        store.claim_commands(&env, replicas[1], 8).await?.is_empty(),
        "not the holder: nothing claimed"
    );
    let claimed = store.claim_commands(&env, replicas[0], 8).await?;
    ensure!(claimed == vec![first.clone()], "{claimed:?}");
    ensure!(store.command_state(first.id).await? == CommandState::Claimed(replicas[0]));
    ensure!(!store.withdraw_command(first.id).await?, "a claimed command is not withdrawn");
    let answer = CommandAnswer {
        status: 409,
        headers: vec![("etag".into(), "\"v1\"".into()), ("content-type".into(), "application/json".into())],
        body: b"{\"code\":\"conflict\"}".to_vec(),
        code: Some("conflict".into()),
    };
    store.answer_command(first.id, &answer).await?;
    ensure!(store.command_state(first.id).await? == CommandState::Answered(answer));
    store.forget_command(first.id).await?;
    ensure!(store.command_state(first.id).await? == CommandState::Gone);
    store.release(&env, replicas[0]).await?;

    // Contention: each replica its own pool where the backend allows several.
    let mut stores = Vec::new();
    for _ in 0..REPLICAS {
        stores.push(if store.backend() == orc_host::store::Backend::Postgres {
            db.reopen().await?
        } else {
            store.clone()
        });
    }
    let mut submitted = Vec::with_capacity(COMMANDS);
    for i in 0..COMMANDS {
        let c = command(env, submitter, i + 1);
        store.submit_command(&c).await?;
        submitted.push(c.id);
    }
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64 | 1;
    eprintln!("seed {seed}");
    let claims: Arc<Mutex<Vec<(ReplicaId, CommandId)>>> = Arc::default();
    let withdrawn: Arc<Mutex<Vec<CommandId>>> = Arc::default();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut tasks = Vec::new();
    for (n, (me, s)) in replicas.iter().copied().zip(stores).enumerate() {
        let claims = claims.clone();
        tasks.push(tokio::spawn(async move {
            let mut dice = Dice(seed.wrapping_add(n as u64 * 0x9E37_79B9));
            let mut claimed_any = 0usize;
            while Instant::now() < deadline {
                if dice.below(3) == 0 {
                    let _ = s.claim(&env, me, TTL, None).await?;
                }
                let got = s.claim_commands(&env, me, 1 + dice.below(8) as i64).await?;
                claimed_any += got.len();
                claims.lock().unwrap().extend(got.iter().map(|c| (me, c.id)));
                if s.environments_with_commands().await?.is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(dice.below(15))).await;
            }
            Ok::<_, anyhow::Error>(claimed_any)
        }));
    }
    {
        let (s, withdrawn, ids) = (store.clone(), withdrawn.clone(), submitted.clone());
        tasks.push(tokio::spawn(async move {
            let mut dice = Dice(seed ^ 0x5555);
            let mut count = 0;
            while Instant::now() < deadline {
                let id = ids[dice.below(ids.len() as u64) as usize];
                if s.withdraw_command(id).await? {
                    withdrawn.lock().unwrap().push(id);
                    count += 1;
                }
                if s.environments_with_commands().await?.is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(dice.below(10))).await;
            }
            Ok::<_, anyhow::Error>(count)
        }));
    }
    for task in tasks {
        task.await??;
    }

    let claims = claims.lock().unwrap().clone();
    let withdrawn: BTreeSet<CommandId> = withdrawn.lock().unwrap().iter().copied().collect();
    let mut by: BTreeMap<CommandId, Vec<ReplicaId>> = BTreeMap::new();
    for (replica, id) in &claims {
        by.entry(*id).or_default().push(*replica);
    }
    let twice: Vec<_> = by.iter().filter(|(_, r)| r.len() > 1).collect();
    ensure!(twice.is_empty(), "claimed more than once (seed {seed}): {twice:?}");
    let both: Vec<_> = withdrawn.iter().filter(|id| by.contains_key(id)).collect();
    ensure!(both.is_empty(), "claimed and withdrawn (seed {seed}): {both:?}");
    ensure!(
        by.len() + withdrawn.len() == COMMANDS,
        "every command ends claimed or withdrawn (seed {seed}): {} + {} of {COMMANDS}",
        by.len(),
        withdrawn.len()
    );
    let holders: BTreeSet<ReplicaId> = claims.iter().map(|(r, _)| *r).collect();
    eprintln!("{} claimed by {} replicas, {} withdrawn", by.len(), holders.len(), withdrawn.len());
    for id in &submitted {
        let state = store.command_state(*id).await?;
        match by.get(id) {
            Some(r) => ensure!(state == CommandState::Claimed(r[0]), "{id}: {state:?}"),
            None => ensure!(state == CommandState::Gone, "{id}: {state:?}"),
        }
    }
    Ok(())
}
