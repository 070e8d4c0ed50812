//! How the environments spread over the replicas on one database: the timings of leases and
//! what one replica's look at the leases decides ([`plan`]). The store keeps the leases and the
//! fence (`store::ownership`); the application acts on the plan (`app::ownership`).
//!
//! The rule, with its hysteresis: of `n` environments over `k` live replicas, a replica's
//! **share** is `⌊n / k⌋`, plus one for the first `n mod k` of them by id, so the shares sum
//! to `n` and differ by at most one. A replica claims free environments (never claimed,
//! expired, or held by a replica known to have ended) while it holds fewer than its share, and
//! hands one over per look while it holds more. A replica at its share does neither, so an
//! environment handed over is taken by one below its share, never by the replica that let it
//! go, and nothing flaps. Every environment is claimed: the shares sum to `n`; and one free
//! for longer than two leases is claimed by whoever sees it, whatever the shares, so a replica
//! counted live while it is not cannot leave it unowned.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::store::{EnvironmentId, LeaseRecord, ReplicaId, ReplicaRecord};

/// How long leases last and how often replicas look (ARCHITECTURE.md says why these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// A lease not renewed for this long has expired: another replica may take the environment.
    pub lease: Duration,
    /// How often an owner renews its leases (and its heartbeat).
    pub renew: Duration,
    /// An owner that could not renew for this long stops acting for every environment it
    /// holds, before any lease can expire.
    pub self_fence: Duration,
    /// How often a replica looks at the leases for environments to claim or hand over (plus up
    /// to a quarter of it at random, so replicas do not look in step).
    pub scan: Duration,
    /// How long a replica waits after its start before it hands environments over to even the
    /// spread: a rolling restart does not move every environment at each step.
    pub settle: Duration,
}

impl Default for Timings {
    fn default() -> Timings {
        Timings {
            lease: Duration::from_secs(5),
            renew: Duration::from_secs(1),
            self_fence: Duration::from_secs(3),
            scan: Duration::from_secs(1),
            settle: Duration::from_secs(10),
        }
    }
}

/// When this replica last renewed its leases, on its own monotonic clock (which runs on while
/// the process is stopped): what a device write is judged by before it goes out ([`Tenure`]),
/// with no round trip to the database.
#[derive(Debug)]
pub struct Renewals {
    start: std::time::Instant,
    /// Milliseconds from `start` to the last renewal sent that succeeded.
    renewed_ms: std::sync::atomic::AtomicU64,
    /// `None`: renewals never go stale (SQLite: one process, whose leases no one else takes).
    self_fence: Option<Duration>,
}

impl Renewals {
    pub fn new(self_fence: Option<Duration>) -> Renewals {
        Renewals {
            start: std::time::Instant::now(),
            renewed_ms: std::sync::atomic::AtomicU64::new(0),
            self_fence,
        }
    }

    /// A renewal sent at `at` succeeded.
    pub fn renewed(&self, at: std::time::Instant) {
        let ms = at.saturating_duration_since(self.start).as_millis() as u64;
        self.renewed_ms.fetch_max(ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the last renewal is younger than the self-fencing time.
    pub fn fresh(&self) -> bool {
        let Some(limit) = self.self_fence else {
            return true;
        };
        self.age() < limit
    }

    /// How long ago the last renewal that succeeded was sent (since the start, if none was).
    pub fn age(&self) -> Duration {
        let renewed = Duration::from_millis(self.renewed_ms.load(std::sync::atomic::Ordering::SeqCst));
        self.start.elapsed().saturating_sub(renewed)
    }
}

/// This replica's hold on one environment as its actions see it: ended when the environment is
/// lost or handed over, and stale as soon as the renewals are ([`Renewals::fresh`]). An action
/// that was running when its replica was paused past its lease finds its tenure over at the
/// first device write after it wakes, before the renewer has even asked the database.
#[derive(Debug)]
pub struct Tenure {
    renewals: std::sync::Arc<Renewals>,
    held: std::sync::atomic::AtomicBool,
}

impl Tenure {
    pub fn new(renewals: std::sync::Arc<Renewals>) -> Tenure {
        Tenure {
            renewals,
            held: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// Whether this replica may still act for the environment.
    pub fn holds(&self) -> bool {
        self.held.load(std::sync::atomic::Ordering::SeqCst) && self.renewals.fresh()
    }

    /// The environment is no longer this replica's.
    pub fn end(&self) {
        self.held.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What one look decided for replica `me`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Free environments to claim, in the order to try them.
    pub claim: Vec<EnvironmentId>,
    /// Environments `me` holds and should let go (stop, then release).
    pub hand_over: Vec<EnvironmentId>,
}

/// What a look sees.
pub struct Seen<'a> {
    pub me: ReplicaId,
    /// Whether `me` is draining: it hands over all it holds and claims nothing.
    pub draining: bool,
    /// Whether `me` has run for [`Timings::settle`] (before, it hands nothing over).
    pub settled: bool,
    pub replicas: &'a [ReplicaRecord],
    pub leases: &'a [LeaseRecord],
    /// Every environment of the database.
    pub environments: &'a [EnvironmentId],
    /// Replicas known to have ended (their presence is gone, `store::Store::is_gone`).
    pub gone: &'a HashSet<ReplicaId>,
}

/// What `me` should claim and hand over (see the module's rule).
pub fn plan(seen: &Seen<'_>, timings: &Timings) -> Plan {
    let lease_ms = timings.lease.as_millis() as i64;
    let live: HashSet<ReplicaId> = seen
        .replicas
        .iter()
        .filter(|r| r.heartbeat_age_ms < lease_ms && !r.draining && !seen.gone.contains(&r.id))
        .map(|r| r.id)
        .chain((!seen.draining).then_some(seen.me))
        .collect();
    let leases: HashMap<EnvironmentId, &LeaseRecord> = seen.leases.iter().map(|l| (l.env, l)).collect();
    let holder = |env: &EnvironmentId| {
        leases
            .get(env)
            .filter(|l| l.expires_in_ms > 0)
            .and_then(|l| l.holder)
            .filter(|h| !seen.gone.contains(h))
    };
    let mine: Vec<EnvironmentId> = seen.environments.iter().filter(|e| holder(e) == Some(seen.me)).copied().collect();
    if seen.draining {
        return Plan {
            claim: Vec::new(),
            hand_over: mine,
        };
    }
    let n = seen.environments.len();
    let mut ranked: Vec<ReplicaId> = live.iter().copied().collect();
    ranked.sort_unstable();
    let k = ranked.len().max(1);
    let rank = ranked.iter().position(|r| *r == seen.me).unwrap_or(k);
    let share = n / k + usize::from(rank < n % k);
    let mut free: Vec<(bool, u64, EnvironmentId)> = seen
        .environments
        .iter()
        .filter(|e| holder(e).is_none())
        .map(|e| {
            // Free for longer than two leases: whoever sees it claims it.
            let stranded = leases.get(e).is_some_and(|l| l.holder.is_some() && l.expires_in_ms < -2 * lease_ms);
            (!stranded, spread_key(e, seen.me), *e)
        })
        .collect();
    // The stranded first; then in an order of this replica's own, so that replicas claiming
    // together mostly try different environments.
    free.sort_unstable();
    let room = share.saturating_sub(mine.len());
    let claim = free
        .iter()
        .enumerate()
        .filter(|(i, (ordinary, _, _))| !ordinary || *i < room)
        .map(|(_, (_, _, e))| *e)
        .collect();
    let hand_over = if seen.settled && mine.len() > share {
        // One per look: the others take it before the next.
        let mut mine = mine;
        mine.sort_unstable_by_key(|e| std::cmp::Reverse(spread_key(e, seen.me)));
        mine.truncate(1);
        mine
    } else {
        Vec::new()
    };
    Plan { claim, hand_over }
}

/// A replica's own order of environments (FNV-1a of both ids).
fn spread_key(env: &EnvironmentId, me: ReplicaId) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in env.to_string().bytes().chain(me.to_string().bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(id: ReplicaId, age_ms: i64) -> ReplicaRecord {
        ReplicaRecord {
            id,
            address: String::new(),
            version: String::new(),
            heartbeat_age_ms: age_ms,
            draining: false,
        }
    }

    /// Runs looks of every live replica in a random order until nothing changes, holding
    /// leases as a database would (a claim of a held lease fails); answers who holds what.
    fn settle(
        replicas: &[ReplicaId],
        envs: &[EnvironmentId],
        held: &mut HashMap<EnvironmentId, ReplicaId>,
        rng: &mut impl FnMut() -> u64,
    ) -> usize {
        let timings = Timings::default();
        let records: Vec<ReplicaRecord> = replicas.iter().map(|r| replica(*r, 0)).collect();
        let gone = HashSet::new();
        let mut moves = 0;
        for round in 0..200 {
            let mut changed = false;
            let mut order: Vec<ReplicaId> = replicas.to_vec();
            order.sort_by_key(|_| rng());
            for me in order {
                let leases: Vec<LeaseRecord> = envs
                    .iter()
                    .map(|e| LeaseRecord {
                        env: *e,
                        holder: held.get(e).copied(),
                        epoch: 1,
                        expires_in_ms: if held.contains_key(e) { 5_000 } else { -1 },
                    })
                    .collect();
                let plan = plan(
                    &Seen {
                        me,
                        draining: false,
                        settled: true,
                        replicas: &records,
                        leases: &leases,
                        environments: envs,
                        gone: &gone,
                    },
                    &timings,
                );
                for e in plan.hand_over {
                    held.remove(&e);
                    changed = true;
                    moves += 1;
                }
                for e in plan.claim {
                    if let std::collections::hash_map::Entry::Vacant(free) = held.entry(e) {
                        free.insert(me);
                        changed = true;
                    }
                }
            }
            if !changed {
                return moves;
            }
            assert!(round < 199, "the spread never settles");
        }
        moves
    }

    fn counts(replicas: &[ReplicaId], held: &HashMap<EnvironmentId, ReplicaId>) -> Vec<usize> {
        replicas.iter().map(|r| held.values().filter(|h| *h == r).count()).collect()
    }

    /// Architecture invariant: whatever the order replicas look in, every environment ends
    /// owned, the spread is within one of even, and adding a replica moves only what the new
    /// share needs (no flapping: a settled spread stays as it is).
    #[test]
    fn environments_spread_within_one_of_even_and_stay_put() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut rng = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for trial in 0..50 {
            let n = 1 + (rng() % 60) as usize;
            let k = 1 + (rng() % 5) as usize;
            let envs: Vec<EnvironmentId> = (0..n).map(|_| EnvironmentId::random()).collect();
            let mut replicas: Vec<ReplicaId> = (0..k).map(|_| ReplicaId::random()).collect();
            let mut held = HashMap::new();
            settle(&replicas, &envs, &mut held, &mut rng);
            assert_eq!(held.len(), n, "trial {trial}: every environment is owned");
            let c = counts(&replicas, &held);
            assert!(
                c.iter().all(|c| *c == n / k || *c == n.div_ceil(k)),
                "trial {trial}: {c:?} over {n}"
            );
            // Settled: another round of looks moves nothing.
            assert_eq!(settle(&replicas, &envs, &mut held, &mut rng), 0, "trial {trial}");
            // A new replica: what moves is what the new share takes from the others.
            replicas.push(ReplicaId::random());
            let moves = settle(&replicas, &envs, &mut held, &mut rng);
            assert_eq!(held.len(), n);
            let c = counts(&replicas, &held);
            assert!(
                c.iter().all(|c| *c == n / (k + 1) || *c == n.div_ceil(k + 1)),
                "trial {trial}: {c:?} over {n}"
            );
            assert!(moves <= n.div_ceil(k + 1) + k, "trial {trial}: {moves} moves for {c:?}");
        }
    }

    /// What a replica that ended held is claimed at once by the others, and a draining replica
    /// hands over everything and claims nothing.
    /// A tenure ends when told, and goes stale once the renewals are older than the
    /// self-fencing time, on the replica's own clock.
    #[test]
    fn a_tenure_ends_when_its_renewals_go_stale() {
        let renewals = std::sync::Arc::new(Renewals::new(Some(Duration::from_millis(50))));
        let tenure = Tenure::new(renewals.clone());
        assert!(tenure.holds());
        std::thread::sleep(Duration::from_millis(80));
        assert!(!tenure.holds(), "stale after the self-fencing time");
        renewals.renewed(std::time::Instant::now());
        assert!(tenure.holds(), "fresh again after a renewal");
        tenure.end();
        assert!(!tenure.holds());
        let sole = Tenure::new(std::sync::Arc::new(Renewals::new(None)));
        std::thread::sleep(Duration::from_millis(60));
        assert!(sole.holds(), "never stale without a self-fencing time");
    }

    #[test]
    fn what_a_gone_or_draining_replica_held_is_taken() {
        let (a, b) = (ReplicaId::random(), ReplicaId::random());
        let envs: Vec<EnvironmentId> = (0..4).map(|_| EnvironmentId::random()).collect();
        let leases: Vec<LeaseRecord> = envs
            .iter()
            .map(|e| LeaseRecord {
                env: *e,
                holder: Some(b),
                epoch: 3,
                expires_in_ms: 4_000,
            })
            .collect();
        let records = [replica(a, 0), replica(b, 0)];
        let look = |me, draining, gone: &HashSet<ReplicaId>| {
            plan(
                &Seen {
                    me,
                    draining,
                    settled: true,
                    replicas: &records,
                    leases: &leases,
                    environments: &envs,
                    gone,
                },
                &Timings::default(),
            )
        };
        // b alive: a (holding none, its share two) has nothing free to claim.
        assert_eq!(look(a, false, &HashSet::new()), Plan::default());
        // b gone: a is the only live replica and claims all four.
        let gone = HashSet::from([b]);
        assert_eq!(look(a, false, &gone).claim.len(), 4);
        // b draining: it hands over all four.
        assert_eq!(look(b, true, &HashSet::new()).hand_over.len(), 4);
        // b holding all four with a live: it hands over one per look.
        assert_eq!(look(b, false, &HashSet::new()).hand_over.len(), 1);
    }
}
