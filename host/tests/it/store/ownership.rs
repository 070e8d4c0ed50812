//! Leases and the fence under contention: replicas that claim, renew, write and pause at random
//! (a pause longer than the lease is a replica stopped by SIGSTOP), none of them ever giving up
//! writing on its own — the store alone must keep a stale owner out.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use orc_host::policy::settings::EnvironmentSettings;
use orc_host::store::{
    ActionFilter, ActionId, ActionKind, ActionRecord, DbKv, EnvironmentId, Fence, Progress, ReplicaId, Store, StoreError,
};
use orc_runtime::capability::kv::KvStore as _;

use super::harness::{Dice, TestDb};

/// The lease every contender takes: short, so that pauses outlast it often.
const TTL: Duration = Duration::from_millis(250);
/// How long each contender runs.
const RUN: Duration = Duration::from_secs(3);
const CONTENDERS: usize = 3;
const ENVIRONMENTS: usize = 2;

/// A claim that succeeded, when its answer came back.
struct Claimed {
    fence: Fence,
    returned: Instant,
}

/// One fenced write: when it began, and whether the store took it.
struct Written {
    fence: Fence,
    began: Instant,
    action: ActionId,
    taken: bool,
}

#[derive(Default)]
struct Journal {
    claims: Vec<Claimed>,
    writes: Vec<Written>,
}

fn action(fence: &Fence, id: ActionId) -> ActionRecord {
    ActionRecord {
        id,
        environment: fence.env,
        resource_id: "file[web1,/etc/motd]".to_string(),
        kind: ActionKind::Deploy,
        version: Some(1),
        started_at: 1,
        finished_at: 2,
        outcome: "changed".to_string(),
        changes: "[]".to_string(),
        messages: format!(r#"["epoch {}"]"#, fence.epoch),
        error: None,
    }
}

async fn contend(store: Store, me: ReplicaId, envs: Vec<EnvironmentId>, seed: u64, journal: Arc<Mutex<Journal>>) -> Result<()> {
    let mut dice = Dice(seed | 1);
    let mut owned: BTreeMap<EnvironmentId, Fence> = BTreeMap::new();
    let started = Instant::now();
    while started.elapsed() < RUN {
        match dice.below(10) {
            // Claim an environment it does not hold.
            0..=2 => {
                let env = envs[dice.below(envs.len() as u64) as usize];
                if !owned.contains_key(&env)
                    && let Some(fence) = store.claim(&env, me, TTL, None).await?
                {
                    journal.lock().unwrap().claims.push(Claimed {
                        fence,
                        returned: Instant::now(),
                    });
                    owned.insert(env, fence);
                }
            }
            // Renew; what is not renewed is lost.
            3..=4 => {
                let held: Vec<EnvironmentId> = owned.keys().copied().collect();
                let renewed: BTreeSet<EnvironmentId> = store.renew(me, &held, TTL).await?.into_iter().collect();
                owned.retain(|env, _| renewed.contains(env));
            }
            // Write under every fence it believes it holds, renewed or not.
            5..=8 => {
                for fence in owned.values() {
                    let id = ActionId::new();
                    let began = Instant::now();
                    let taken = match store
                        .record_progress(&fence.env, Some(fence), &Progress::of(&[], &[action(fence, id)]))
                        .await
                    {
                        Ok(()) => true,
                        Err(StoreError::Fenced { env, epoch, current }) => {
                            ensure!(env == fence.env && epoch == fence.epoch, "the refusal names the fence");
                            ensure!(current.is_some_and(|c| c > epoch), "refused for a later epoch: {current:?}");
                            false
                        }
                        Err(e) => return Err(e.into()),
                    };
                    journal.lock().unwrap().writes.push(Written {
                        fence: *fence,
                        began,
                        action: id,
                        taken,
                    });
                }
            }
            // Pause, sometimes for longer than the lease.
            _ => tokio::time::sleep(TTL.mul_f64(dice.below(200) as f64 / 100.0)).await,
        }
    }
    Ok(())
}

/// Contenders claim, renew, write under what they believe they own and pause at random. Every
/// write the store took is in the action log and every refused one is not; each claim of an
/// environment gets an epoch of its own, increasing; and no write taken began after a claim of
/// a later epoch had returned — the database refused the stale owner every time.
pub async fn a_stale_owner_never_writes_after_a_takeover(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let mut envs = Vec::new();
    for i in 0..ENVIRONMENTS {
        envs.push(
            store
                .create_environment(&format!("owned-{i}"), &EnvironmentSettings::default())
                .await?
                .id,
        );
    }
    let seed = orc_host::store::now_ms() as u64;
    eprintln!("seed {seed}");
    let journal = Arc::new(Mutex::new(Journal::default()));
    let mut contenders = Vec::new();
    for i in 0..CONTENDERS {
        let me = ReplicaId::random();
        store.register_replica(me, &format!("127.0.0.1:{}", 9000 + i), "test").await?;
        // Each its own pool: a replica is another process.
        let own = db.reopen().await?;
        contenders.push(tokio::spawn(contend(
            own,
            me,
            envs.clone(),
            seed.wrapping_mul(i as u64 + 7),
            journal.clone(),
        )));
    }
    for c in contenders {
        c.await??;
    }
    let journal = std::mem::take(&mut *journal.lock().unwrap());

    let mut logged = BTreeSet::new();
    for env in &envs {
        let page = store
            .list_actions(
                env,
                &ActionFilter {
                    limit: 10_000,
                    ..ActionFilter::default()
                },
            )
            .await?;
        logged.extend(page.items.iter().map(|a| a.action.id));
    }
    for w in &journal.writes {
        ensure!(
            logged.contains(&w.action) == w.taken,
            "a write under epoch {} was {} but is {} the log",
            w.fence.epoch,
            if w.taken { "taken" } else { "refused" },
            if w.taken { "not in" } else { "in" }
        );
    }
    for env in &envs {
        let mut claims: Vec<&Claimed> = journal.claims.iter().filter(|c| c.fence.env == *env).collect();
        claims.sort_by_key(|c| c.returned);
        let epochs: Vec<i64> = claims.iter().map(|c| c.fence.epoch).collect();
        ensure!(
            epochs.windows(2).all(|w| w[0] < w[1]),
            "claims of one environment get increasing epochs, one each: {epochs:?}"
        );
        for w in journal.writes.iter().filter(|w| w.taken && w.fence.env == *env) {
            if let Some(later) = claims.iter().find(|c| c.fence.epoch > w.fence.epoch && c.returned < w.began) {
                anyhow::bail!(
                    "a write under epoch {} was taken though it began {:?} after epoch {} was claimed",
                    w.fence.epoch,
                    w.began - later.returned,
                    later.fence.epoch
                );
            }
        }
    }
    let taken = journal.writes.iter().filter(|w| w.taken).count();
    let refused = journal.writes.len() - taken;
    eprintln!("{} claims, {taken} writes taken, {refused} refused", journal.claims.len());
    ensure!(journal.claims.len() > ENVIRONMENTS, "the environments changed hands");
    ensure!(
        taken > 0 && refused > 0,
        "some writes were taken and some refused ({taken}, {refused})"
    );

    // What the replicas and leases look like from outside.
    let leases = store.leases().await?;
    ensure!(leases.len() == ENVIRONMENTS, "{leases:?}");
    for lease in &leases {
        let last = journal
            .claims
            .iter()
            .filter(|c| c.fence.env == lease.env)
            .map(|c| c.fence.epoch)
            .max();
        ensure!(Some(lease.epoch) == last, "the stored epoch is the last claimed: {lease:?}");
    }
    ensure!(store.replicas().await?.len() == CONTENDERS);
    Ok(())
}

/// A release lets another replica claim at once, under the next epoch; the one that released
/// can no longer write, and a lease not yet expired is not taken.
pub async fn a_released_environment_is_claimed_at_once(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = store.create_environment("handover", &EnvironmentSettings::default()).await?.id;
    let (a, b) = (ReplicaId::random(), ReplicaId::random());
    let long = Duration::from_secs(60);
    let first = store.claim(&env, a, long, None).await?.expect("a fresh environment is free");
    ensure!(store.claim(&env, b, long, None).await?.is_none(), "a live lease is not taken");
    ensure!(store.renew(a, &[env], long).await? == vec![env]);
    store
        .record_progress(&env, Some(&first), &Progress::of(&[], &[action(&first, ActionId::new())]))
        .await?;
    store.release(&env, a).await?;
    ensure!(store.renew(a, &[env], long).await?.is_empty(), "released: not renewed");
    let second = store.claim(&env, b, long, None).await?.expect("released: free at once");
    ensure!(second.epoch == first.epoch + 1, "{first:?} then {second:?}");
    let stale = store
        .record_progress(&env, Some(&first), &Progress::of(&[], &[action(&first, ActionId::new())]))
        .await;
    ensure!(
        matches!(stale, Err(StoreError::Fenced { current: Some(c), .. }) if c == second.epoch),
        "{stale:?}"
    );
    // Claiming what one holds starts a new epoch: the writer's own earlier fence is refused.
    let third = store.claim(&env, b, long, None).await?.expect("its own lease");
    ensure!(third.epoch == second.epoch + 1);
    ensure!(matches!(
        store
            .record_progress(&env, Some(&second), &Progress::of(&[], &[action(&second, ActionId::new())]))
            .await,
        Err(StoreError::Fenced { .. })
    ));
    // A deleted environment has no fence: its owner's writes are refused as such.
    store.delete_environment(&env).await?;
    let gone = store
        .record_progress(&env, Some(&third), &Progress::of(&[], &[action(&third, ActionId::new())]))
        .await;
    ensure!(matches!(gone, Err(StoreError::Fenced { current: None, .. })), "{gone:?}");
    Ok(())
}

/// A replica that has ended lets its leases go at once: while its presence is held it is not
/// gone and its live lease stands; once its presence is dropped (its session closed, as when the
/// process is killed) it is gone on PostgreSQL, and a claim naming it takes the lease without
/// waiting for it to expire. On SQLite one process serves the database: every other holder is
/// an earlier start, gone.
pub async fn an_ended_replica_lets_its_leases_go_at_once(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = store.create_environment("ended", &EnvironmentSettings::default()).await?.id;
    let (a, b) = (ReplicaId::random(), ReplicaId::random());
    let long = Duration::from_secs(60);
    let presence = store.presence(a).await?;
    let first = store.claim(&env, a, long, None).await?.expect("a fresh environment is free");
    let postgres = store.backend() == orc_host::store::Backend::Postgres;
    if postgres {
        ensure!(!store.is_gone(a).await?, "a replica holding its presence is not gone");
        // Asking does not take the lock from it.
        ensure!(!store.is_gone(a).await?);
    } else {
        ensure!(store.is_gone(a).await?, "SQLite: any other holder is an earlier start");
    }
    ensure!(store.claim(&env, b, long, None).await?.is_none(), "a live lease is not taken");
    drop(presence);
    let gone = tokio::time::timeout(Duration::from_secs(10), async {
        while !store.is_gone(a).await? {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok::<_, StoreError>(())
    })
    .await;
    ensure!(matches!(gone, Ok(Ok(()))), "the presence of a dropped session is gone: {gone:?}");
    let second = store.claim(&env, b, long, Some(a)).await?.expect("taken from a replica that ended");
    ensure!(second.epoch == first.epoch + 1, "{first:?} then {second:?}");
    // Naming a gone replica takes only its leases: b's is live and stays b's.
    ensure!(store.claim(&env, a, long, Some(ReplicaId::random())).await?.is_none());
    Ok(())
}

/// Plugin state is fenced like the rest: a write accepted under an epoch that is no longer the
/// environment's is refused when its group commits (the rest of the group is committed), read
/// back neither from memory nor from the database, and counted; once the replica lets the
/// environment go, its writes are refused at once. An environment written unfenced is not held
/// back by another's stale writes.
pub async fn plugin_state_written_under_a_stale_epoch_is_refused(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = store.create_environment("fenced-kv", &EnvironmentSettings::default()).await?.id;
    let other = store.create_environment("unfenced-kv", &EnvironmentSettings::default()).await?.id;
    let (scope, other_scope) = (format!("{env}/plugin"), format!("{other}/plugin"));
    let (a, b) = (ReplicaId::random(), ReplicaId::random());
    let long = Duration::from_secs(60);
    let kv = DbKv::open(store).await?;
    let first = store.claim(&env, a, long, None).await?.expect("free");
    kv.write_under(&first);
    kv.set(&scope, "held", b"1").await?;
    kv.durable().await;
    let refused_before = store.fenced_writes();

    // Taken over: what the old holder accepts now is refused at its commit.
    store.claim(&env, b, long, Some(a)).await?.expect("taken over");
    kv.set(&scope, "stale", b"2").await?;
    kv.set(&other_scope, "unfenced", b"3").await?;
    kv.durable().await;
    ensure!(
        kv.get(&scope, "stale").await?.is_none(),
        "a refused write is not answered from memory"
    );
    let fresh = DbKv::open(store).await?;
    ensure!(fresh.get(&scope, "held").await? == Some(b"1".to_vec()));
    ensure!(
        fresh.get(&scope, "stale").await?.is_none(),
        "nothing of the stale write reached the database"
    );
    ensure!(
        fresh.get(&other_scope, "unfenced").await? == Some(b"3".to_vec()),
        "the rest of the group is committed"
    );
    ensure!(store.fenced_writes() == refused_before + 1, "counted: {}", store.fenced_writes());

    // Let go: refused at once.
    kv.stop_writing(&env);
    ensure!(kv.set(&scope, "after", b"4").await.is_err());
    ensure!(store.fenced_writes() == refused_before + 2);
    Ok(())
}
