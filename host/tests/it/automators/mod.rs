//! The first-party automators `shell` and `redis` on a real node over SSH (an OpenSSH sshd the
//! test starts, as root), called directly through the runtime: `check`, then `perform`, for each
//! action, as the host's executor does. `redis` drives a real `redis-server` (Debian's package,
//! installed by `.ci/run`) on a free port, which the test talks to over TCP itself.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use orc_manifest::{Capability, Digest, PluginKind};
use orc_node::Nodes;
use orc_runtime::capability::MemoryKv;
use orc_runtime::wit::{Action, Outcome, Task};
use orc_runtime::{CallContext, CallError, Change, Grants, LoadError, Plugin, PluginErrorKind, Runtime, RuntimeConfig};
use orc_tests::sshd::Sshd;
use serde_json::{Value, json};

use crate::support::ssh_node;

const NODE: &str = "web1";

struct Harness {
    sshd: Sshd,
    scratch: PathBuf,
    runtime: Runtime,
    ctx: CallContext,
}

impl Harness {
    async fn start(name: &str) -> Harness {
        let sshd = Sshd::start();
        let scratch = sshd.scratch_dir(name);
        let node = ssh_node::connect_as_root(&sshd).await;
        let nodes = Nodes::default();
        nodes.insert(NODE, Arc::new(node));
        // One kv for the whole test: the shell automator's performed records outlive instances.
        let ctx = CallContext {
            nodes: Arc::new(nodes),
            kv: Arc::new(MemoryKv::default()),
            ..CallContext::new("test")
        };
        let runtime = Runtime::new(RuntimeConfig {
            max_instances: 8,
            ..RuntimeConfig::default()
        })
        .unwrap();
        Harness {
            sshd,
            scratch,
            runtime,
            ctx,
        }
    }

    fn load(&self, name: &str, grants: &Grants) -> Result<Arc<Plugin>, LoadError> {
        let artifact = orc_plugin_artifacts::by_name(name).unwrap();
        let digest: Digest = artifact.digest.parse().unwrap();
        self.runtime.load_bytes(&digest, artifact.bytes, PluginKind::Automator, grants)
    }

    fn path(&self, name: &str) -> String {
        self.scratch.join(name).to_str().unwrap().to_string()
    }

    /// `check` on a fresh instance, as the executor calls it.
    async fn check(&self, plugin: &Plugin, task: &Task) -> Result<Vec<Change>, CallError> {
        plugin.automator(&self.ctx).await?.check(task).await
    }

    /// `perform` on a fresh instance.
    async fn perform(&self, plugin: &Plugin, task: &Task) -> Result<Outcome, CallError> {
        plugin.automator(&self.ctx).await?.perform(task).await
    }

    /// Check, perform, check again: the second check must hold. Returns the first check's changes.
    async fn converge(&self, plugin: &Plugin, task: &Task) -> Vec<Change> {
        let what = format!("{:?} {}/{}", task.action, task.cluster, task.service);
        let before = self
            .check(plugin, task)
            .await
            .unwrap_or_else(|e| panic!("check {what}: {e}\n{}", self.sshd.log()));
        assert!(!before.is_empty(), "{what}: check found nothing to do");
        self.perform(plugin, task).await.unwrap_or_else(|e| panic!("perform {what}: {e}"));
        let after = self.check(plugin, task).await.unwrap_or_else(|e| panic!("check {what}: {e}"));
        assert!(after.is_empty(), "{what}: still differs after perform: {after:?}");
        before
    }
}

fn task(cluster: &str, service: &str, action: Action, config: &Value, layout: &Value) -> Task {
    Task {
        cluster: cluster.into(),
        service: service.into(),
        node: NODE.into(),
        action,
        config: config.to_string(),
        layout: layout.to_string(),
    }
}

fn failure(result: Result<impl std::fmt::Debug, CallError>) -> (PluginErrorKind, String) {
    match result {
        Err(CallError::Failed { error, .. }) => (error.kind, error.message),
        other => panic!("expected the plugin to fail, got {other:?}"),
    }
}

fn fields(changes: &[Change]) -> Vec<&str> {
    changes.iter().map(|c| c.field.as_str()).collect()
}

// ---------------------------------------------------------------------------------------------
// shell

fn shell_grants() -> Grants {
    Grants::none().with(Capability::NodeCommands).with(Capability::Kv)
}

#[tokio::test(flavor = "multi_thread")]
async fn shell_scripts_see_the_configuration_and_the_task() {
    let h = Harness::start("shell-env").await;
    let shell = h.load("shell", &shell_grants()).unwrap();
    let out = h.path("env.txt");
    let script = r#"printf '%s\n' "$GREETING" "$HTTP_PORT" "$OPTS" "$ENABLED" "$ORC_CLUSTER" "$ORC_SERVICE" "$ORC_NODE" "$ORC_ACTION" "$ORC_NODES_WEB" "$ORC_NODES_DB" "$ORC_LAYOUT" > "$OUT"; echo configured; echo to-stderr >&2"#;
    let config = json!({
        "scripts": { "configure": script },
        "greeting": "hello world",
        "http-port": 8080,
        "opts": {"a": [1, 2]},
        "enabled": true,
        "out": out,
    });
    let layout = json!({ "web1": ["web", "db"], "web2": ["web"] });
    let t = task("shop", "web", Action::Configure, &config, &layout);
    let outcome = h.perform(&shell, &t).await.unwrap();
    assert_eq!(outcome.messages, vec!["configured"]);
    let seen = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(
        lines[..10],
        [
            "hello world",
            "8080",
            r#"{"a":[1,2]}"#,
            "true",
            "shop",
            "web",
            NODE,
            "configure",
            "web1,web2",
            "web1"
        ]
    );
    assert_eq!(serde_json::from_str::<Value>(lines[10]).unwrap(), layout);
}

#[tokio::test(flavor = "multi_thread")]
async fn shell_check_scripts_decide() {
    let h = Harness::start("shell-check").await;
    let shell = h.load("shell", &shell_grants()).unwrap();
    let mark = h.path("started");
    let config = json!({
        "scripts": { "start": "touch \"$MARK\"", "stop": "rm -f \"$MARK\"" },
        "checks": { "start": "echo looking; test -f \"$MARK\"", "stop": "test ! -e \"$MARK\"" },
        "mark": mark,
    });
    let layout = json!({ "web1": ["svc"] });
    let start = task("c1", "svc", Action::Start, &config, &layout);
    let changes = h.converge(&shell, &start).await;
    assert_eq!(changes[0].field, "check");
    assert_eq!(changes[0].current, Some(json!({"exit_code": 1, "output": "looking"})));
    assert_eq!(changes[0].desired, Some(json!({"exit_code": 0})));
    assert!(Path::new(&mark).exists());
    // The check script, not a record, decides: drift made by hand is seen and healed.
    std::fs::remove_file(&mark).unwrap();
    assert_eq!(fields(&h.check(&shell, &start).await.unwrap()), ["check"]);
    h.converge(&shell, &start).await;
    let stop = task("c1", "svc", Action::Stop, &config, &layout);
    h.converge(&shell, &stop).await;
    assert!(!Path::new(&mark).exists());
    // An action without a script does nothing, and is recorded like any other: performed once,
    // then it holds.
    let install = task("c1", "svc", Action::Install, &config, &layout);
    assert_eq!(fields(&h.converge(&shell, &install).await), ["performed"]);
    let outcome = h.perform(&shell, &install).await.unwrap();
    assert_eq!(outcome.messages, vec!["no `install` script: nothing to do"]);
    // A `remove` without a script forgets the service's records on the node, so the service
    // given back to it is installed again.
    let remove = task("c1", "svc", Action::Remove, &config, &layout);
    assert_eq!(fields(&h.converge(&shell, &remove).await), ["performed"]);
    assert_eq!(fields(&h.check(&shell, &install).await.unwrap()), ["performed"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn shell_without_check_scripts_uses_performed_records() {
    let h = Harness::start("shell-records").await;
    let shell = h.load("shell", &shell_grants()).unwrap();
    let count = h.path("count");
    let config = json!({
        "scripts": {
            "install": "echo x >> \"$COUNT\"",
            "start": "echo start >> \"$COUNT\"",
            "stop": "echo stop >> \"$COUNT\"",
            "remove": "echo remove >> \"$COUNT\"",
        },
        "count": count,
    });
    let layout = json!({ "web1": ["svc"] });
    let install = task("c1", "svc", Action::Install, &config, &layout);
    let changes = h.converge(&shell, &install).await;
    assert_eq!(fields(&changes), ["performed"]);
    assert_eq!(changes[0].current, None);
    let first = changes[0].desired.clone().unwrap();
    assert!(first.as_str().unwrap().starts_with("sha256:"), "{first}");
    assert!(h.check(&shell, &install).await.unwrap().is_empty(), "a second check holds");
    // The same inputs sent with other key order hold too.
    let mut reordered = install.clone();
    reordered.config = format!(r#"{{ "scripts": {}, "count": {} }}"#, config["scripts"], json!(count));
    assert!(h.check(&shell, &reordered).await.unwrap().is_empty());

    // A changed configuration is a change from the recorded digest.
    let mut config2 = config.clone();
    config2["extra"] = json!("v2");
    let install2 = task("c1", "svc", Action::Install, &config2, &layout);
    let changes = h.check(&shell, &install2).await.unwrap();
    assert_eq!(changes[0].current.as_ref(), Some(&first));
    assert_ne!(changes[0].desired.as_ref(), Some(&first));
    // So is a changed layout.
    let bigger = json!({ "web1": ["svc"], "web2": ["svc"] });
    assert_eq!(
        fields(
            &h.check(&shell, &task("c1", "svc", Action::Install, &config, &bigger))
                .await
                .unwrap()
        ),
        ["performed"]
    );
    h.converge(&shell, &install2).await;

    // start and stop forget each other's records.
    let start = task("c1", "svc", Action::Start, &config2, &layout);
    let stop = task("c1", "svc", Action::Stop, &config2, &layout);
    h.converge(&shell, &start).await;
    h.converge(&shell, &stop).await;
    assert_eq!(fields(&h.check(&shell, &start).await.unwrap()), ["performed"]);
    h.converge(&shell, &start).await;
    assert_eq!(fields(&h.check(&shell, &stop).await.unwrap()), ["performed"]);

    // remove forgets every record of the service on the node, so a reinstall runs again.
    let remove = task("c1", "svc", Action::Remove, &config2, &layout);
    h.converge(&shell, &remove).await;
    assert_eq!(fields(&h.check(&shell, &install2).await.unwrap()), ["performed"]);
    assert_eq!(fields(&h.check(&shell, &start).await.unwrap()), ["performed"]);
    // Another service's records are its own.
    assert_eq!(
        fields(
            &h.check(&shell, &task("c1", "other", Action::Install, &config2, &layout))
                .await
                .unwrap()
        ),
        ["performed"]
    );
    assert_eq!(
        std::fs::read_to_string(&count).unwrap(),
        "x\nx\nstart\nstop\nstart\nremove\n",
        "each script ran once per performed change"
    );

    // The default check needs kv: without the grant the plugin is refused at load, naming it.
    let e = h.load("shell", &Grants::none().with(Capability::NodeCommands)).unwrap_err();
    assert!(e.to_string().contains("capability `kv`"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn shell_failures_are_errors() {
    let h = Harness::start("shell-fail").await;
    let shell = h.load("shell", &shell_grants()).unwrap();
    let layout = json!({ "web1": ["svc"] });
    let config = json!({ "scripts": { "install": "echo partial; echo 'E: no such mirror' >&2; exit 3" } });
    let install = task("c1", "svc", Action::Install, &config, &layout);
    let (kind, message) = failure(h.perform(&shell, &install).await);
    assert_eq!(kind, PluginErrorKind::Retryable);
    assert!(
        message.contains("c1/svc on web1: the `install` script exited with 3: E: no such mirror"),
        "{message}"
    );
    // A failed perform leaves no record: the task still differs.
    assert_eq!(fields(&h.check(&shell, &install).await.unwrap()), ["performed"]);
    let timed = json!({ "scripts": { "start": "sleep 30" }, "timeout_s": 1 });
    let (kind, message) = failure(h.perform(&shell, &task("c1", "svc", Action::Start, &timed, &layout)).await);
    assert_eq!(kind, PluginErrorKind::Retryable);
    assert!(
        message.contains("running the `start` script") && message.contains("timed out"),
        "{message}"
    );
    for (bad, culprit) in [
        (json!({ "scripts": { "deploy": "true" } }), "unknown action \"deploy\""),
        (json!({ "scripts": { "install": 1 } }), "invalid configuration"),
        (json!({ "orc_node": "x" }), "`orc_node`: ORC_NODE is reserved"),
        (json!({ "timeout_s": 0 }), "`timeout_s`"),
    ] {
        let (kind, message) = failure(h.check(&shell, &task("c1", "svc", Action::Install, &bad, &layout)).await);
        assert_eq!(kind, PluginErrorKind::InvalidInput, "{message}");
        assert!(message.contains(culprit), "{message}");
    }
}

// ---------------------------------------------------------------------------------------------
// redis

const REDIS_SERVER: &str = "/usr/bin/redis-server";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Sends one inline command and reads `lines` CRLF-terminated lines of the reply.
fn redis_call(port: u16, command: &str, lines: usize) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(format!("{command}\r\n").as_bytes())?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 512];
    while reply.windows(2).filter(|w| w == b"\r\n").count() < lines {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// The instance's files, and what the test removes if it fails half-way.
struct RedisInstance {
    name: String,
}

impl RedisInstance {
    fn conf(&self) -> PathBuf {
        PathBuf::from(format!("/etc/orc/redis/{}.conf", self.name))
    }
    fn pidfile(&self) -> PathBuf {
        PathBuf::from(format!("/run/orc/redis/{}.pid", self.name))
    }
    fn data_dir(&self) -> PathBuf {
        PathBuf::from(format!("/var/lib/orc/redis/{}", self.name))
    }
    fn logfile(&self) -> PathBuf {
        PathBuf::from(format!("/var/log/orc/redis/{}.log", self.name))
    }
    fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.pidfile()).ok()?.trim().parse().ok()
    }
}

impl Drop for RedisInstance {
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            let _ = std::process::Command::new("kill").arg("-KILL").arg(pid.to_string()).status();
        }
        for p in [self.conf(), self.pidfile(), self.logfile()] {
            let _ = std::fs::remove_file(p);
        }
        let _ = std::fs::remove_file(format!("/run/orc/redis/{}.started", self.name));
        let _ = std::fs::remove_dir_all(self.data_dir());
    }
}

fn uid_of_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_lifecycle_on_a_real_server() {
    assert!(
        Path::new(REDIS_SERVER).exists(),
        "{REDIS_SERVER} is missing: apt-get install redis-server (.ci/run does)"
    );
    let h = Harness::start("redis").await;
    // No kv: every check of the redis automator looks at the node.
    let redis = h.load("redis", &Grants::none().with(Capability::NodeCommands)).unwrap();
    let cluster = format!("t{}", std::process::id());
    let instance = RedisInstance {
        name: format!("{cluster}-cache"),
    };
    let port = free_port();
    let layout = json!({ "web1": ["cache"] });
    let config = json!({ "port": port });
    let t = |action, config: &Value| task(&cluster, "cache", action, config, &layout);

    // install holds: the package is there.
    assert_eq!(h.check(&redis, &t(Action::Install, &config)).await.unwrap(), vec![]);
    assert!(h.check(&redis, &t(Action::Bootstrap, &config)).await.unwrap().is_empty());

    // configure writes the instance's own file and data directory.
    let changes = h.converge(&redis, &t(Action::Configure, &config)).await;
    assert_eq!(fields(&changes), ["content", "data_dir"]);
    assert_eq!(changes[0].current, None);
    let conf = std::fs::read_to_string(instance.conf()).unwrap();
    for line in [
        format!("port {port}"),
        "bind 127.0.0.1".into(),
        format!("dir {}", instance.data_dir().display()),
        "daemonize yes".into(),
        format!("pidfile {}", instance.pidfile().display()),
        format!("logfile {}", instance.logfile().display()),
    ] {
        assert!(conf.lines().any(|l| l == line), "{line:?} missing from\n{conf}");
    }
    assert!(instance.data_dir().is_dir());

    // start: the server answers PING on its port, and runs as the redis user.
    let start = t(Action::Start, &config);
    assert_eq!(fields(&h.converge(&redis, &start).await), ["running"]);
    assert_eq!(redis_call(port, "PING", 1).unwrap(), "+PONG\r\n");
    let pid = instance.pid().expect("pid file");
    let redis_uid = std::process::Command::new("id").args(["-u", "redis"]).output().unwrap();
    let redis_uid: u32 = String::from_utf8_lossy(&redis_uid.stdout).trim().parse().unwrap();
    assert_eq!(uid_of_pid(pid), Some(redis_uid));
    assert!(h.check(&redis, &start).await.unwrap().is_empty());
    // Performing a start that holds changes nothing.
    h.perform(&redis, &start).await.unwrap();
    assert_eq!(instance.pid(), Some(pid));

    // Reconfigured: the running server no longer has the file's configuration.
    let config2 = json!({ "port": port, "maxmemory": "64mb" });
    let changes = h.converge(&redis, &t(Action::Configure, &config2)).await;
    assert_eq!(fields(&changes), ["content"]);
    let start2 = t(Action::Start, &config2);
    let changes = h.check(&redis, &start2).await.unwrap();
    assert_eq!(fields(&changes), ["config"], "{changes:?}");
    let outcome = h.perform(&redis, &start2).await.unwrap();
    assert!(
        outcome.messages.iter().any(|m| m.contains("to apply the configuration")),
        "{outcome:?}"
    );
    assert!(h.check(&redis, &start2).await.unwrap().is_empty());
    assert_ne!(instance.pid(), Some(pid), "restarted");
    let maxmemory = redis_call(port, "CONFIG GET maxmemory", 5).unwrap();
    assert!(maxmemory.contains("\r\n67108864\r\n"), "{maxmemory:?}");

    // stop: the port is closed.
    let stop = t(Action::Stop, &config2);
    assert_eq!(fields(&h.converge(&redis, &stop).await), ["running"]);
    assert!(redis_call(port, "PING", 1).is_err(), "the port still answers");
    assert_eq!(fields(&h.check(&redis, &start2).await.unwrap()), ["running"]);

    // remove: a running instance is stopped and every file is gone.
    h.perform(&redis, &start2).await.unwrap();
    let remove = t(Action::Remove, &config2);
    let changes = h.converge(&redis, &remove).await;
    assert_eq!(fields(&changes), ["running", "files"]);
    assert!(redis_call(port, "PING", 1).is_err());
    for p in [instance.conf(), instance.pidfile(), instance.data_dir(), instance.logfile()] {
        assert!(!p.exists(), "{} left behind", p.display());
    }
    assert!(h.check(&redis, &stop).await.unwrap().is_empty(), "stopped after remove");

    // Bad configuration names the key.
    for (bad, culprit) in [
        (json!({}), "missing field `port`"),
        (json!({ "port": 0 }), "`port`: must be 1 to 65535"),
        (json!({ "port": port, "bind": "everywhere" }), "`bind`"),
        (json!({ "port": port, "maxmemory": "lots" }), "`maxmemory`"),
        (json!({ "port": port, "colour": "red" }), "unknown field `colour`"),
    ] {
        let (kind, message) = failure(h.check(&redis, &t(Action::Configure, &bad)).await);
        assert_eq!(kind, PluginErrorKind::InvalidInput, "{message}");
        assert!(message.contains(culprit), "{message}");
    }
}
