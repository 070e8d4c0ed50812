//! What a password check may cost the host. Every check (signing in, and hashing a new password)
//! runs on a bounded pool: at most `checks_at_once` at a time, each holding argon2id's memory
//! (19 MiB with its default parameters), and at most `queue` waiting for a turn, each for at most
//! `queue_wait_s` — past either the request is answered 503 `busy` with `Retry-After` before
//! anything is read from the store. So what sign-ins cost in memory is bounded by the pool's
//! size, whatever arrives.
//!
//! Before a check is even queued, signing in is throttled by two token buckets: one per source
//! address (an IPv6 address by its /64, which one host is usually given whole) and one per user
//! name as given, whether or not a user has it, so the answer tells nothing of which names exist.
//! Past either, 429 `rate_limited` with `Retry-After`. Nothing is ever locked: a bucket refills
//! at its rate, so the longest a real user waits once an attacker stops is the time to refill one
//! attempt, and tokens keep working throughout.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::Deserialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Most keys a bucket table holds before buckets back at full are forgotten.
const KEYS: usize = 100_000;
/// The longest user name kept as a key as given; longer names (which no user has) share one.
const NAME_KEY_CHARS: usize = 64;

/// The limits of signing in with a password (`[sign_in]` in the host's configuration).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SignInLimits {
    /// Password checks run at once; 0: one per CPU core.
    pub checks_at_once: usize,
    /// Password checks waiting for a turn; past it, 503 `busy`.
    pub queue: usize,
    /// The longest a check waits for its turn, in seconds; past it, 503 `busy`.
    pub queue_wait_s: u64,
    /// Sign-in attempts per minute from one source address, on average; 0: no limit.
    pub per_address_per_minute: u32,
    /// Attempts one address may make at once above that rate.
    pub per_address_burst: u32,
    /// Sign-in attempts per minute for one user name, on average; 0: no limit.
    pub per_name_per_minute: u32,
    /// Attempts for one name at once above that rate.
    pub per_name_burst: u32,
}

impl Default for SignInLimits {
    fn default() -> Self {
        SignInLimits {
            checks_at_once: 0,
            queue: 32,
            queue_wait_s: 5,
            per_address_per_minute: 30,
            per_address_burst: 10,
            per_name_per_minute: 6,
            per_name_burst: 5,
        }
    }
}

/// Why a password check was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("too many sign-in attempts {which}; try again in {retry_after_s} s")]
    Throttled { which: &'static str, retry_after_s: u64 },
    #[error("the host is busy checking other passwords; try again in {retry_after_s} s")]
    Busy { retry_after_s: u64 },
}

/// The pool and the buckets.
pub struct SignInGate {
    checks: Arc<Semaphore>,
    waiting: AtomicUsize,
    queue: usize,
    queue_wait: Duration,
    by_address: Option<DefaultKeyedRateLimiter<IpAddr>>,
    by_name: Option<DefaultKeyedRateLimiter<String>>,
}

/// A turn at the pool: a check runs while it is held.
pub struct Turn(#[allow(dead_code)] OwnedSemaphorePermit);

fn buckets<K: std::hash::Hash + Eq + Clone>(per_minute: u32, burst: u32) -> Option<DefaultKeyedRateLimiter<K>> {
    let per_minute = NonZeroU32::new(per_minute)?;
    let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
    Some(RateLimiter::keyed(Quota::per_minute(per_minute).allow_burst(burst)))
}

/// Counts one attempt of `key`: `Err(seconds)` to wait when its bucket is empty.
fn take<K: std::hash::Hash + Eq + Clone>(buckets: &Option<DefaultKeyedRateLimiter<K>>, key: &K) -> Result<(), u64> {
    let Some(buckets) = buckets else { return Ok(()) };
    if buckets.len() > KEYS {
        buckets.retain_recent();
    }
    buckets.check_key(key).map_err(|not_until| {
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
    })
}

/// The key of a source address: IPv4 whole, IPv6 by its /64 (an IPv4-mapped one as IPv4).
fn address_key(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

impl SignInGate {
    pub fn new(limits: &SignInLimits) -> SignInGate {
        let at_once = match limits.checks_at_once {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        SignInGate {
            checks: Arc::new(Semaphore::new(at_once)),
            waiting: AtomicUsize::new(0),
            queue: limits.queue,
            queue_wait: Duration::from_secs(limits.queue_wait_s.max(1)),
            by_address: buckets(limits.per_address_per_minute, limits.per_address_burst),
            by_name: buckets(limits.per_name_per_minute, limits.per_name_burst),
        }
    }

    /// Counts a sign-in attempt from `source` (unknown: not counted by address) for `name`.
    pub fn attempt(&self, source: Option<IpAddr>, name: &str) -> Result<(), Refusal> {
        if let Some(source) = source {
            take(&self.by_address, &address_key(source)).map_err(|retry_after_s| Refusal::Throttled {
                which: "from this address",
                retry_after_s,
            })?;
        }
        let key: String = if name.chars().count() > NAME_KEY_CHARS {
            "\0too long".to_string()
        } else {
            name.to_string()
        };
        take(&self.by_name, &key).map_err(|retry_after_s| Refusal::Throttled {
            which: "for this user name",
            retry_after_s,
        })
    }

    /// A turn at the pool, waiting in the queue if it has room.
    pub async fn turn(&self) -> Result<Turn, Refusal> {
        if let Ok(permit) = self.checks.clone().try_acquire_owned() {
            return Ok(Turn(permit));
        }
        let busy = Refusal::Busy {
            retry_after_s: self.queue_wait.as_secs().max(1),
        };
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.queue {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(busy);
        }
        let permit = tokio::time::timeout(self.queue_wait, self.checks.clone().acquire_owned()).await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        match permit {
            Ok(Ok(permit)) => Ok(Turn(permit)),
            // Timed out (or the pool closed, which it never is).
            _ => Err(busy),
        }
    }

    /// Runs `check` (argon2: slow on purpose) on a blocking thread during a turn.
    pub async fn run<T: Send + 'static>(&self, check: impl FnOnce() -> T + Send + 'static) -> Result<Option<T>, Refusal> {
        Ok(self.turn().await?.run(check).await)
    }
}

impl Turn {
    /// Runs `check` on a blocking thread, the turn held until it returns; `None` if it panicked.
    pub async fn run<T: Send + 'static>(self, check: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        tokio::task::spawn_blocking(move || {
            let _turn = self;
            check()
        })
        .await
        .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_pool_runs_at_most_its_size_and_refuses_past_its_queue() {
        let gate = Arc::new(SignInGate::new(&SignInLimits {
            checks_at_once: 2,
            queue: 3,
            queue_wait_s: 30,
            ..SignInLimits::default()
        }));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..10 {
            let (gate, running, most) = (gate.clone(), running.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                gate.run(move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(200));
                    running.fetch_sub(1, Ordering::SeqCst);
                })
                .await
            }));
        }
        let mut ran = 0;
        let mut busy = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(Some(())) => ran += 1,
                Err(Refusal::Busy { retry_after_s }) => {
                    assert_eq!(retry_after_s, 30);
                    busy += 1
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(most.load(Ordering::SeqCst), 2);
        // Two ran at once, three waited their turn, five were refused at once.
        assert_eq!((ran, busy), (5, 5));
    }

    #[test]
    fn attempts_are_throttled_per_address_and_per_name_known_or_not() {
        let gate = SignInGate::new(&SignInLimits {
            per_address_per_minute: 1,
            per_address_burst: 3,
            per_name_per_minute: 1,
            per_name_burst: 2,
            ..SignInLimits::default()
        });
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        assert_eq!(gate.attempt(Some(a), "alice"), Ok(()));
        assert_eq!(gate.attempt(Some(b), "alice"), Ok(()));
        // The name's bucket is empty, from any address; another name is not.
        assert!(matches!(
            gate.attempt(Some(b), "alice"),
            Err(Refusal::Throttled { which: "for this user name", retry_after_s }) if (1..=60).contains(&retry_after_s)
        ));
        assert_eq!(gate.attempt(Some(b), "no-such-user"), Ok(()));
        // Address b has made three attempts; a fourth is refused whatever the name.
        assert!(matches!(
            gate.attempt(Some(b), "bob"),
            Err(Refusal::Throttled {
                which: "from this address",
                ..
            })
        ));
        // IPv6 addresses of one /64 share a bucket; a mapped IPv4 address is that address.
        let v6 = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(address_key(v6("2001:db8::1")), address_key(v6("2001:db8::ffff:1")));
        assert_ne!(address_key(v6("2001:db8::1")), address_key(v6("2001:db8:0:1::1")));
        assert_eq!(address_key(v6("::ffff:192.0.2.2")), b);
    }
}
