//! A burst of sign-ins cannot exhaust a real `orc-host serve`: 200 concurrent wrong passwords,
//! sent without credentials, raise its peak resident memory by less than [`BOUND_MIB`] — the
//! password pool's two checks of argon2id's 19 MiB each, plus what 200 connections and their
//! answers take — while the excess is answered 503 `busy` with `Retry-After` at once. (Without
//! the pool every check ran on its own thread: +1.3 GiB for 200.)

// Test support: a failed unwrap is the test failing, where it failed.
#![allow(clippy::unwrap_used)]

use orc_tests::server::{Served, request};

/// The most the host's peak RSS may grow by during the burst, in MiB.
const BOUND_MIB: u64 = 80;
/// Concurrent sign-ins.
const BURST: usize = 200;

fn status_field(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line[field.len()..].trim().trim_end_matches("kB").trim().parse().unwrap()
}

#[test]
fn a_burst_of_sign_ins_is_bounded_by_the_password_pool() {
    // No throttle here (it would answer most of the burst 429 before the pool is reached): the
    // pool alone bounds the memory.
    let server = Served::start(
        "[sign_in]\nchecks_at_once = 2\nqueue = 16\nqueue_wait_s = 60\nper_address_per_minute = 0\nper_name_per_minute = 0\n",
        &[],
    );
    let (status, answer) = request(
        &server.addr,
        "POST",
        "/api/v1/users",
        Some(&server.token),
        r#"{"name": "ann", "password": "a long and secret passphrase"}"#,
    );
    assert_eq!(status, 201, "{answer}");
    // Warm up (the first checks grow the allocator's pools), then measure the peak from here.
    for _ in 0..4 {
        let (status, _) = request(
            &server.addr,
            "POST",
            "/api/v1/login",
            None,
            r#"{"name": "ann", "password": "wrong"}"#,
        );
        assert_eq!(status, 401);
    }
    let pid = server.pid();
    let before = status_field(pid, "VmRSS:");
    // Writing 5 to clear_refs resets the peak (VmHWM) to the current RSS.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();

    let addr = server.addr.clone();
    let burst: Vec<_> = (0..BURST)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let name = if i % 2 == 0 { "ann" } else { "nobody" };
                request(
                    &addr,
                    "POST",
                    "/api/v1/login",
                    None,
                    &format!(r#"{{"name": "{name}", "password": "guess {i}"}}"#),
                )
            })
        })
        .collect();
    let answers: Vec<(u16, String)> = burst.into_iter().map(|t| t.join().unwrap()).collect();
    let peak = status_field(pid, "VmHWM:");
    let threads = status_field(pid, "Threads:");

    let checked = answers.iter().filter(|(s, _)| *s == 401).count();
    let busy: Vec<&String> = answers.iter().filter(|(s, _)| *s == 503).map(|(_, a)| a).collect();
    assert_eq!(
        checked + busy.len(),
        BURST,
        "every answer is 401 or 503: {:?}",
        answers.iter().map(|a| a.0).collect::<Vec<_>>()
    );
    assert!(checked >= 2, "the pool checked some: {checked}");
    assert!(!busy.is_empty(), "a pool of 2 and a queue of 16 cannot take 200 at once");
    for answer in &busy {
        assert!(answer.to_ascii_lowercase().contains("retry-after: "), "{answer}");
        assert!(answer.contains(r#""code":"busy""#), "{answer}");
    }
    let growth_mib = peak.saturating_sub(before) / 1024;
    eprintln!(
        "{BURST} concurrent sign-ins: {checked} checked, {} busy; RSS {} MiB before, peak {} MiB (+{growth_mib} MiB); {threads} threads",
        busy.len(),
        before / 1024,
        peak / 1024
    );
    assert!(
        growth_mib < BOUND_MIB,
        "the burst grew the host's peak RSS by {growth_mib} MiB (bound {BOUND_MIB})"
    );

    // The host still answers, and a real user signs in.
    let (status, answer) = request(
        &server.addr,
        "POST",
        "/api/v1/login",
        None,
        r#"{"name": "ann", "password": "a long and secret passphrase"}"#,
    );
    assert_eq!(status, 201, "{answer}");
}
