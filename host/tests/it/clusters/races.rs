//! Operators racing each other and the watcher over one cluster, in random order: each round
//! sends several operations at once, each without `If-Match`, with the revision read before the
//! round, or with a stale one. `ORC_TEST_SEED=<n>` replays a run.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::processes::call;
use super::{ENV, nodes, stack, start_host, submit_template, wait_cluster};

/// One operation of a round.
#[derive(Debug, Clone)]
enum Op {
    Amend(u32),
    Reconfigure(u32),
    Service(&'static str, &'static str),
    Lease(u64),
}

impl Op {
    /// Whether it starts work on the nodes (the cluster is busy until that is done).
    fn starts_work(&self) -> bool {
        !matches!(self, Op::Lease(_))
    }
}

/// Which revision an operation names.
#[derive(Debug, Clone, Copy)]
enum Tag {
    None,
    Current,
    Stale,
}

fn round_strategy() -> impl proptest::strategy::Strategy<Value = Vec<(Op, Tag)>> {
    use proptest::prelude::*;
    let op = prop_oneof![
        3 => (2..=3u32).prop_map(Op::Amend),
        2 => (0..1000u32).prop_map(Op::Reconfigure),
        2 => (prop_oneof![Just("db"), Just("web")], prop_oneof![Just("stop"), Just("start"), Just("restart")])
            .prop_map(|(s, a)| Op::Service(s, a)),
        2 => (60..100_000u64).prop_map(Op::Lease),
    ];
    let tag = prop_oneof![2 => Just(Tag::None), 2 => Just(Tag::Current), 1 => Just(Tag::Stale)];
    proptest::collection::vec((op, tag), 3..7)
}

/// Rounds of concurrent operations on one cluster. Whatever the interleaving:
/// - every answer is a success or a refusal the state explains (`cluster_busy`,
///   `version_conflict`), never a 5xx;
/// - of the operations that start work, at most one per round is accepted: two that both found
///   the cluster idle cannot both start (the revision check under the release turn);
/// - a stale `If-Match` is always refused with `version_conflict`, naming the current revision;
///   without `If-Match` a lost race is never the answer (the operation runs again);
/// - after each round the cluster becomes active, its revision has moved on by at least what was
///   accepted, and the released version holds exactly the cluster's tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_cluster_operations_start_one_at_a_time() {
    use proptest::strategy::{Strategy, ValueTree};
    let (seed, mut runner) = super::seeded_runner();

    let host = start_host(1).await;
    let _sshd = nodes(&host, 3).await;
    let root = tempfile::tempdir().unwrap();
    submit_template(&host, "stack", &stack(root.path())).await;
    let cluster = format!("/environments/{ENV}/clusters/race");
    let (status, c) = host
        .post(
            &format!("/environments/{ENV}/clusters"),
            &json!({"name": "race", "template": "stack", "size": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{c}");
    wait_cluster(&host, "race", "active").await;

    for round in 0..4 {
        let ops = round_strategy().new_tree(&mut runner).unwrap().current();
        eprintln!("round {round}: {ops:?}");
        let (_, before, etag) = call(&host, Method::GET, &cluster, None, None).await;
        let revision = before["revision"].as_i64().unwrap();
        assert_eq!(etag.as_deref(), Some(format!("\"{revision}\"").as_str()), "{before}");
        let answers = futures::future::join_all(ops.iter().map(|(op, tag)| {
            let host = &host;
            let cluster = &cluster;
            async move {
                let tag = match tag {
                    Tag::None => None,
                    Tag::Current => Some(format!("\"{revision}\"")),
                    Tag::Stale => Some(format!("\"{}\"", revision - 1)),
                };
                let (path, body) = match op {
                    Op::Amend(size) => (format!("{cluster}/amend"), json!({"size": size})),
                    Op::Reconfigure(n) => (
                        format!("{cluster}/reconfigure"),
                        json!({"config": {"web": {"greeting": format!("hi {n}")}}}),
                    ),
                    Op::Service(service, action) => (format!("{cluster}/services/{service}/{action}"), Value::Null),
                    Op::Lease(s) => (format!("{cluster}/lease"), json!({"lease_s": s})),
                };
                let body = (!body.is_null()).then_some(body);
                let (status, answer, _) = call(host, Method::POST, &path, body.as_ref(), tag.as_deref()).await;
                (status, answer)
            }
        }))
        .await;

        // The revisions the accepted operations left the cluster at: those that start work, and
        // the rest (leases).
        let mut started = Vec::new();
        let mut others = Vec::new();
        let mut accepted = 0;
        for ((op, tag), (status, answer)) in ops.iter().zip(&answers) {
            let context = format!("round {round}, {op:?} with {tag:?} (ORC_TEST_SEED={seed}): {status} {answer}");
            assert!(!status.is_server_error(), "{context}");
            match tag {
                Tag::Stale => {
                    assert_eq!(
                        (*status, answer["code"].as_str()),
                        (StatusCode::CONFLICT, Some("version_conflict")),
                        "{context}"
                    );
                    assert!(
                        answer["message"].as_str().unwrap().contains("cluster `race` is at revision"),
                        "{context}"
                    );
                    continue;
                }
                Tag::None => assert_ne!(answer["code"], "version_conflict", "{context}"),
                Tag::Current => {}
            }
            if status.is_success() {
                accepted += 1;
                let at = answer["revision"].as_i64().unwrap_or_else(|| panic!("{context}: no revision"));
                if op.starts_work() { started.push(at) } else { others.push(at) }
            } else {
                let code = answer["code"].as_str().unwrap_or_default();
                assert!(
                    *status == StatusCode::CONFLICT && (code == "cluster_busy" || code == "version_conflict"),
                    "{context}"
                );
            }
        }
        // Two operations may both start in one round only one after the other: an empty one
        // can settle before the next request arrives. Every update bumps the revision, so
        // between the revisions two started operations left there must be one that no accepted
        // request wrote: the first one's settling.
        started.sort_unstable();
        for pair in started.windows(2) {
            let (first, second) = (pair[0], pair[1]);
            assert!(
                (first + 1..second).any(|r| !others.contains(&r)),
                "round {round} (ORC_TEST_SEED={seed}): an operation started at revision {second} while the one \
                 started at {first} was under way: {answers:?}"
            );
        }

        let after = wait_cluster(&host, "race", "active").await;
        assert!(
            after["revision"].as_i64().unwrap() >= revision + accepted,
            "round {round} (ORC_TEST_SEED={seed}): {accepted} accepted from revision {revision}: {after:#}"
        );
        let released = super::released_ids(&host, ",race/").await;
        let mut tasks: Vec<String> = after["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap().to_string())
            .collect();
        tasks.sort();
        assert_eq!(released, tasks, "round {round} (ORC_TEST_SEED={seed})");
    }
    host.stop().await;
}
