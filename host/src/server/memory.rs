//! The server's heap. glibc's malloc gives each thread that contends for it an arena of its own
//! and keeps what is freed there for reuse by that arena. A server that parses a 100,000-resource
//! intent on one worker thread, runs actions on all of them and frees on others ends up holding
//! far more than it uses: after deploying 100,000 resources (`api-bench 100000 --rss`) the
//! server was 398 MiB resident with glibc's defaults (peak live heap ~250 MiB, by heaptrack),
//! 297 MiB with two arenas and trimming.
//! [`tune_for_server`] bounds the arenas and starts a thread that hands free pages back to the
//! system every few seconds (`malloc_trim`, which releases free pages inside arenas too, not only
//! at their tops). A `glibc.malloc.arena_max` in `GLIBC_TUNABLES` is left as the operator set it.
//!
//! The `orc-host` binary allocates with mimalloc (its `#[global_allocator]`), which keeps
//! per-thread heaps and hands free pages back on its own; glibc's malloc, and so this tuning,
//! now serves the C code (SQLite's page cache and statements) and programs that use the library
//! without that allocator (the examples, the tests).

use std::time::Duration;

/// Arenas of a server process: two keep allocation contention low on our worker counts.
pub const SERVER_ARENAS: i32 = 2;

/// How often free heap pages are given back.
pub const TRIM_EVERY: Duration = Duration::from_secs(5);

/// Call before any other thread starts (before the tokio runtime is built).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn tune_for_server(arenas: i32, trim_every: Duration) {
    let operator_set = std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.arena_max"));
    if !operator_set {
        // SAFETY: `mallopt` only sets an allocator parameter; no other thread allocates yet.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
    let trimmer = std::thread::Builder::new().name("orc-heap-trim".into()).spawn(move || {
        loop {
            std::thread::sleep(trim_every);
            // SAFETY: `malloc_trim` takes no pointers and is safe to call from any thread.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    });
    if let Err(e) = trimmer {
        tracing::warn!(error = %e, "cannot start the heap trimming thread");
    }
}

/// Other platforms' allocators need no help.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune_for_server(_arenas: i32, _trim_every: Duration) {}
