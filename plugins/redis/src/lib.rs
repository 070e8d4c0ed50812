//! The `redis` automator: Debian's `redis-server` as a cluster service, one instance per
//! (cluster, service) on a node, each with its own configuration file, data directory, pid file
//! and log, started as a daemon (no systemd unit: it works where systemd does not run).
//!
//! Configuration (unknown keys are refused):
//! - `port` (required, 1–65535): the port the instance listens on;
//! - `bind` (optional, default `127.0.0.1`): its addresses, separated by spaces, each an IP
//!   address, optionally prefixed by `-` (Redis: skip it when unavailable);
//! - `data_dir` (optional, default `/var/lib/orc/redis/<cluster>-<service>`): its working
//!   directory (RDB/AOF files); an absolute path at least two levels deep. `remove` deletes it;
//! - `maxmemory` (optional): bytes as an integer, or a Redis size such as `"100mb"`;
//! - `protected_mode` (optional, default `true`): Redis' `protected-mode`, which answers only
//!   clients on loopback while no password is set. `false` lets clients on other nodes reach a
//!   server bound to a non-loopback address, with no authentication: only on a trusted network.
//!
//! Files, for instance `<cluster>-<service>`: `/etc/orc/redis/<instance>.conf` (root:redis 0640),
//! `/run/orc/redis/<instance>.pid` and `<instance>.started` (the configuration digest the
//! running server was started with), `/var/log/orc/redis/<instance>.log`. When the node's user is
//! root and the `redis` user exists (Debian's package creates it), the server runs as `redis`
//! and owns its directories.
//!
//! Actions (each checked first, each idempotent):
//! - `install`: holds when `dpkg-query` reports `redis-server` installed; performs `apt-get
//!   install -y redis-server` non-interactively, one apt run per node at a time (`flock` on
//!   `/run/lock/orc-apt.lock`, shared with the `package` adaptor), after one `apt-get update`
//!   when the package is not found;
//! - `configure`: holds when the configuration file has exactly the content this configuration
//!   gives and the data directory exists (changes `content`, `data_dir`); writes them;
//! - `start`: holds when the pid file's process is a live `redis-server`, answers `PING` with
//!   `PONG` on its port, and was started with the configuration file's current content
//!   (changes `running`, `config`); performs by starting it, or restarting it when the
//!   configuration changed since it started;
//! - `stop`: holds when the pid file's process is gone and nothing answers `PING` on the port;
//!   performs `TERM` (Redis saves if it is configured to, then exits), `KILL` after 10 s;
//! - `remove`: holds when nothing runs and none of the instance's files and directories is
//!   left (change `files`); performs a stop, then deletes them all;
//! - `bootstrap`, `initialize`: nothing to do; they always hold.
//!
//! Errors: a bad configuration is `invalid-input` naming the key; a failure on the node
//! (`apt-get`, the server not answering after a start, with its log's tail) is `retryable`.
//! Everything goes through the node's commands (one POSIX shell script, `redis.sh`), never its
//! file functions, so paths mean the same to the server on every backend.

use std::net::IpAddr;
use std::time::Duration;

use orc_sdk::node::apt::{self, NODE_LOCK, NODE_LOCK_WAIT_S};
use orc_sdk::node::{self, Command, Output};
use orc_sdk::{Action, Automator, Change, Changes, Error, Outcome, Result, ResultExt, Task};
use serde::Deserialize;
use serde_json::Value;

pub struct Redis;

orc_sdk::export!(automator: Redis);

/// The script every action runs on the node.
const SCRIPT: &str = include_str!("redis.sh");
const CONF_DIR: &str = "/etc/orc/redis";
const RUN_DIR: &str = "/run/orc/redis";
const LOG_DIR: &str = "/var/log/orc/redis";
const DATA_ROOT: &str = "/var/lib/orc/redis";
const DEFAULT_BIND: &str = "127.0.0.1";
const PACKAGE: &str = "redis-server";
/// Seconds a stopping server has between `TERM` and `KILL`.
const STOP_GRACE_S: u32 = 10;
/// How long one script run may take: the stop grace, a start's 10 s wait, slack.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(40);

/// The service's configuration.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    port: i64,
    #[serde(default)]
    bind: Option<String>,
    #[serde(default)]
    data_dir: Option<String>,
    #[serde(default)]
    maxmemory: Option<Value>,
    #[serde(default)]
    protected_mode: Option<bool>,
}

/// One instance on a node: its checked settings and paths.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Instance {
    /// `<cluster>-<service>`.
    name: String,
    cluster: String,
    service: String,
    node: String,
    port: u16,
    bind: String,
    /// Where `redis-cli` reaches the server: the first bind address (loopback for a wildcard).
    host: String,
    data_dir: String,
    maxmemory: Option<String>,
    protected_mode: bool,
}

/// A name fit for a file name: letters, digits, `.`, `_`, `-`, not starting with `.`.
fn check_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{what} {name:?} cannot name redis files: use letters, digits, `.`, `_`, `-`"
        )))
    }
}

/// `100mb`, `1gb`, `512`: digits and an optional Redis unit.
fn check_size(text: &str) -> bool {
    let digits = text.chars().take_while(char::is_ascii_digit).count();
    let unit = text[digits..].to_ascii_lowercase();
    digits > 0 && ["", "b", "k", "kb", "m", "mb", "g", "gb"].contains(&unit.as_str())
}

impl Instance {
    fn of(task: &Task<Config>) -> Result<Instance> {
        let config = &task.config;
        let invalid =
            |key: &str, m: String| Error::invalid(format!("{}/{}: invalid configuration: `{key}`: {m}", task.cluster, task.service));
        check_name("cluster", &task.cluster)?;
        check_name("service", &task.service)?;
        let port = u16::try_from(config.port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| invalid("port", format!("must be 1 to 65535, got {}", config.port)))?;
        let bind = config.bind.as_deref().unwrap_or(DEFAULT_BIND).trim();
        let mut addresses = Vec::new();
        for token in bind.split_whitespace() {
            let address = token.strip_prefix('-').unwrap_or(token);
            let ip: IpAddr = address
                .parse()
                .map_err(|_| invalid("bind", format!("{token:?} is not an IP address")))?;
            addresses.push(ip);
        }
        let first = addresses
            .first()
            .ok_or_else(|| invalid("bind", "needs at least one address".into()))?;
        let host = match first {
            IpAddr::V4(v4) if v4.is_unspecified() => "127.0.0.1".to_string(),
            IpAddr::V6(v6) if v6.is_unspecified() => "::1".to_string(),
            ip => ip.to_string(),
        };
        let name = format!("{}-{}", task.cluster, task.service);
        let data_dir = match &config.data_dir {
            None => format!("{DATA_ROOT}/{name}"),
            Some(dir) => {
                let dir = dir.trim_end_matches('/');
                let parts: Vec<&str> = dir.split('/').skip(1).collect();
                let ok = dir.starts_with('/')
                    && parts.len() >= 2
                    && parts.iter().all(|p| !p.is_empty() && *p != "." && *p != "..")
                    && !dir.chars().any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '\'');
                if !ok {
                    return Err(invalid(
                        "data_dir",
                        format!("{dir:?} must be an absolute path at least two levels deep, without `.`, `..`, spaces or quotes"),
                    ));
                }
                dir.to_string()
            }
        };
        let maxmemory = match &config.maxmemory {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) if n.as_u64().is_some() => Some(n.to_string()),
            Some(Value::String(s)) if check_size(s) => Some(s.to_ascii_lowercase()),
            Some(other) => {
                return Err(invalid(
                    "maxmemory",
                    format!("{other} is not a size: use bytes as an integer or a string like \"100mb\""),
                ));
            }
        };
        Ok(Instance {
            name,
            cluster: task.cluster.clone(),
            service: task.service.clone(),
            node: task.node.clone(),
            port,
            bind: bind.split_whitespace().collect::<Vec<_>>().join(" "),
            host,
            data_dir,
            maxmemory,
            protected_mode: config.protected_mode.unwrap_or(true),
        })
    }

    fn conf(&self) -> String {
        format!("{CONF_DIR}/{}.conf", self.name)
    }

    fn pidfile(&self) -> String {
        format!("{RUN_DIR}/{}.pid", self.name)
    }

    fn started(&self) -> String {
        format!("{RUN_DIR}/{}.started", self.name)
    }

    fn logfile(&self) -> String {
        format!("{LOG_DIR}/{}.log", self.name)
    }

    /// The configuration file's content.
    fn content(&self) -> String {
        let mut text = format!(
            "# Managed by orc's redis automator for cluster {}, service {}: rewritten by its configure action.\n\
             port {}\nbind {}\nprotected-mode {}\ndir {}\ndaemonize yes\nsupervised no\npidfile {}\nlogfile {}\n",
            self.cluster,
            self.service,
            self.port,
            self.bind,
            if self.protected_mode { "yes" } else { "no" },
            self.data_dir,
            self.pidfile(),
            self.logfile(),
        );
        if let Some(m) = &self.maxmemory {
            text.push_str(&format!("maxmemory {m}\n"));
        }
        text
    }

    fn who(&self) -> String {
        format!("{}/{} on {}", self.cluster, self.service, self.node)
    }

    /// Runs `redis.sh <command> <args>`; a failure is `retryable` with the end of its stderr.
    fn script(&self, command: &str, args: &[String], stdin: Option<&str>) -> Result<Output> {
        let mut cmd = Command::new("/bin/sh")
            .args(["-c", SCRIPT, "redis.sh", command])
            .args(args.iter().cloned())
            .env("LC_ALL", "C")
            .timeout(SCRIPT_TIMEOUT);
        if let Some(input) = stdin {
            cmd = cmd.stdin(input.as_bytes().to_vec());
        }
        let output = node::run(&self.node, &cmd).context(format_args!("{}: redis.sh {command}", self.who()))?;
        if output.success() {
            return Ok(output);
        }
        let e = output.error(&Command::new("redis.sh").arg(command));
        Err(Error::retryable(format!("{}: {}", self.who(), e.message())))
    }

    fn status(&self) -> Result<Status> {
        let out = self.script(
            "status",
            &[
                self.conf(),
                self.pidfile(),
                self.host.clone(),
                self.port.to_string(),
                self.started(),
            ],
            None,
        )?;
        Ok(Status::parse(&out.stdout_text()))
    }

    fn stop_args(&self) -> Vec<String> {
        vec![
            self.pidfile(),
            self.host.clone(),
            self.port.to_string(),
            self.started(),
            STOP_GRACE_S.to_string(),
        ]
    }

    /// Everything `remove` deletes.
    fn paths(&self) -> Vec<String> {
        vec![self.conf(), self.pidfile(), self.started(), self.logfile(), self.data_dir.clone()]
    }
}

/// What `redis.sh status` says.
#[derive(Debug, Default, PartialEq, Eq)]
struct Status {
    /// The pid file's process, when it is a live redis-server.
    pid: Option<u32>,
    /// Whether the port answered `PONG`.
    pong: bool,
    /// sha256 of the configuration file, if there is one.
    conf: Option<String>,
    /// The configuration digest the running server was started with.
    started: Option<String>,
}

impl Status {
    fn parse(text: &str) -> Status {
        let mut s = Status::default();
        for line in text.lines() {
            let Some((key, value)) = line.split_once('=') else { continue };
            let value = value.trim();
            let some = || (!value.is_empty()).then(|| value.to_string());
            match key {
                "pid" => s.pid = value.parse().ok(),
                "ping" => s.pong = value == "PONG",
                "conf" => s.conf = some(),
                "started" => s.started = some(),
                _ => {}
            }
        }
        s
    }

    fn running(&self) -> bool {
        self.pid.is_some() && self.pong
    }
}

/// Messages for the action log: the script's stdout lines.
fn messages(output: &Output) -> Outcome {
    output
        .stdout_text()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .fold(Outcome::new(), |o, l| o.message(l.to_string()))
}

/// `dpkg-query`'s status of the package (`install ok installed` when installed), `None` when
/// dpkg does not know it.
fn package_status(node: &str) -> Result<Option<String>> {
    let command = Command::new("dpkg-query")
        .env("LC_ALL", "C")
        .args(["-W", "-f", "${Status}", PACKAGE]);
    let output = node::run(node, &command).context(format_args!("{command}"))?;
    let status = output.stdout_text().trim().to_string();
    Ok((output.success() && !status.is_empty()).then_some(status))
}

fn run_apt(inst: &Instance, args: &[&str]) -> Result<Output> {
    let command = apt::get(&[], args);
    let output = node::run(&inst.node, &command).context(format_args!("{}: {command}", inst.who()))?;
    if apt::lock_busy(&output) {
        return Err(Error::retryable(format!(
            "{}: another package action held {NODE_LOCK} for {NODE_LOCK_WAIT_S} s; try again",
            inst.who()
        )));
    }
    Ok(output)
}

fn install(inst: &Instance) -> Result<Outcome> {
    let mut output = run_apt(inst, &["install", PACKAGE])?;
    let all = |o: &Output| format!("{}\n{}", o.stdout_text(), o.stderr_text());
    if !output.success() && (all(&output).contains("Unable to locate package") || all(&output).contains("has no installation candidate")) {
        let update = run_apt(inst, &["update"])?;
        if !update.success() {
            return Err(Error::retryable(format!(
                "{}: {}",
                inst.who(),
                update.error(&apt::get(&[], &["update"])).message()
            )));
        }
        output = run_apt(inst, &["install", PACKAGE])?;
    }
    if !output.success() {
        let e = output.error(&apt::get(&[], &["install", PACKAGE]));
        return Err(Error::retryable(format!("{}: {}", inst.who(), e.message())));
    }
    Ok(Outcome::new().message(format!("installed {PACKAGE}")))
}

impl Automator for Redis {
    type Config = Config;
    /// Every check looks at the node: no performed records, no `kv`.
    const PERFORMED_RECORDS: bool = false;

    fn check(task: &Task<Config>) -> Result<Vec<Change>> {
        let inst = Instance::of(task)?;
        match task.action {
            Action::Bootstrap | Action::Initialize => Ok(Vec::new()),
            Action::Install => {
                let status = package_status(&inst.node)?;
                let installed = status.as_deref().is_some_and(|s| s.ends_with(" installed"));
                if installed {
                    Ok(Vec::new())
                } else {
                    Ok(vec![Change::new(
                        "package",
                        status.map(Value::String),
                        Some(Value::String("install ok installed".into())),
                    )])
                }
            }
            Action::Configure => {
                let out = inst.script("configured", &[inst.conf(), inst.data_dir.clone()], None)?;
                let text = out.stdout_text();
                let mut lines = text.splitn(3, '\n');
                let data_dir = lines.next() == Some("datadir=yes");
                let current = match (lines.next(), lines.next()) {
                    (Some("present"), rest) => Some(rest.unwrap_or("").to_string()),
                    _ => None,
                };
                Ok(Changes::new()
                    .compare("content", current.as_ref(), &inst.content())
                    .compare("data_dir", Some(&data_dir), &true)
                    .into_vec())
            }
            Action::Start => {
                let status = inst.status()?;
                let mut changes = Changes::new().compare("running", Some(&status.running()), &true);
                if status.running()
                    && let Some(conf) = &status.conf
                    && status.started.as_ref() != Some(conf)
                {
                    changes = changes.push(Change::new(
                        "config",
                        status.started.clone().map(Value::String),
                        Some(Value::String(conf.clone())),
                    ));
                }
                Ok(changes.into_vec())
            }
            Action::Stop => {
                let status = inst.status()?;
                Ok(Changes::new()
                    .compare("running", Some(&(status.pid.is_some() || status.pong)), &false)
                    .into_vec())
            }
            Action::Remove => {
                let status = inst.status()?;
                let left = inst.script("leftovers", &inst.paths(), None)?.stdout_text();
                let left: Vec<&str> = left.lines().filter(|l| !l.is_empty()).collect();
                let none: Vec<&str> = Vec::new();
                Ok(Changes::new()
                    .compare("running", Some(&(status.pid.is_some() || status.pong)), &false)
                    .compare("files", Some(&left), &none)
                    .into_vec())
            }
        }
    }

    fn perform(task: Task<Config>) -> Result<Outcome> {
        let inst = Instance::of(&task)?;
        let outcome = match task.action {
            Action::Bootstrap | Action::Initialize => Outcome::new().message(format!("nothing to do for {}", task.action)),
            Action::Install => install(&inst)?,
            Action::Configure => {
                let args = [inst.conf(), inst.data_dir.clone(), RUN_DIR.to_string(), LOG_DIR.to_string()];
                messages(&inst.script("configure", &args, Some(&inst.content()))?)
            }
            Action::Start => {
                let args = [
                    inst.conf(),
                    inst.pidfile(),
                    inst.host.clone(),
                    inst.port.to_string(),
                    inst.started(),
                    inst.logfile(),
                    STOP_GRACE_S.to_string(),
                ];
                messages(&inst.script("start", &args, None)?)
            }
            Action::Stop => messages(&inst.script("stop", &inst.stop_args(), None)?),
            Action::Remove => {
                let mut args = inst.stop_args();
                args.extend(inst.paths());
                messages(&inst.script("remove", &args, None)?)
            }
        };
        Ok(outcome.output("port", &inst.port).output("conf", &inst.conf()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orc_sdk::automator::decode_task;

    fn instance(config: &str) -> Result<Instance> {
        let task = decode_task("shop".into(), "cache".into(), "n1".into(), Action::Configure, config, "{}")?;
        Instance::of(&task)
    }

    fn error(config: &str) -> String {
        let e = instance(config).unwrap_err();
        assert_eq!(e.kind(), orc_sdk::ErrorKind::InvalidInput, "{e}");
        e.message().to_string()
    }

    #[test]
    fn defaults_make_a_loopback_instance_with_its_own_files() {
        let i = instance(r#"{"port":6390}"#).unwrap();
        assert_eq!(i.host, "127.0.0.1");
        assert_eq!(i.conf(), "/etc/orc/redis/shop-cache.conf");
        assert_eq!(i.data_dir, "/var/lib/orc/redis/shop-cache");
        assert_eq!(
            i.content(),
            "# Managed by orc's redis automator for cluster shop, service cache: rewritten by its configure action.\n\
             port 6390\nbind 127.0.0.1\nprotected-mode yes\ndir /var/lib/orc/redis/shop-cache\ndaemonize yes\n\
             supervised no\npidfile /run/orc/redis/shop-cache.pid\nlogfile /var/log/orc/redis/shop-cache.log\n"
        );
        let i = instance(r#"{"port":7000,"bind":"0.0.0.0 -::1","data_dir":"/srv/redis/","maxmemory":"100MB"}"#).unwrap();
        assert_eq!(
            (i.host.as_str(), i.bind.as_str(), i.data_dir.as_str()),
            ("127.0.0.1", "0.0.0.0 -::1", "/srv/redis")
        );
        assert!(i.content().ends_with("maxmemory 100mb\n"));
        assert!(i.content().contains("\nprotected-mode yes\n"), "on by default");
        let open = instance(r#"{"port":7000,"bind":"10.0.0.5","protected_mode":false}"#).unwrap();
        assert!(
            open.content().contains("\nbind 10.0.0.5\nprotected-mode no\n"),
            "{}",
            open.content()
        );
        assert!(
            instance(r#"{"port":7000,"maxmemory":1048576}"#)
                .unwrap()
                .content()
                .ends_with("maxmemory 1048576\n")
        );
    }

    #[test]
    fn bad_configurations_name_the_key() {
        assert!(error(r#"{}"#).contains("missing field `port`"));
        assert!(error(r#"{"port":0}"#).contains("`port`: must be 1 to 65535, got 0"));
        assert!(error(r#"{"port":70000}"#).contains("`port`: must be 1 to 65535, got 70000"));
        assert!(error(r#"{"port":"6379"}"#).contains("`port`"));
        assert!(error(r#"{"port":6379,"bind":"localhost"}"#).contains("`bind`: \"localhost\" is not an IP address"));
        assert!(error(r#"{"port":6379,"bind":" "}"#).contains("`bind`: needs at least one address"));
        assert!(error(r#"{"port":6379,"data_dir":"/srv"}"#).contains("`data_dir`"));
        assert!(error(r#"{"port":6379,"data_dir":"srv/redis"}"#).contains("`data_dir`"));
        assert!(error(r#"{"port":6379,"data_dir":"/srv/../etc"}"#).contains("`data_dir`"));
        assert!(error(r#"{"port":6379,"data_dir":"/srv/my redis"}"#).contains("`data_dir`"));
        assert!(error(r#"{"port":6379,"maxmemory":"lots"}"#).contains("`maxmemory`: \"lots\" is not a size"));
        assert!(error(r#"{"port":6379,"maxmemory":-1}"#).contains("`maxmemory`"));
        assert!(error(r#"{"port":6379,"prot":1}"#).contains("unknown field `prot`"));
    }

    #[test]
    fn names_must_fit_file_names() {
        let task = decode_task::<Config>("a/b".into(), "cache".into(), "n1".into(), Action::Start, r#"{"port":1}"#, "{}").unwrap();
        assert!(
            Instance::of(&task)
                .unwrap_err()
                .message()
                .starts_with("cluster \"a/b\" cannot name redis files")
        );
    }

    #[test]
    fn status_lines_parse() {
        let s = Status::parse("pid=42\nping=PONG\nconf=abc\nstarted=\n");
        assert_eq!(
            s,
            Status {
                pid: Some(42),
                pong: true,
                conf: Some("abc".into()),
                started: None
            }
        );
        assert!(s.running());
        assert!(!Status::parse("pid=\nping=\nconf=\nstarted=\n").running());
    }

    #[test]
    fn sizes() {
        for ok in ["1", "100mb", "1GB", "512k", "7b"] {
            assert!(check_size(ok), "{ok}");
        }
        for bad in ["", "mb", "1tb", "1.5gb", "-1", "1 mb"] {
            assert!(!check_size(bad), "{bad}");
        }
    }
}
