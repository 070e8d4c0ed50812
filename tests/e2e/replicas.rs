//! Replicas: real `orc-host serve` processes on one real PostgreSQL (the harness starts it),
//! sharing one secret key and an SSH node on a real sshd. Replicas started together make one
//! admin; an environment is run by one replica at a time, and when its owner is killed
//! outright in the middle of a deploy another takes it over within seconds and finishes it:
//! every file right on disk, nothing left `deploying`, no resource deployed twice in the log; an
//! owner paused past its lease changes nothing once it wakes, and rejoins. Any replica answers
//! any request (relayed to the owner, run once); 50 environments spread within one of even, and
//! a drained replica's move to the others.

// Test support: a failed unwrap is the test failing, where it failed.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use orc_tests::server::{Served, body_of, request, request_with};
use orc_tests::sse::{SseEvent, SseStream};
use orc_tests::sshd::{Sshd, TEST_USER};
use orc_tests::wait_for;
use serde_json::{Value, json};

/// Files the deploy writes on the node.
const FILES: usize = 1_500;
/// The most a takeover may take after the owner is killed (the target is ≤ 10 s worst).
const TAKEOVER: Duration = Duration::from_secs(10);

/// The configuration every replica of a set shares: the database and the key sealed node
/// credentials are read with.
fn replica_config(database: &str, key_dir: &std::path::Path) -> String {
    format!(
        "database = \"{database}\"\nsecret_key_file = \"{}\"\n",
        key_dir.join("secret.key").display()
    )
}

fn call(replica: &Served, token: &str, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let body = if body.is_null() { String::new() } else { body.to_string() };
    let (status, answer) = request(&replica.addr, method, &format!("/api/v1{path}"), Some(token), &body);
    let value = serde_json::from_str(body_of(&answer)).unwrap_or_else(|_| Value::String(answer.clone()));
    (status, value)
}

/// The replica set as `replica` sees it: replica id → (address, live, environments held).
fn replica_set(replica: &Served, token: &str) -> Vec<Value> {
    let (status, set) = call(replica, token, "GET", "/replicas", &Value::Null);
    assert_eq!(status, 200, "{set}");
    set["items"].as_array().unwrap().clone()
}

/// The address of the live replica holding `env`, as `replica` sees it.
fn owner_of(replica: &Served, token: &str, env: &str) -> Option<String> {
    replica_set(replica, token)
        .into_iter()
        .find(|r| r["live"] == true && r["holds"].as_array().unwrap().iter().any(|h| h["environment"] == env))
        .map(|r| r["address"].as_str().unwrap().to_string())
}

fn start_set(database: &str, key_dir: &std::path::Path, n: usize) -> (Vec<Served>, String) {
    let config = replica_config(database, key_dir);
    let started: Vec<Served> = std::thread::scope(|s| {
        let starting: Vec<_> = (0..n).map(|_| s.spawn(|| Served::start_replica(&config))).collect();
        starting.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let tokens: Vec<&String> = started.iter().map(|r| &r.token).filter(|t| !t.is_empty()).collect();
    assert_eq!(
        tokens.len(),
        1,
        "exactly one replica of {n} started together made the admin: {tokens:?}"
    );
    let token = tokens[0].clone();
    (started, token)
}

async fn database() -> String {
    orc_tests::pg::fresh_database().await.unwrap()
}

/// Three replicas started at once on an empty database: migrations run once, one admin token
/// is made, and each replica answers and sees the other two live. A token revoked through one
/// replica is refused by another that had just accepted it (each keeps principals in memory).
#[tokio::test(flavor = "multi_thread")]
async fn replicas_started_together_make_one_admin_and_see_each_other() {
    let database = database().await;
    let keys = tempfile::tempdir().unwrap();
    let (set, token) = start_set(&database, keys.path(), 3);
    for replica in &set {
        let seen = replica_set(replica, &token);
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert!(seen.iter().all(|r| r["live"] == true), "{seen:?}");
        assert_eq!(seen.iter().filter(|r| r["this"] == true).count(), 1, "{seen:?}");
    }

    let (status, made) = call(&set[0], &token, "POST", "/tokens", &json!({"description": "short-lived"}));
    assert_eq!(status, 201, "{made}");
    let (id, secret) = (made["id"].as_str().unwrap(), made["token"].as_str().unwrap());
    assert_eq!(call(&set[1], secret, "GET", "/me", &Value::Null).0, 200);
    let (status, answer) = call(&set[2], &token, "DELETE", &format!("/tokens/{id}"), &Value::Null);
    assert_eq!(status, 204, "{answer}");
    wait_for(
        "the revoked token to be refused by another replica",
        Duration::from_secs(2),
        async || call(&set[1], secret, "GET", "/me", &Value::Null).0 == 401,
    )
    .await;
}

/// Every replica answers every request: one that does not run the environment relays it
/// through the database to the owner, which runs it once. An intent submitted, a deploy asked
/// and an operation read through a non-owner make one version, one operation and one audit
/// entry each (the audit trail is written where the request came in); a refusal comes back
/// with its code; a request sent while the owner is stopped runs once, on the replica that
/// takes over; a token revoked meanwhile is refused by the owner too.
#[tokio::test(flavor = "multi_thread")]
async fn any_replica_answers_and_a_relayed_request_runs_once() {
    let database = database().await;
    let keys = tempfile::tempdir().unwrap();
    let (set, token) = start_set(&database, keys.path(), 3);
    assert_eq!(call(&set[0], &token, "POST", "/environments", &json!({"name": "prod"})).0, 201);
    let owner = wait_for("a replica to own prod", Duration::from_secs(10), async || {
        owner_of(&set[0], &token, "prod")
    })
    .await;
    let others: Vec<&Served> = set.iter().filter(|r| r.addr != owner).collect();
    let intent = |n: usize| {
        let resources: Vec<Value> = (0..n)
            .map(|i| {
                json!({"id": format!("file[local,/srv/relayed/f{i}]"), "adaptor": "file@0.1.0",
                "attributes": {"content": format!("{i}\n")}})
            })
            .collect();
        json!({ "resources": resources })
    };

    let (status, version) = call(others[0], &token, "POST", "/environments/prod/intents", &intent(3));
    assert_eq!(status, 201, "{version}");
    assert_eq!(version["version"], 1, "{version}");
    let (status, env) = call(others[1], &token, "GET", "/environments/prod", &Value::Null);
    assert_eq!(status, 200, "{env}");
    assert_eq!(env["latest_version"], 1, "one version, made once: {env}");

    let (status, operation) = call(others[1], &token, "POST", "/environments/prod/deploy", &Value::Null);
    assert_eq!(status, 202, "{operation}");
    let id = operation["id"].as_str().unwrap().to_string();
    let (status, read) = call(
        others[0],
        &token,
        "GET",
        &format!("/environments/prod/operations/{id}"),
        &Value::Null,
    );
    assert_eq!(status, 200, "{read}");
    assert_eq!(read["id"], id.as_str(), "{read}");

    // A refusal keeps its status and code.
    let (status, refusal) = call(others[0], &token, "POST", "/environments/prod/intents", &json!({"resources": 5}));
    assert_eq!((status, refusal["code"].as_str()), (400, Some("invalid_json")), "{refusal}");

    // One audit entry per request, by the replica it came in at.
    let entries = wait_for("the audit entries", Duration::from_secs(5), async || {
        let (_, page) = call(&set[0], &token, "GET", "/audit?environment=prod", &Value::Null);
        let items = page["items"].as_array().cloned().unwrap_or_default();
        (items.len() >= 3).then_some(items).ok_or(page.to_string())
    })
    .await;
    let posted = |route: &str| entries.iter().filter(|e| e["method"] == "POST" && e["route"] == route).count();
    assert_eq!(posted("/environments/{env}/intents"), 2, "{entries:?}");
    assert_eq!(posted("/environments/{env}/deploy"), 1, "{entries:?}");
    assert!(
        entries.iter().any(|e| e["status"] == 400 && e["code"] == "invalid_json"),
        "{entries:?}"
    );

    // Sent while the owner is stopped: the request waits, unclaimed, until another replica
    // has taken the environment over, and runs there once.
    let stopped = set.iter().find(|r| r.addr == owner).unwrap();
    stopped.signal("-STOP");
    let (status, version) = call(others[0], &token, "POST", "/environments/prod/intents", &intent(4));
    stopped.signal("-CONT");
    assert_eq!((status, version["version"].as_u64()), (201, Some(2)), "{version}");
    let (_, env) = call(others[1], &token, "GET", "/environments/prod", &Value::Null);
    assert_eq!(env["latest_version"], 2, "{env}");

    // A token revoked after a replica last saw it is refused wherever the request is run.
    let (status, made) = call(&set[0], &token, "POST", "/tokens", &json!({"description": "brief"}));
    assert_eq!(status, 201, "{made}");
    let (tid, secret) = (made["id"].as_str().unwrap(), made["token"].as_str().unwrap());
    assert_eq!(call(others[0], secret, "GET", "/environments/prod", &Value::Null).0, 200);
    assert_eq!(call(others[1], &token, "DELETE", &format!("/tokens/{tid}"), &Value::Null).0, 204);
    wait_for("the revoked token to be refused", Duration::from_secs(2), async || {
        call(others[0], secret, "GET", "/environments/prod", &Value::Null).0 == 401
    })
    .await;
}

/// The owner of an environment is killed with SIGKILL while it deploys 1,500 files to an SSH
/// node: another replica owns the environment within [`TAKEOVER`], every resource ends
/// `deployed` with its file right on disk, none is left `deploying`, and the action log holds
/// one successful deploy per resource (what the killed owner did but had not recorded is read
/// again, found right and recorded once).
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_owner_is_replaced_and_the_deploy_finishes() {
    let sshd = Sshd::start();
    let database = database().await;
    let keys = tempfile::tempdir().unwrap();
    let (mut set, token) = start_set(&database, keys.path(), 3);
    let node = json!({"name": "web1", "address": "127.0.0.1", "port": sshd.port, "user": TEST_USER,
        "credential": {"private_key": sshd.client_key}});
    let (status, answer) = call(&set[0], &token, "POST", "/nodes", &node);
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = call(&set[1], &token, "POST", "/environments", &json!({"name": "prod"}));
    assert_eq!(status, 201, "{answer}");

    // Some replica takes it at its next look; every replica says which.
    let owner = wait_for("a replica to own prod", Duration::from_secs(10), async || {
        owner_of(&set[2], &token, "prod")
    })
    .await;
    let at = set.iter().position(|r| r.addr == owner).unwrap();
    // The intent goes in through another replica: relayed to the owner.
    let other = (at + 1) % set.len();

    let dir = sshd.scratch_dir("replicas");
    let content = |i: usize| format!("file {i} of the replicated deploy\n");
    let path = |i: usize| dir.join(format!("f{i:05}.conf"));
    let resources: Vec<Value> = (0..FILES)
        .map(|i| {
            json!({"id": format!("file[web1,{}]", path(i).display()), "adaptor": "file@0.1.0",
                "attributes": {"content": content(i), "mode": "0644"}})
        })
        .collect();
    // Two readers of the event stream: one on a replica that is not the owner, which reads it
    // through the failover; one on the owner, which resumes on another replica once its own is
    // killed.
    const EVENTS: &str = "/api/v1/environments/prod/events";
    let through = SseStream::open(&set[other].addr, EVENTS, &token, None);
    let on_owner = SseStream::open(&set[at].addr, EVENTS, &token, None);
    assert_eq!((through.status, on_owner.status), (200, 200));
    let (status, answer) = call(
        &set[other],
        &token,
        "POST",
        "/environments/prod/intents",
        &json!({"resources": resources}),
    );
    assert_eq!(status, 201, "{answer}");

    // Mid-deploy: some deployed, not all.
    let deployed = |replica: &Served| {
        let (_, env) = call(replica, &token, "GET", "/environments/prod", &Value::Null);
        env["resources"]["deployed"].as_u64().unwrap_or(0) as usize
    };
    let survivor = set[(at + 1) % set.len()].addr.clone();
    wait_for("the deploy to be under way", Duration::from_secs(60), async || {
        (FILES / 10..FILES).contains(&deployed(&set[at]))
    })
    .await;
    let killed = set.remove(at);
    let killed_at = Instant::now();
    drop(killed.kill());

    let watcher = set.iter().find(|r| r.addr == survivor).unwrap();
    let new_owner = wait_for("another replica to own prod", TAKEOVER, async || {
        owner_of(watcher, &token, "prod").filter(|o| *o != owner)
    })
    .await;
    let took = killed_at.elapsed();
    eprintln!("takeover after SIGKILL: {} ms", took.as_millis());
    let new_owner = set.iter().find(|r| r.addr == new_owner).unwrap();

    // The owner's reader lost its stream with its replica; it resumes on the survivor.
    let before_kill = drain(&on_owner, None);
    let resumed_after = before_kill.last().and_then(|e| e.id.clone()).expect("events before the kill");
    let resumed = SseStream::open(&survivor, EVENTS, &token, Some(&resumed_after));
    assert_eq!(resumed.status, 200);

    wait_for("every resource deployed", Duration::from_secs(120), async || {
        let (_, env) = call(new_owner, &token, "GET", "/environments/prod", &Value::Null);
        (env["resources"]["deployed"].as_u64() == Some(FILES as u64))
            .then_some(())
            .ok_or(env.to_string())
    })
    .await;
    let (_, env) = call(new_owner, &token, "GET", "/environments/prod", &Value::Null);
    assert_eq!(env["resources"].as_object().unwrap().len(), 1, "only `deployed`: {env}");
    for i in 0..FILES {
        assert_eq!(std::fs::read_to_string(path(i)).unwrap(), content(i), "{}", path(i).display());
    }

    // The action log, page by page: one successful deploy per resource.
    let mut succeeded: HashMap<String, Vec<Value>> = HashMap::new();
    let mut before: Option<String> = None;
    loop {
        let query = match &before {
            Some(b) => format!("/environments/prod/actions?limit=1000&before={b}"),
            None => "/environments/prod/actions?limit=1000".to_string(),
        };
        let (status, page) = call(new_owner, &token, "GET", &query, &Value::Null);
        assert_eq!(status, 200, "{page}");
        for action in page["items"].as_array().unwrap() {
            if action["kind"] == "deploy" && (action["outcome"] == "changed" || action["outcome"] == "unchanged") {
                succeeded
                    .entry(action["resource_id"].as_str().unwrap().to_string())
                    .or_default()
                    .push(action.clone());
            }
        }
        match &page["next_before"] {
            Value::Null => break,
            next => before = Some(next.to_string().trim_matches('"').to_string()),
        }
    }
    assert_eq!(succeeded.len(), FILES, "every resource has its successful deploy");
    let twice: Vec<_> = succeeded.iter().filter(|(_, actions)| actions.len() > 1).collect();
    assert!(twice.is_empty(), "deployed twice: {twice:?}");

    // The streams: what the reader through the failover got is the whole recorded stream (read
    // again from its start), and the resumed reader got the same, with no gap and nothing twice.
    let whole = drain(&through, None);
    let last = whole.last().and_then(|e| e.id.clone()).expect("events");
    let recorded = drain(&SseStream::open(&new_owner.addr, EVENTS, &token, Some("0")), Some(&last));
    let mut joined = before_kill.clone();
    joined.extend(drain(&resumed, Some(&last)));
    assert_eq!(
        whole.len(),
        recorded.len(),
        "the stream through the failover has every recorded event"
    );
    assert!(whole == recorded, "the stream through the failover is the recorded one");
    assert!(joined == whole, "the resumed stream has every event once, in order");
    let ids: Vec<i64> = whole.iter().map(|e| e.id.as_deref().unwrap().parse().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "numbers increase");
    let deployed_states: std::collections::HashSet<String> = whole
        .iter()
        .filter(|e| e.name == "state")
        .map(|e| serde_json::from_str::<Value>(&e.data).unwrap())
        .filter(|state| state["status"] == "deployed")
        .map(|state| state["resource"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(deployed_states.len(), FILES, "every resource's `deployed` is in the stream");
    let deploys = whole
        .iter()
        .filter(|e| e.name == "action")
        .map(|e| serde_json::from_str::<Value>(&e.data).unwrap())
        .filter(|a| a["report"]["outcome"] == "changed" || a["report"]["outcome"] == "unchanged")
        .count();
    assert_eq!(deploys, FILES, "one successful action event per resource");
}

/// The events of `stream` until the one numbered `until` (or until none comes for 3 s, or the
/// stream ends).
fn drain(stream: &SseStream, until: Option<&str>) -> Vec<SseEvent> {
    let mut events = Vec::new();
    while let Some(event) = stream.next(Duration::from_secs(if until.is_some() { 30 } else { 3 })) {
        let done = until.is_some() && event.id.as_deref() == until;
        events.push(event);
        if done {
            break;
        }
    }
    if let Some(until) = until {
        assert_eq!(
            events.last().and_then(|e| e.id.as_deref()),
            Some(until),
            "the stream reached {until}"
        );
    }
    events
}

/// The owner is stopped (SIGSTOP) in the middle of a deploy for longer than its lease: its
/// presence session stays open, so the other replica takes the environment over once the lease
/// expires (its open transaction, holding the fence, is ended by the server meanwhile),
/// finishes the deploy and deploys a second version. Then the old owner wakes (SIGCONT) with
/// actions of the first version still in flight: it records nothing, counts the environment
/// lost and is live again as a standby; of its actions, none starts a new change (its tenure
/// went stale while it was stopped), and at most the changes already sent when it stopped (one
/// per action slot) land. A repair by the new owner finds and restores those.
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_owner_changes_nothing_after_the_takeover_and_rejoins() {
    let sshd = Sshd::start();
    let database = database().await;
    let keys = tempfile::tempdir().unwrap();
    let (set, token) = start_set(&database, keys.path(), 2);
    let node = json!({"name": "web1", "address": "127.0.0.1", "port": sshd.port, "user": TEST_USER,
        "credential": {"private_key": sshd.client_key}});
    assert_eq!(call(&set[0], &token, "POST", "/nodes", &node).0, 201);
    assert_eq!(call(&set[0], &token, "POST", "/environments", &json!({"name": "prod"})).0, 201);
    let owner = wait_for("a replica to own prod", Duration::from_secs(10), async || {
        owner_of(&set[0], &token, "prod")
    })
    .await;
    let (a, b) = match set.iter().position(|r| r.addr == owner).unwrap() {
        0 => (&set[0], &set[1]),
        _ => (&set[1], &set[0]),
    };
    let dir = sshd.scratch_dir("paused");
    let path = |i: usize| dir.join(format!("f{i:05}.conf"));
    let version = |v: u32| -> Value {
        let resources: Vec<Value> = (0..FILES)
            .map(|i| {
                json!({"id": format!("file[web1,{}]", path(i).display()), "adaptor": "file@0.1.0",
                    "attributes": {"content": format!("version {v} of file {i}\n"), "mode": "0644"}})
            })
            .collect();
        json!({ "resources": resources })
    };
    let deployed = |replica: &Served, v: u64| {
        let (_, env) = call(replica, &token, "GET", "/environments/prod", &Value::Null);
        (env["resources"]["deployed"].as_u64() == Some(FILES as u64) && env["released_version"].as_u64() == Some(v))
            .then_some(())
            .ok_or(env.to_string())
    };
    assert_eq!(call(a, &token, "POST", "/environments/prod/intents", &version(1)).0, 201);
    wait_for("the deploy to be under way", Duration::from_secs(60), async || {
        let (_, env) = call(a, &token, "GET", "/environments/prod", &Value::Null);
        (FILES / 10..FILES).contains(&(env["resources"]["deployed"].as_u64().unwrap_or(0) as usize))
    })
    .await;
    a.signal("-STOP");
    let stopped_at = Instant::now();
    wait_for("the other replica to own prod", TAKEOVER, async || {
        owner_of(b, &token, "prod").filter(|o| *o == b.addr)
    })
    .await;
    eprintln!("takeover after SIGSTOP: {} ms", stopped_at.elapsed().as_millis());
    wait_for("version 1 deployed by the new owner", Duration::from_secs(120), async || {
        deployed(b, 1)
    })
    .await;
    assert_eq!(call(b, &token, "POST", "/environments/prod/intents", &version(2)).0, 201);
    wait_for("version 2 deployed", Duration::from_secs(120), async || deployed(b, 2)).await;

    a.signal("-CONT");
    wait_for("the old owner to count the environment lost", Duration::from_secs(10), async || {
        let (status, answer) = request(&a.addr, "GET", "/metrics", None, "");
        status == 200 && body_of(&answer).lines().any(|l| l == "orc_environment_losses_total 1")
    })
    .await;
    let seen = replica_set(b, &token);
    let woken = seen.iter().find(|r| r["address"] == a.addr.as_str()).unwrap();
    assert_eq!(woken["live"], true, "{seen:?}");
    // Nothing of the old owner reached the store: every state is still version 2, deployed.
    deployed(b, 2).unwrap();
    let stale = || -> Vec<usize> {
        (0..FILES)
            .filter(|i| std::fs::read_to_string(path(*i)).unwrap() != format!("version 2 of file {i}\n"))
            .collect()
    };
    let late = stale();
    assert!(
        late.len() <= 16,
        "{} files changed by the paused owner after it woke: {late:?}",
        late.len()
    );
    let (status, answer) = call(b, &token, "POST", "/environments/prod/repair", &Value::Null);
    assert_eq!(status, 202, "{answer}");
    wait_for(
        "the repair to restore what the old owner's last changes undid",
        Duration::from_secs(60),
        async || stale().is_empty(),
    )
    .await;
    eprintln!("files the paused owner changed as it woke: {}", late.len());
}

/// What each live replica holds, by id, as `replica` sees it (the draining included).
fn holdings(replica: &Served, token: &str) -> HashMap<String, Vec<String>> {
    replica_set(replica, token)
        .into_iter()
        .filter(|r| r["live"] == true)
        .map(|r| {
            let held = r["holds"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h["environment"].as_str().unwrap().to_string())
                .collect();
            (r["id"].as_str().unwrap().to_string(), held)
        })
        .collect()
}

/// Whether every one of `envs` is held once, and the holders' counts are within one of even
/// (`skip`: a replica that should hold none).
fn spread_evenly(held: &HashMap<String, Vec<String>>, envs: usize, skip: Option<&str>) -> Result<(), String> {
    let counts: Vec<(String, usize)> = held
        .iter()
        .filter(|(id, _)| Some(id.as_str()) != skip)
        .map(|(id, h)| (id.clone(), h.len()))
        .collect();
    let all: std::collections::HashSet<&String> = held.values().flatten().collect();
    let total: usize = held.values().map(Vec::len).sum();
    let (least, most) = (
        counts.iter().map(|c| c.1).min().unwrap_or(0),
        counts.iter().map(|c| c.1).max().unwrap_or(0),
    );
    let skipped = skip.map_or(0, |s| held.get(s).map_or(0, Vec::len));
    (all.len() == envs && total == envs && most - least <= 1 && skipped == 0)
        .then_some(())
        .ok_or(format!(
            "{} distinct, {total} held, counts {counts:?}, {skipped} on the drained one",
            all.len()
        ))
}

/// 50 environments over three replicas spread within one of even, each held once; draining
/// one replica moves its environments to the other two, again within one of even, and nothing
/// is lost: every environment keeps its version and has every resource deployed.
#[tokio::test(flavor = "multi_thread")]
async fn fifty_environments_spread_over_three_replicas_and_a_drain_moves_them() {
    const ENVS: usize = 50;
    let database = database().await;
    let keys = tempfile::tempdir().unwrap();
    let (set, token) = start_set(&database, keys.path(), 3);
    let name = |i: usize| format!("env{i:02}");
    for i in 0..ENVS {
        let (status, made) = call(&set[i % 3], &token, "POST", "/environments", &json!({"name": name(i)}));
        assert_eq!(status, 201, "{made}");
        let intent = json!({"resources": [
            {"id": format!("file[local,/{}-a]", name(i)), "adaptor": "file@0.1.0", "attributes": {"content": "a\n"}},
            {"id": format!("file[local,/{}-b]", name(i)), "adaptor": "file@0.1.0", "attributes": {"content": "b\n"}},
        ]});
        let (status, version) = call(
            &set[(i + 1) % 3],
            &token,
            "POST",
            &format!("/environments/{}/intents", name(i)),
            &intent,
        );
        assert_eq!(status, 201, "{version}");
    }
    wait_for("the environments spread within one of even", Duration::from_secs(60), async || {
        spread_evenly(&holdings(&set[0], &token), ENVS, None)
    })
    .await;

    let drained = holdings(&set[1], &token).into_iter().max_by_key(|(_, h)| h.len()).unwrap().0;
    let (status, answer) = call(&set[2], &token, "POST", &format!("/replicas/{drained}/drain"), &Value::Null);
    assert_eq!(status, 202, "{answer}");
    wait_for("the drained replica's environments to move", Duration::from_secs(90), async || {
        spread_evenly(&holdings(&set[0], &token), ENVS, Some(&drained))
    })
    .await;
    for i in 0..ENVS {
        wait_for(
            "every environment deployed, on its one version",
            Duration::from_secs(30),
            async || {
                let (_, env) = call(&set[i % 3], &token, "GET", &format!("/environments/{}", name(i)), &Value::Null);
                (env["latest_version"] == 1 && env["resources"]["deployed"] == 2)
                    .then_some(())
                    .ok_or(env.to_string())
            },
        )
        .await;
    }
}

/// A console session started on one replica is known to every other and outlives the replica
/// it started on; signing out on one ends it on all.
#[tokio::test(flavor = "multi_thread")]
async fn a_console_session_works_on_every_replica_and_outlives_its_own() {
    let database = database().await;
    let keys = tempfile::tempdir().unwrap();
    let (mut set, token) = start_set(&database, keys.path(), 3);
    let form = format!("token={token}");
    let (status, answer) = request_with(
        &set[0].addr,
        "POST",
        "/sign-in",
        &[("content-type", "application/x-www-form-urlencoded")],
        &form,
    );
    assert_eq!(status, 303, "{answer}");
    let cookie = answer
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .unwrap()
        .to_string();
    let page = |replica: &Served| request_with(&replica.addr, "GET", "/environments", &[("cookie", &cookie)], "");
    for replica in &set {
        let (status, answer) = page(replica);
        assert_eq!(status, 200, "{answer}");
    }
    drop(set.remove(0).kill());
    let (status, answer) = page(&set[0]);
    assert_eq!(status, 200, "the session outlives the replica it started on: {answer}");

    // Signing out needs the page's CSRF field.
    let body = body_of(&answer);
    let csrf = body
        .split("name=\"_csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("a CSRF field in {body}"));
    let (status, answer) = request_with(
        &set[0].addr,
        "POST",
        "/sign-out",
        &[("cookie", &cookie), ("content-type", "application/x-www-form-urlencoded")],
        &format!("_csrf={csrf}"),
    );
    assert_eq!(status, 303, "{answer}");
    let (status, answer) = page(&set[1]);
    assert_eq!(status, 303, "signed out everywhere: {answer}");
}
