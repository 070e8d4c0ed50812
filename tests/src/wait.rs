//! Polling for a condition: tests wait for what they need with [`wait_for`], never by sleeping
//! for a fixed time.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// The first pause between two looks; it doubles up to [`MAX_PAUSE`], so that a condition that
/// holds soon is seen soon and a long wait does not keep the machine busy polling.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(100);

/// What one look at a condition answers: `bool` (it holds or not), `Option<T>` (`Some` once it
/// holds, with what was found), or `Result<T, E>` (`Ok` once it holds; `Err` says what was seen
/// instead, for the message when the wait gives up).
pub trait Look {
    /// What [`wait_for`] returns once the condition holds.
    type Value;
    /// `Ok` once the condition holds; until then `Err` with what was seen (empty: nothing to say).
    fn holds(self) -> Result<Self::Value, String>;
}

impl Look for bool {
    type Value = ();
    fn holds(self) -> Result<(), String> {
        if self { Ok(()) } else { Err(String::new()) }
    }
}

impl<T> Look for Option<T> {
    type Value = T;
    fn holds(self) -> Result<T, String> {
        self.ok_or_else(String::new)
    }
}

impl<T, E: Display> Look for Result<T, E> {
    type Value = T;
    fn holds(self) -> Result<T, String> {
        self.map_err(|seen| seen.to_string())
    }
}

/// Looks at a condition with `look` until it holds, and returns what the look found; pauses
/// between looks (10 ms at first, up to 100 ms). Panics once `timeout` has passed without it
/// holding, naming `what` was awaited ("node n1 to be verified") and what the last look saw.
pub async fn wait_for<L: Look>(what: &str, timeout: Duration, mut look: impl AsyncFnMut() -> L) -> L::Value {
    let deadline = Instant::now() + timeout;
    let mut pause = FIRST_PAUSE;
    loop {
        let seen = match look().await.holds() {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        if Instant::now() >= deadline {
            if seen.is_empty() {
                panic!("waited {timeout:?} for {what} in vain");
            }
            panic!("waited {timeout:?} for {what} in vain; last seen: {seen}");
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_what_the_look_found_once_the_condition_holds() {
        let mut looks = 0;
        let found = wait_for("the third look", Duration::from_secs(10), async || {
            looks += 1;
            if looks == 3 { Ok(looks) } else { Err(format!("look {looks}")) }
        })
        .await;
        assert_eq!(found, 3);
        wait_for("true", Duration::ZERO, async || true).await;
        assert_eq!(wait_for("some", Duration::ZERO, async || Some(7)).await, 7);
    }

    #[tokio::test]
    #[should_panic(expected = "for the impossible in vain; last seen: still not")]
    async fn gives_up_at_the_timeout_naming_what_was_awaited_and_what_was_seen() {
        wait_for("the impossible", Duration::from_millis(50), async || Err::<(), _>("still not")).await;
    }
}
