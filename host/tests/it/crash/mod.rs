//! Crash recovery of the real binary: `orc-host serve` is killed with SIGKILL in the middle of a
//! 10,000-resource deploy and started again on the same data directory and database. What was
//! persisted at the moment of the kill is read straight from the database (the host is dead, so
//! it cannot change); after the restart every resource must end `deployed` with its file on the
//! node, nothing may be stuck, and nothing that was confirmed deployed before the kill may run
//! again or lose what the store knew of it. Then a second version changing every file is
//! released and the host killed again in the middle of that update, and restarted. At each kill,
//! every resource the store holds `deployed` must have its file on the node with the content of
//! the version it is stored deployed at: the durability fence (`StoreSink::after_nodes`) comes
//! before a batch is stored. Once on SQLite, once on PostgreSQL (a database on the cluster this
//! test binary starts; see `orc_tests::pg`). The test polls, never sleeps.
//!
//! What SIGKILL tests is the order: no state is stored ahead of the file it records. A killed
//! process's writes are still in the kernel's page cache, so they survive it whether synced or
//! not; a power loss, which the fence's `syncfs` is there for, cannot be simulated here.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use orc_host::scheduler::ResourceStatus;
use orc_host::store::{ActionFilter, Backend, EnvironmentId, ResourceState, SQLITE_FILE, Store};
use orc_tests::pg;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

use crate::support::paths;

mod sqlite {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_host_killed_mid_deploy_restarts_and_converges() {
        super::killed_mid_deploy(orc_host::store::Backend::Sqlite).await
    }
}

mod postgres {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_host_killed_mid_deploy_restarts_and_converges() {
        super::killed_mid_deploy(orc_host::store::Backend::Postgres).await
    }
}

/// Resources in the intent: `DIRECTORIES` directories, each with the files that require it.
const RESOURCES: usize = 10_000;
const DIRECTORIES: usize = 100;
/// The host is killed once at least this many resources are deployed.
const KILL_AFTER: i64 = 1_500;
const ENV: &str = "crash";

/// How long the host may take to start, and a deploy of every resource to finish.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const DEPLOY_TIMEOUT: Duration = Duration::from_secs(240);

/// The content of file `i` in version `round` of the intent.
fn content(i: usize, round: i64) -> String {
    if round == 1 {
        format!("resource {i}\n")
    } else {
        format!("resource {i}, version {round}\n")
    }
}

/// The intent: `directory[local,/dNN]` and `file[local,/dNN/fNNNNN.txt]` requiring it, with
/// version `round`'s content.
fn intent(round: i64) -> (Value, Vec<(String, String)>) {
    let mut resources = Vec::with_capacity(RESOURCES);
    let mut files = Vec::with_capacity(RESOURCES - DIRECTORIES);
    for d in 0..DIRECTORIES {
        resources
            .push(json!({ "id": format!("directory[local,/d{d:02}]"), "adaptor": "directory@0.1.0", "attributes": { "mode": "0755" } }));
    }
    for i in 0..RESOURCES - DIRECTORIES {
        let d = i % DIRECTORIES;
        let path = format!("/d{d:02}/f{i:05}.txt");
        let content = content(i, round);
        resources.push(json!({
            "id": format!("file[local,{path}]"),
            "adaptor": "file@0.1.0",
            "attributes": { "content": content, "mode": "0644" },
            "requires": [format!("directory[local,/d{d:02}]")],
        }));
        files.push((path, content));
    }
    (json!({ "resources": resources }), files)
}

/// One run of `orc-host serve` as a child process. Its stderr is relayed into the test's output
/// (shown when the test fails). Killed if dropped.
struct Host {
    child: Child,
    api: String,
    client: reqwest::Client,
    token: String,
}

impl Host {
    /// Starts the binary and reads where it listens (and, on a first start, the admin token)
    /// from its stdout; `token` is the one an earlier start on the same data printed.
    async fn spawn(run: usize, data_dir: &Path, database: Option<&str>, token: Option<String>) -> Host {
        let mut command = Command::new(env!("CARGO_BIN_EXE_orc-host"));
        command.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"]).arg(data_dir);
        if let Some(database) = database {
            command.args(["--database", database]);
        }
        for var in ["ORC_CONFIG", "ORC_LISTEN", "ORC_DATA_DIR", "ORC_DATABASE", "ORC_MAX_BODY_BYTES"] {
            command.env_remove(var);
        }
        let mut child = command
            .env("ORC_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("orc-host starts");
        let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = stderr.next_line().await {
                eprintln!("[orc-host run {run}] {line}");
            }
        });
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut next_line = async || {
            tokio::time::timeout(START_TIMEOUT, stdout.next_line())
                .await
                .expect("orc-host prints a line in time")
                .unwrap()
                .expect("orc-host printed a line before exiting")
        };
        let first = next_line().await;
        let url = first
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line `{first}`"))
            .to_string();
        let token = match token {
            Some(token) => token,
            None => {
                let line = next_line().await;
                let (_, token) = line
                    .split_once("admin token (shown once; only its hash is stored): ")
                    .unwrap_or_else(|| panic!("expected the admin token, got `{line}`"));
                token.to_string()
            }
        };
        // Nothing else is printed, but a closed pipe must not be what stops the host.
        tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
        Host {
            child,
            api: format!("{url}/api/v1"),
            client: reqwest::Client::new(),
            token,
        }
    }

    async fn request(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> (StatusCode, Value) {
        let mut req = self.client.request(method, format!("{}{path}", self.api)).bearer_auth(&self.token);
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.unwrap_or_else(|e| panic!("{path}: {e}"));
        let status = resp.status();
        let bytes = resp.bytes().await.unwrap();
        let value =
            serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
        (status, value)
    }

    async fn get(&self, path: &str) -> Value {
        let (status, value) = self.request(reqwest::Method::GET, path, None).await;
        assert_eq!(status, StatusCode::OK, "GET {path}: {value}");
        value
    }

    /// The environment's resource counts per status, as the API reports them.
    async fn counts(&self) -> BTreeMap<String, i64> {
        let env = self.get(&format!("/environments/{ENV}")).await;
        serde_json::from_value(env["resources"].clone()).unwrap_or_else(|e| panic!("resource counts ({e}): {env}"))
    }

    /// Polls the counts until `done` holds for them; bounded, so a hang fails.
    async fn wait_for_counts(&self, what: &str, timeout: Duration, done: impl Fn(&BTreeMap<String, i64>) -> bool) -> BTreeMap<String, i64> {
        let deadline = Instant::now() + timeout;
        loop {
            let counts = self.counts().await;
            if done(&counts) {
                return counts;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not reached within {timeout:?}; counts {counts:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// SIGKILL: no shutdown path of the host runs.
    async fn kill(mut self) {
        self.child.start_kill().unwrap();
        let status = self.child.wait().await.unwrap();
        assert_eq!(status.signal(), Some(SIGKILL), "{status}");
    }
}

const SIGKILL: i32 = 9;

/// What the database holds for the environment: every state, and the newest action's `seq`.
async fn persisted(location: &str, env: &EnvironmentId) -> (HashMap<String, ResourceState>, i64) {
    let store = Store::connect(location).await.unwrap();
    let states = store.load_states(env).await.unwrap();
    let newest = store
        .list_actions(
            env,
            &ActionFilter {
                limit: 1,
                ..ActionFilter::default()
            },
        )
        .await
        .unwrap()
        .items
        .first()
        .map_or(0, |a| a.seq);
    store.close().await;
    (states.into_iter().map(|s| (s.resource_id.clone(), s)).collect(), newest)
}

/// Every resource `states` holds `deployed` is on the node under `root`: a directory is there,
/// a file holds the content of the version it is stored deployed at. Returns how many files.
fn deployed_are_on_disk(states: &HashMap<String, ResourceState>, root: &Path) -> usize {
    let mut files = 0;
    for (id, state) in states.iter().filter(|(_, s)| s.status == ResourceStatus::Deployed) {
        assert_eq!(state.deployed_hash.as_ref(), Some(&state.desired_hash), "{id}: {state:?}");
        let path = id.split_once(',').and_then(|(_, p)| p.strip_suffix(']')).expect("type[node,path]");
        let on_disk = root.join(&path[1..]);
        if id.starts_with("directory[") {
            assert!(
                on_disk.is_dir(),
                "{id} is stored deployed, but {} is not a directory",
                on_disk.display()
            );
            continue;
        }
        let i: usize = path
            .rsplit_once("/f")
            .and_then(|(_, f)| f.strip_suffix(".txt"))
            .expect("fNNNNN.txt")
            .parse()
            .unwrap();
        let text = std::fs::read_to_string(&on_disk).unwrap_or_else(|e| {
            panic!(
                "{id} is stored deployed at version {}, but its file cannot be read: {e}",
                state.version
            )
        });
        assert_eq!(
            text,
            content(i, state.version),
            "{id} is stored deployed at version {}",
            state.version
        );
        files += 1;
    }
    files
}

/// Every action in the environment's log after `seq`, oldest first.
async fn actions_after(location: &str, env: &EnvironmentId, seq: i64) -> Vec<orc_host::store::LoggedAction> {
    let store = Store::connect(location).await.unwrap();
    let mut all = Vec::new();
    let mut before = None;
    'pages: loop {
        let page = store
            .list_actions(
                env,
                &ActionFilter {
                    before,
                    limit: 10_000,
                    ..ActionFilter::default()
                },
            )
            .await
            .unwrap();
        for a in page.items {
            if a.seq <= seq {
                break 'pages;
            }
            all.push(a);
        }
        match page.next_before {
            Some(b) => before = Some(b),
            None => break,
        }
    }
    store.close().await;
    all.reverse();
    all
}

/// Every action in the environment's log, per resource.
async fn actions_per_resource(location: &str, env: &EnvironmentId) -> HashMap<String, Vec<orc_host::store::LoggedAction>> {
    let mut per_resource: HashMap<String, Vec<_>> = HashMap::new();
    for a in actions_after(location, env, 0).await {
        per_resource.entry(a.action.resource_id.clone()).or_default().push(a);
    }
    per_resource
}

async fn killed_mid_deploy(backend: Backend) {
    let started = Instant::now();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let data_dir: PathBuf = dir.path().join("data");
    let database = match backend {
        Backend::Sqlite => None,
        Backend::Postgres => Some(pg::fresh_database().await.unwrap()),
    };
    let location = database
        .clone()
        .unwrap_or_else(|| format!("sqlite:{}", data_dir.join(SQLITE_FILE).display()));
    let (first, files) = intent(1);
    let root = orc_host::app::node_root(&data_dir, ENV);

    // First run: submit, and kill the host once the deploy is under way.
    let host = Host::spawn(1, &data_dir, database.as_deref(), None).await;
    let (status, env) = host
        .request(reqwest::Method::POST, "/environments", Some(&json!({ "name": ENV })))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{env}");
    let env_id: EnvironmentId = env["id"].as_str().unwrap().parse().unwrap();
    let (status, submitted) = host
        .request(reqwest::Method::POST, &format!("/environments/{ENV}/intents"), Some(&first))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{submitted}");
    assert_eq!(submitted, json!({ "version": 1, "released": true }));
    let submitted_at = Instant::now();
    host.wait_for_counts("the deploy under way", DEPLOY_TIMEOUT, |c| {
        c.get("deployed").copied().unwrap_or(0) >= KILL_AFTER
    })
    .await;
    let token = host.token.clone();
    host.kill().await;
    let killed_at = Instant::now();

    // What the database held when the host died.
    let (at_kill, last_seq_at_kill) = persisted(&location, &env_id).await;
    let confirmed: HashMap<&String, &ResourceState> = at_kill.iter().filter(|(_, s)| s.status == ResourceStatus::Deployed).collect();
    assert!(
        confirmed.len() >= KILL_AFTER as usize && confirmed.len() < RESOURCES,
        "the kill came in the middle of the deploy: {} of {RESOURCES} deployed",
        confirmed.len()
    );
    let mut statuses: BTreeMap<&str, usize> = BTreeMap::new();
    for s in at_kill.values() {
        *statuses.entry(s.status.as_str()).or_default() += 1;
    }
    // Nothing confirmed that is not on the node.
    let on_disk_at_kill = deployed_are_on_disk(&at_kill, &root);
    // Nothing confirmed without a trace: each deployed resource's successful action is logged.
    let log_at_kill = actions_per_resource(&location, &env_id).await;
    for (id, state) in &confirmed {
        assert_eq!(state.deployed_hash.as_ref(), Some(&state.desired_hash), "{id}: {state:?}");
        let actions = log_at_kill.get(*id).map(Vec::as_slice).unwrap_or_default();
        assert!(
            actions.iter().any(|a| a.action.outcome == "changed"),
            "{id} is deployed at the kill, but its action is not in the log: {actions:?}"
        );
    }

    // Second run on the same data: it converges.
    let host = Host::spawn(2, &data_dir, database.as_deref(), Some(token)).await;
    let restarted_at = Instant::now();
    let counts = host
        .wait_for_counts("every resource deployed after the restart", DEPLOY_TIMEOUT, |c| {
            c.get("deployed").copied().unwrap_or(0) == RESOURCES as i64 || c.keys().any(|s| s == "failed" || s == "skipped")
        })
        .await;
    assert_eq!(
        counts,
        BTreeMap::from([("deployed".to_string(), RESOURCES as i64)]),
        "nothing failed, skipped or stuck"
    );
    let converged_at = Instant::now();

    // A resource confirmed before the kill: its recent actions through the API are the one of
    // the first run.
    let (some_id, _) = confirmed.iter().next().unwrap();
    let view = host.get(&format!("/environments/{ENV}/resources/{}", paths::encode(some_id))).await;
    assert_eq!(view["state"]["status"], "deployed", "{view}");
    assert_eq!(view["actions"].as_array().map(Vec::len), Some(1), "{view}");
    assert!(view["actions"][0]["seq"].as_i64().unwrap() <= last_seq_at_kill, "{view}");
    let token = host.token.clone();
    host.kill().await;

    // The database after convergence, read with the host gone.
    let (after, _) = persisted(&location, &env_id).await;
    assert_eq!(after.len(), RESOURCES);
    for (id, state) in &after {
        assert_eq!(state.status, ResourceStatus::Deployed, "{id}: {state:?}");
        assert_eq!(state.deployed_hash.as_ref(), Some(&state.desired_hash), "{id}: {state:?}");
        assert!(state.last_error.is_none(), "{id}: {state:?}");
    }
    // Confirmed deployments were not redone, and the store lost nothing it knew of them.
    let rerun = actions_after(&location, &env_id, last_seq_at_kill).await;
    let rerun_ids: HashSet<&str> = rerun.iter().map(|a| a.action.resource_id.as_str()).collect();
    let redone: Vec<&&String> = confirmed.keys().filter(|id| rerun_ids.contains(id.as_str())).collect();
    assert!(
        redone.is_empty(),
        "{} resources confirmed before the kill ran again, e.g. {:?}",
        redone.len(),
        redone.first()
    );
    let mut forgotten: Vec<(&ResourceState, &ResourceState)> = confirmed
        .iter()
        .filter(|(id, s)| after[**id] != ***s)
        .map(|(id, s)| (*s, &after[*id]))
        .collect();
    forgotten.sort_by(|a, b| a.0.resource_id.cmp(&b.0.resource_id));
    assert!(
        forgotten.is_empty(),
        "{} resources confirmed before the kill changed state after it, e.g. {:?}",
        forgotten.len(),
        forgotten.first()
    );
    // Everything else ran again, once, successfully.
    let unconfirmed = RESOURCES - confirmed.len();
    assert_eq!(
        rerun_ids.len(),
        unconfirmed,
        "each resource not confirmed at the kill ran after the restart"
    );
    assert_eq!(rerun.len(), unconfirmed, "once each");
    for a in &rerun {
        assert!(matches!(a.action.outcome.as_str(), "changed" | "unchanged"), "{a:?}");
    }
    // And the node holds every file.
    for d in 0..DIRECTORIES {
        assert!(root.join(format!("d{d:02}")).is_dir(), "/d{d:02}");
    }
    for (path, content) in &files {
        let on_disk = std::fs::read_to_string(root.join(&path[1..])).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(&on_disk, content, "{path}");
    }

    // Third run: version 2 changes every file; the host is killed in the middle of the update.
    let host = Host::spawn(3, &data_dir, database.as_deref(), Some(token.clone())).await;
    let (second, files) = intent(2);
    let (status, submitted) = host
        .request(reqwest::Method::POST, &format!("/environments/{ENV}/intents"), Some(&second))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{submitted}");
    assert_eq!(submitted, json!({ "version": 2, "released": true }));
    let files_at_v2 = (RESOURCES - DIRECTORIES) as i64;
    // The release shows (the files are no longer deployed), then the update gets under way.
    host.wait_for_counts("the release of version 2", DEPLOY_TIMEOUT, |c| {
        c.get("deployed").copied().unwrap_or(0) < RESOURCES as i64 - files_at_v2 / 2
    })
    .await;
    host.wait_for_counts("the update under way", DEPLOY_TIMEOUT, |c| {
        c.get("deployed").copied().unwrap_or(0) >= DIRECTORIES as i64 + KILL_AFTER
    })
    .await;
    host.kill().await;
    let (at_update_kill, _) = persisted(&location, &env_id).await;
    let updated = at_update_kill
        .values()
        .filter(|s| s.status == ResourceStatus::Deployed && s.version == 2 && s.resource_type == "file")
        .count();
    assert!(
        updated >= KILL_AFTER as usize && updated < files_at_v2 as usize,
        "the kill came in the middle of the update: {updated} files deployed at version 2"
    );
    let on_disk_at_update_kill = deployed_are_on_disk(&at_update_kill, &root);

    // Fourth run: the update converges.
    let host = Host::spawn(4, &data_dir, database.as_deref(), Some(token)).await;
    let counts = host
        .wait_for_counts("every resource deployed after the update's restart", DEPLOY_TIMEOUT, |c| {
            c.get("deployed").copied().unwrap_or(0) == RESOURCES as i64 || c.keys().any(|s| s == "failed" || s == "skipped")
        })
        .await;
    assert_eq!(counts, BTreeMap::from([("deployed".to_string(), RESOURCES as i64)]));
    host.kill().await;
    let (after_update, _) = persisted(&location, &env_id).await;
    assert!(after_update.values().all(|s| s.version == 2), "every state is of version 2");
    assert_eq!(deployed_are_on_disk(&after_update, &root), files.len());
    for (path, content) in &files {
        let on_disk = std::fs::read_to_string(root.join(&path[1..])).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(&on_disk, content, "{path}");
    }

    eprintln!(
        "{backend}: deploy under way for {:.2} s, killed with {statuses:?} ({on_disk_at_kill} files stored deployed, \
         all on disk); restart converged in {:.2} s ({} resources ran again); update killed with {updated} files \
         deployed at version 2 ({on_disk_at_update_kill} stored deployed files on disk) and converged; whole test {:.2} s",
        (killed_at - submitted_at).as_secs_f64(),
        (converged_at - restarted_at).as_secs_f64(),
        unconfirmed,
        started.elapsed().as_secs_f64()
    );
}
