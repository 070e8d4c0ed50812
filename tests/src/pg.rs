//! A real PostgreSQL for the integration tests, shared by the test crates that need one
//! (`orc_tests::pg`): a cluster this test binary starts itself (`initdb` +
//! `pg_ctl` in a temporary directory, listening on 127.0.0.1 on a free port), one per test run,
//! with a fresh database per [`fresh_database`] call. `ORC_TEST_DATABASE_URL=postgres://…` uses a
//! running server instead; `ORC_TEST_PG_BIN` names the directory of `initdb` and `pg_ctl`.
//!
//! PostgreSQL refuses to run as root: as root, the cluster runs as the `postgres` user (or
//! `nobody`) through `runuser`. The cluster is stopped and its directory removed when the test
//! process ends, whatever way it ends: a watchdog process (its own process group, so a Ctrl-C
//! does not take it down first) waits for this process to disappear. Failures while starting
//! are cleaned up by `Cluster`'s `Drop`.

use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context as _, Result, anyhow, bail};
use sqlx::{Connection as _, Executor as _, PgConnection};

/// Creates a new, empty database and returns its `postgres://…` URL. The first call starts the
/// cluster (blocking the calling thread for a few seconds); concurrent callers wait for it.
pub async fn fresh_database() -> Result<String> {
    let admin_url = match std::env::var("ORC_TEST_DATABASE_URL") {
        Ok(url) => url,
        Err(_) => cluster()?.admin_url(),
    };
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!("orc_test_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    let mut admin = PgConnection::connect(&admin_url)
        .await
        .with_context(|| format!("cannot connect to the test PostgreSQL at {admin_url}"))?;
    admin.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).await?;
    admin.close().await?;
    Ok(with_database(&admin_url, &name))
}

/// `postgres://u@h:p/db?x` → the same with database `name`.
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let authority_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_end..].find('/') {
        Some(slash) => &base[..authority_end + slash],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();

fn cluster() -> Result<&'static Cluster> {
    CLUSTER
        .get_or_init(|| Cluster::start().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("cannot start the test PostgreSQL cluster: {e}"))
}

/// A PostgreSQL cluster in a temporary directory.
struct Cluster {
    base: PathBuf,
    bin: PathBuf,
    run_as: Option<String>,
    port: u16,
    /// Stop and remove on drop (cleared once the watchdog owns that job).
    owned: bool,
}

impl Cluster {
    fn start() -> Result<Cluster> {
        let bin = find_bin_dir()?;
        let run_as = if is_root()? { Some(unprivileged_user()?) } else { None };
        let base = tempfile::Builder::new().prefix("orc-test-pg-").tempdir()?.keep();
        let mut cluster = Cluster {
            base,
            bin,
            run_as,
            port: 0,
            owned: true,
        };
        if let Some(user) = &cluster.run_as {
            let uid = id_of(user, "-u")?;
            let gid = id_of(user, "-g")?;
            std::os::unix::fs::chown(&cluster.base, Some(uid), Some(gid))
                .with_context(|| format!("cannot hand {} to {user}", cluster.base.display()))?;
        }
        let data = cluster.data();
        cluster.run(
            "initdb",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-U".as_ref(),
                "postgres".as_ref(),
                "--auth=trust".as_ref(),
                "-E".as_ref(),
                "UTF8".as_ref(),
                "--locale=C".as_ref(),
                "--no-sync".as_ref(),
            ],
        )?;
        // A port can be taken between choosing and binding it: try a few.
        let mut last = None;
        for _ in 0..3 {
            cluster.port = free_port()?;
            let options = format!(
                "-k {} -p {} -c listen_addresses=127.0.0.1 -c max_connections=300",
                cluster.base.display(),
                cluster.port
            );
            let log = cluster.base.join("server.log");
            match cluster.run(
                "pg_ctl",
                &[
                    "-D".as_ref(),
                    data.as_os_str(),
                    "-l".as_ref(),
                    log.as_os_str(),
                    "-o".as_ref(),
                    options.as_ref(),
                    "-w".as_ref(),
                    "-t".as_ref(),
                    "60".as_ref(),
                    "start".as_ref(),
                ],
            ) {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e) => {
                    let server_log = std::fs::read_to_string(&log).unwrap_or_default();
                    last = Some(e.context(format!("server log:\n{server_log}")));
                }
            }
        }
        if let Some(e) = last {
            return Err(e);
        }
        cluster.spawn_watchdog()?;
        cluster.owned = false;
        Ok(cluster)
    }

    fn data(&self) -> PathBuf {
        self.base.join("data")
    }

    fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn command(&self, program: &str) -> Command {
        let exe = self.bin.join(program);
        match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(exe);
                c
            }
            None => Command::new(exe),
        }
    }

    fn run(&self, program: &str, args: &[&std::ffi::OsStr]) -> Result<()> {
        let out = self
            .command(program)
            .args(args)
            .current_dir(&self.base)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run {}", self.bin.join(program).display()))?;
        if !out.status.success() {
            bail!(
                "{program} failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Stops the cluster and removes its directory once this process has gone.
    fn spawn_watchdog(&self) -> Result<()> {
        let stop = self.stop_command();
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.3; done; {stop} >/dev/null 2>&1; rm -rf '{base}'",
            pid = std::process::id(),
            base = self.base.display(),
        );
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("cannot start the cluster's watchdog")?;
        Ok(())
    }

    fn stop_command(&self) -> String {
        let pg_ctl = format!(
            "'{}' -D '{}' -m immediate stop",
            self.bin.join("pg_ctl").display(),
            self.data().display()
        );
        match &self.run_as {
            Some(user) => format!("runuser -u {user} -- {pg_ctl}"),
            None => pg_ctl,
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.owned {
            let _ = Command::new("sh")
                .args(["-c", &format!("{} >/dev/null 2>&1", self.stop_command())])
                .status();
            let _ = std::fs::remove_dir_all(&self.base);
        }
    }
}

/// `initdb`/`pg_ctl`: `$ORC_TEST_PG_BIN`, else `initdb` on `PATH` (symlinks resolved), else the
/// newest `/usr/lib/postgresql/<version>/bin`.
fn find_bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("ORC_TEST_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("initdb")).find(|f| f.is_file()))
        .unwrap_or_default();
    if let Some(initdb) = on_path {
        let real = std::fs::canonicalize(&initdb)?;
        if let Some(dir) = real.parent().filter(|d| d.join("pg_ctl").is_file()) {
            return Ok(dir.to_path_buf());
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin): &(u32, PathBuf)| bin.join("initdb").is_file() && bin.join("pg_ctl").is_file())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        anyhow!(
            "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in /usr/lib/postgresql/*/bin. \
             Install them (Debian: `apt-get install -y postgresql`), point ORC_TEST_PG_BIN at their directory, \
             or set ORC_TEST_DATABASE_URL=postgres://… to use a running server"
        )
    })
}

fn is_root() -> Result<bool> {
    Ok(command_output(Command::new("id").arg("-u"))? == "0")
}

fn unprivileged_user() -> Result<String> {
    for user in ["postgres", "nobody"] {
        if Command::new("id")
            .arg(user)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?
            .success()
        {
            return Ok(user.to_string());
        }
    }
    bail!("running as root, and neither a `postgres` nor a `nobody` user exists to run PostgreSQL as")
}

fn id_of(user: &str, flag: &str) -> Result<u32> {
    Ok(command_output(Command::new("id").args([flag, user]))?.parse()?)
}

fn command_output(command: &mut Command) -> Result<String> {
    let out = command.output()?;
    if !out.status.success() {
        bail!("{command:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
