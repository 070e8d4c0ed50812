//! The scheduler's clock work: retry backoff with jitter, self-healing due times, and the heap
//! of timers. Times are tokio's (`tokio::time::Instant`), so tests run the scheduler with a
//! paused clock; every addition is checked, so no setting can overflow the clock — a due time
//! beyond the clock's range is "never".

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use tokio::time::Instant;

/// What a timer does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Kind {
    /// A failed or unavailable resource is tried again.
    Retry,
    /// A deployed resource is re-read and restored (self-healing).
    Repair,
}

/// A timer: when, for which version's resource, and what for. A resource has one live timer
/// (`Entry::timer`); a timer in the heap whose due differs was superseded and is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Timer {
    pub(super) due: Instant,
    pub(super) version: u64,
    pub(super) index: usize,
    pub(super) kind: Kind,
}

#[derive(Default)]
pub(super) struct Timers {
    heap: BinaryHeap<Reverse<Timer>>,
}

impl Timers {
    pub(super) fn push(&mut self, timer: Timer) {
        self.heap.push(Reverse(timer));
    }

    pub(super) fn next_due(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse(t)| t.due)
    }

    /// The timers due at `now`, earliest first.
    pub(super) fn pop_due(&mut self, now: Instant) -> Vec<Timer> {
        let mut due = Vec::new();
        while let Some(Reverse(t)) = self.heap.peek().copied() {
            if t.due > now {
                break;
            }
            self.heap.pop();
            due.push(t);
        }
        due
    }

    pub(super) fn clear(&mut self) {
        self.heap.clear();
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Timer) -> bool) {
        self.heap.retain(|Reverse(t)| keep(t));
    }
}

/// The delay before retry number `attempts` (1 for the first): `interval` doubling per attempt,
/// at most `max`, spread by [`jitter`].
pub(super) fn retry_delay(interval: Duration, max: Duration, attempts: u32, spread_key: usize) -> Duration {
    let doubled = interval.saturating_mul(1 << attempts.saturating_sub(1).min(16));
    jitter(doubled.min(max), spread_key)
}

/// `at + delay`, or `None` (never) past the clock's range.
pub(super) fn after(at: Instant, delay: Duration) -> Option<Instant> {
    at.checked_add(delay)
}

/// ±10 % spread, deterministic per resource, so retries and repairs of many resources do not
/// all fire at once. Saturates instead of overflowing.
pub(super) fn jitter(base: Duration, key: usize) -> Duration {
    let spread = (key.wrapping_mul(2_654_435_761) % 2001) as f64 / 10_000.0 - 0.1;
    Duration::try_from_secs_f64(base.as_secs_f64() * (1.0 + spread)).unwrap_or(Duration::MAX)
}

/// Milliseconds since the epoch `delay` from now, saturating (a stored "next retry" time).
pub(super) fn wall_ms_after(delay: Duration) -> i64 {
    crate::store::now_ms().saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extreme_intervals_saturate_instead_of_overflowing() {
        for key in 0..1000 {
            assert!(jitter(Duration::MAX, key) >= Duration::from_secs(u64::MAX / 2));
        }
        let d = retry_delay(Duration::from_secs(u64::MAX / 2), Duration::MAX, 40, 7);
        assert!(d >= Duration::from_secs(u64::MAX / 4));
        assert_eq!(after(Instant::now(), Duration::MAX), None);
        assert_eq!(wall_ms_after(Duration::MAX), i64::MAX);
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        for key in 0..1000 {
            let d = jitter(Duration::from_secs(100), key).as_secs_f64();
            assert!((90.0..=110.0).contains(&d), "{d}");
        }
    }
}
