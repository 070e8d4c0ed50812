//! This replica's part in the replica set: which environments it runs. Each is **held** under a
//! lease and a fence ([`crate::store::Fence`]) that every write of its scheduler carries. Two
//! tasks keep the holdings: the **renewer** renews every lease each [`Timings::renew`] and
//! stops an environment at once when its lease is gone (another replica may have it), or every
//! environment when the database has not answered for [`Timings::self_fence`], before any lease
//! can expire; the **looker** reads the leases each [`Timings::scan`] (plus jitter), claims what
//! [`crate::replicas::plan`] says is free and this replica's to take, and hands over what is
//! more than its share (a graceful stop, then the lease let go at once). Claims never wait on
//! renewals: a slow start of a large environment cannot make its leases lapse.
//!
//! A request for an environment this replica does not hold claims it only if no replica ever
//! did (a new environment); otherwise it is answered 503 `run_elsewhere`, naming the owner.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use orc_manifest::error_chain;

use super::{App, EnvError};
use crate::replicas::{Plan, Renewals, Seen, Tenure, Timings, plan};
use crate::store::{Environment, EnvironmentId, Epoch, Fence, Presence, ReplicaId, ReplicaRecord, StoreError};

/// A replica and what it holds, as `GET /api/v1/replicas` shows it.
pub struct ReplicaView {
    pub record: ReplicaRecord,
    /// Its heartbeat is younger than a lease and its presence is held (it has not ended).
    pub live: bool,
    /// It is the replica answering.
    pub this: bool,
    pub holds: Vec<HeldView>,
}

/// An environment a replica holds.
pub struct HeldView {
    pub environment: String,
    pub epoch: Epoch,
    /// Until its lease expires unless renewed, by the database's clock.
    pub expires_in_ms: i64,
}

/// What this replica holds.
pub(super) struct Ownership {
    pub(super) me: ReplicaId,
    pub(super) timings: Timings,
    presence: Presence,
    /// When the leases were last renewed: what device writes are judged by ([`Tenure`]).
    renewals: Arc<Renewals>,
    /// Each held environment's tenure, handed to its node directory; ended when it is let go.
    tenures: std::sync::Mutex<HashMap<EnvironmentId, Arc<Tenure>>>,
    started: Instant,
    draining: AtomicBool,
    /// Environments held, with the fence their writes carry. An entry is made right after the
    /// claim, before the environment starts, so the renewer keeps its lease from then on.
    held: std::sync::Mutex<HashMap<EnvironmentId, Fence>>,
    /// Environments being handed over: requests here do not start them again meanwhile.
    letting_go: std::sync::Mutex<HashSet<EnvironmentId>>,
    /// Taken across a claim and its entry in `held`, so that a request never sees a lease this
    /// replica has just claimed before it is held.
    claiming: tokio::sync::Mutex<()>,
}

impl Ownership {
    /// `sole`: the only process on its database (SQLite): its leases last a year, since no one
    /// else could take them, and it never fences itself.
    pub(super) fn new(me: ReplicaId, presence: Presence, timings: Timings, sole: bool) -> Ownership {
        let timings = if sole {
            Timings {
                lease: Duration::from_secs(365 * 24 * 3600),
                ..timings
            }
        } else {
            timings
        };
        Ownership {
            me,
            timings,
            presence,
            renewals: Arc::new(Renewals::new((!sole).then_some(timings.self_fence))),
            tenures: Default::default(),
            started: Instant::now(),
            draining: AtomicBool::new(false),
            held: Default::default(),
            letting_go: Default::default(),
            claiming: tokio::sync::Mutex::new(()),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<EnvironmentId, Fence>> {
        self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn letting_go(&self) -> std::sync::MutexGuard<'_, HashSet<EnvironmentId>> {
        self.letting_go.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The fence of `env` if this replica holds it.
    pub(super) fn fence(&self, env: &EnvironmentId) -> Option<Fence> {
        self.held().get(env).copied()
    }

    /// `env` is deleted: nothing of it is held any more.
    pub(super) fn forget(&self, env: &EnvironmentId) {
        self.held().remove(env);
        self.end_tenure(env);
    }

    /// The tenure of `env` for its node directory, new unless one is current.
    pub(super) fn tenure(&self, env: &EnvironmentId) -> Arc<Tenure> {
        let mut tenures = self.tenures.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match tenures.get(env) {
            Some(t) if t.holds() => t.clone(),
            _ => {
                let t = Arc::new(Tenure::new(self.renewals.clone()));
                tenures.insert(*env, t.clone());
                t
            }
        }
    }

    /// From now on no device write is made for `env` here.
    fn end_tenure(&self, env: &EnvironmentId) {
        let ended = self.tenures.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(env);
        if let Some(t) = ended {
            t.end();
        }
    }

    /// Whether this replica holds `env`.
    pub(super) fn holds(&self, env: &EnvironmentId) -> bool {
        self.held().contains_key(env)
    }
}

/// Up to a quarter of `d` less, at random: looks of replicas started together drift apart.
fn jittered(d: Duration) -> Duration {
    let quarter = d.as_millis() as u64 / 4;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos() as u64;
    d - Duration::from_millis(if quarter == 0 { 0 } else { nanos % quarter })
}

impl App {
    /// The fence to run `env` under here: held already, or claimed now if no replica ever held
    /// it. Otherwise [`EnvError::Elsewhere`], naming the owner if one holds it.
    pub(super) async fn fence_for(&self, env: &Environment) -> Result<Fence, EnvError> {
        let own = &self.ownership;
        let elsewhere = |owner| EnvError::Elsewhere {
            environment: env.name.clone(),
            owner,
        };
        if own.letting_go().contains(&env.id) {
            return Err(elsewhere(None));
        }
        if let Some(fence) = own.fence(&env.id) {
            return Ok(fence);
        }
        let _claiming = own.claiming.lock().await;
        if let Some(fence) = own.fence(&env.id) {
            return Ok(fence);
        }
        let lease = self.store.lease(&env.id).await?;
        let holder = lease.as_ref().and_then(|l| l.holder);
        // SQLite: one process serves the database, so whatever holds a lease is this one or an
        // earlier start: it is taken from them. On PostgreSQL a request claims only what no
        // replica ever held.
        let sole = self.store.backend() == crate::store::Backend::Sqlite;
        if sole || holder.is_none() {
            if let Some(fence) = self
                .store
                .claim(&env.id, own.me, own.timings.lease, holder.filter(|_| sole))
                .await?
            {
                self.now_holds(fence);
                return Ok(fence);
            }
        } else if let Some(holder) = holder.filter(|h| *h != own.me)
            && lease.as_ref().is_some_and(|l| l.expires_in_ms > 0)
        {
            let address = self.store.replicas().await?.into_iter().find(|r| r.id == holder).map(|r| r.address);
            return Err(elsewhere(address));
        }
        // Expired, or being taken: the looker claims it.
        Err(elsewhere(None))
    }

    /// Enters a claimed environment in what is held (under `claiming`), and counts it; its
    /// plugins' state is written under the fence from now on.
    fn now_holds(&self, fence: Fence) {
        self.kv.write_under(&fence);
        let mut held = self.ownership.held();
        held.insert(fence.env, fence);
        self.metrics.took_over(held.len());
    }

    /// Sets the metrics that are read rather than counted: the fenced writes, the lease age.
    pub fn read_replica_metrics(&self) {
        self.metrics.replica(self.store.fenced_writes(), self.ownership.renewals.age());
    }

    /// Claims `env` (taking it from `gone`, a replica known to have ended, if it holds it) and
    /// starts it. `false`: another replica holds it.
    async fn take(self: &Arc<Self>, env: EnvironmentId, gone: Option<ReplicaId>) -> Result<bool, EnvError> {
        let own = &self.ownership;
        {
            let _claiming = own.claiming.lock().await;
            if own.holds(&env) {
                return Ok(true);
            }
            let Some(fence) = self.store.claim(&env, own.me, own.timings.lease, gone).await? else {
                return Ok(false);
            };
            self.now_holds(fence);
        }
        let environment = match self.store.get_environment(&env).await {
            Ok(environment) => environment,
            Err(StoreError::NotFound { .. }) => {
                own.held().remove(&env);
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        };
        // A replica that held the environment before may have written its plugins' state since,
        // and registered nodes this one has not seen.
        self.kv.let_go(&format!("{env}/")).await;
        if let Err(e) = self.nodes.refresh().await {
            tracing::warn!(error = %error_chain(&e), "cannot read the nodes again");
        }
        self.running(&environment).await?;
        Ok(true)
    }

    /// Stops running `env` at once: its lease is gone, so another replica may run it. Nothing new
    /// starts; actions in flight finish (a device is not left halfway), and what they report is
    /// refused by the fence: the new owner reads each resource again.
    async fn lose(&self, fence: Fence, why: &str) {
        let env = &fence.env;
        {
            let mut held = self.ownership.held();
            // Claimed again meanwhile (a new epoch): that hold stands.
            if held.get(env) != Some(&fence) {
                return;
            }
            held.remove(env);
            self.metrics.lost(held.len());
        }
        self.kv.stop_writing(env);
        self.ownership.end_tenure(env);
        let running = self.running.lock().await.remove(env);
        tracing::warn!(environment = %env, replica = %self.ownership.me, epoch = fence.epoch, why, "environment lost: stopped here");
        if let Some(running) = running {
            running.ended.send_replace(true);
            self.metrics.forget(&running.name);
            tokio::spawn(async move {
                running.scheduler.stop().await;
            });
        }
    }

    /// Hands `env` over: stopped gracefully (what runs finishes and is recorded), then its lease
    /// let go at once for another replica to claim.
    async fn hand_over(&self, env: &EnvironmentId) {
        let own = &self.ownership;
        own.letting_go().insert(*env);
        let running = self.running.lock().await.remove(env);
        if let Some(running) = running {
            running.ended.send_replace(true);
            self.metrics.forget(&running.name);
            running.scheduler.stop().await;
        }
        // What its actions accepted until now commits under the epoch, which is still its own.
        self.kv.stop_writing(env);
        own.end_tenure(env);
        let was_held = {
            let mut held = own.held();
            let was = held.remove(env).is_some();
            self.metrics.holding(held.len());
            was
        };
        if was_held && let Err(e) = self.store.release(env, own.me).await {
            tracing::warn!(environment = %env, error = %error_chain(&e), "cannot let the lease go: it expires");
        }
        own.letting_go().remove(env);
        tracing::info!(environment = %env, replica = %own.me, "environment handed over");
    }

    /// Takes what is this replica's to take, then keeps it: the renewer, the first look, waited
    /// for (a single replica runs every environment once this returns), then the looker.
    pub async fn start_ownership(self: &Arc<Self>) {
        // The renewer first: what the first look claims is renewed however long it takes to
        // start.
        tokio::spawn(self.clone().renewer());
        self.look().await;
        tokio::spawn(self.clone().looker());
        let this = self.clone();
        tokio::spawn(async move { this.sweep_leases().await });
    }

    async fn renewer(self: Arc<Self>) {
        let own = &self.ownership;
        let mut stopping = self.stopping.subscribe();
        // When the last renewal that succeeded was sent: the leases it renewed run from later.
        let mut renewed_at = Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep(own.timings.renew) => {}
                _ = stopping.changed() => return,
            }
            let held: Vec<Fence> = own.held().values().copied().collect();
            let ids: Vec<EnvironmentId> = held.iter().map(|f| f.env).collect();
            let sent = Instant::now();
            // Bounded: a database that does not answer must not hold the self-fence back.
            let wait = own.timings.self_fence.saturating_sub(renewed_at.elapsed()).max(own.timings.renew);
            match tokio::time::timeout(wait, own.presence.renew(&ids, own.timings.lease)).await {
                Ok(Ok(renewed)) => {
                    renewed_at = sent;
                    let renewed: HashSet<EnvironmentId> = renewed.into_iter().collect();
                    for fence in held.into_iter().filter(|f| !renewed.contains(&f.env)) {
                        self.lose(fence, "its lease expired").await;
                    }
                    // Only now: a tenure of a lease just lost never looks fresh again.
                    own.renewals.renewed(sent);
                }
                failed => {
                    let error = match failed {
                        Ok(Err(e)) => error_chain(&e),
                        _ => format!("no answer within {} ms", wait.as_millis()),
                    };
                    tracing::warn!(%error, "cannot renew this replica's leases");
                    if !own.renewals.fresh() {
                        let held: Vec<Fence> = own.held().values().copied().collect();
                        for fence in held {
                            self.lose(fence, "the database did not answer within the self-fencing time").await;
                        }
                    }
                }
            }
        }
    }

    async fn looker(self: Arc<Self>) {
        let mut stopping = self.stopping.subscribe();
        loop {
            tokio::select! {
                () = tokio::time::sleep(jittered(self.ownership.timings.scan)) => {}
                _ = stopping.changed() => return,
            }
            self.look().await;
        }
    }

    /// One look at the leases: claims and hands over what [`plan`] says.
    async fn look(self: &Arc<Self>) {
        let own = &self.ownership;
        let seen = async {
            let replicas = self.store.replicas().await?;
            let leases = self.store.leases().await?;
            let environments: Vec<EnvironmentId> = self.store.list_environments().await?.into_iter().map(|e| e.id).collect();
            // Of the replicas that would count (a fresh heartbeat, or a lease), those that ended.
            let lease_ms = own.timings.lease.as_millis() as i64;
            let candidates: HashSet<ReplicaId> = leases
                .iter()
                .filter_map(|l| l.holder)
                .chain(replicas.iter().filter(|r| r.heartbeat_age_ms < lease_ms).map(|r| r.id))
                .filter(|r| *r != own.me)
                .collect();
            let mut gone = HashSet::new();
            for replica in candidates {
                if self.store.is_gone(replica).await? {
                    gone.insert(replica);
                }
            }
            Ok::<_, StoreError>((replicas, leases, environments, gone))
        };
        let (replicas, leases, environments, gone) = match seen.await {
            Ok(seen) => seen,
            Err(e) => return tracing::warn!(error = %error_chain(&e), "cannot read the leases"),
        };
        // Told to drain, here or through another replica (the mark is in the database).
        if replicas.iter().any(|r| r.id == own.me && r.draining) && !own.draining.swap(true, Ordering::SeqCst) {
            tracing::info!(replica = %own.me, "draining: every environment is handed over");
        }
        let draining = own.draining.load(Ordering::SeqCst);
        let Plan { claim, hand_over } = plan(
            &Seen {
                me: own.me,
                draining,
                settled: own.started.elapsed() >= own.timings.settle,
                replicas: &replicas,
                leases: &leases,
                environments: &environments,
                gone: &gone,
            },
            &own.timings,
        );
        let holder_of: HashMap<EnvironmentId, ReplicaId> = leases.iter().filter_map(|l| Some((l.env, l.holder?))).collect();
        for env in claim {
            let gone = holder_of.get(&env).copied().filter(|h| gone.contains(h));
            if let Err(e) = self.take(env, gone).await {
                tracing::error!(environment = %env, error = %error_chain(&e), "cannot take the environment");
            }
        }
        for env in hand_over {
            self.hand_over(&env).await;
        }
    }

    /// Marks replica `id` draining (this one or another: the mark is in the database, and the
    /// replica acts on it at its next look): it hands over every environment and takes no more,
    /// what a rolling upgrade does first. `false`: no such replica.
    pub async fn drain(&self, id: ReplicaId) -> Result<bool, StoreError> {
        self.store.set_draining(id).await
    }

    /// Every replica the database knows, with what each holds (environments by name), oldest
    /// first.
    pub async fn replica_set(&self) -> Result<Vec<ReplicaView>, StoreError> {
        let replicas = self.store.replicas().await?;
        let leases = self.store.leases().await?;
        let names: HashMap<EnvironmentId, String> = self.store.list_environments().await?.into_iter().map(|e| (e.id, e.name)).collect();
        let lease_ms = self.ownership.timings.lease.as_millis() as i64;
        let mut gone = HashSet::new();
        for r in replicas
            .iter()
            .filter(|r| r.heartbeat_age_ms < lease_ms && r.id != self.ownership.me)
        {
            if self.store.is_gone(r.id).await? {
                gone.insert(r.id);
            }
        }
        Ok(replicas
            .into_iter()
            .map(|record| {
                let mut holds: Vec<HeldView> = leases
                    .iter()
                    .filter(|l| l.holder == Some(record.id) && l.expires_in_ms > 0)
                    .filter_map(|l| {
                        Some(HeldView {
                            environment: names.get(&l.env)?.clone(),
                            epoch: l.epoch,
                            expires_in_ms: l.expires_in_ms,
                        })
                    })
                    .collect();
                holds.sort_by(|a, b| a.environment.cmp(&b.environment));
                ReplicaView {
                    live: record.heartbeat_age_ms < lease_ms && !gone.contains(&record.id),
                    this: record.id == self.ownership.me,
                    record,
                    holds,
                }
            })
            .collect())
    }

    /// What goes on in `env` besides its scheduler (its clusters' and processes' operations
    /// under way), resumed where this replica starts running it.
    /// (Boxed: it starts the environment through [`App::running`], which calls this.)
    pub(super) fn resume_environment(self: Arc<Self>, env: Environment) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(async move {
            self.resume_clusters(&env).await;
            self.resume_processes(&env).await;
        })
    }

    /// This replica's id.
    pub fn replica(&self) -> ReplicaId {
        self.ownership.me
    }

    /// Lets every lease go at shutdown, once the schedulers stopped: the others take over at
    /// once instead of after the leases expire.
    pub(super) async fn release_all(&self) {
        let held: Vec<EnvironmentId> = self.ownership.held().drain().map(|(env, _)| env).collect();
        for env in held {
            self.ownership.end_tenure(&env);
            if let Err(e) = self.store.release(&env, self.ownership.me).await {
                tracing::warn!(environment = %env, error = %error_chain(&e), "cannot let the lease go: it expires");
            }
        }
    }
}
