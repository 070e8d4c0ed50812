//! The `orc-host` binary: flags, logging and terminal output around the library.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use orc_host::embedded::{self, EmbeddedConfig};
use orc_host::executor::{Mode, Outcome};
use orc_host::policy::outbound::SecretConfig;
use orc_host::policy::settings::{AddressRule, HttpSettings};
use orc_host::server::Server;
use orc_host::server::config::HostConfig;

/// The binary's allocator for everything written in Rust: mimalloc's per-thread heaps take no
/// lock and free without consolidating bins; with glibc's malloc, allocation and freeing were
/// ~15 % of the server's CPU in `service-bench`, and every phase took 8–13 % more CPU (medians
/// of 7–8 interleaved runs). C code (SQLite) still allocates with glibc's malloc, which
/// `server::memory` tunes.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "orc-host",
    version,
    about = "The orc host: intent-based orchestration with sandboxed Wasm plugins"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Embedded mode: load the plugins an intent names, deploy it on the local node, print the
    /// outcome per resource, exit non-zero if anything failed.
    Deploy {
        /// The intent, as JSON.
        intent: PathBuf,
        /// State: registry, compiled plugins, plugin key/value data, the local node's root.
        #[arg(long, env = "ORC_DATA_DIR", default_value = ".orc")]
        data_dir: PathBuf,
        /// Root directory of the `local` node (default: DATA_DIR/nodes/local).
        #[arg(long, env = "ORC_LOCAL_ROOT")]
        root: Option<PathBuf>,
        /// Report what would change, change nothing.
        #[arg(long)]
        dryrun: bool,
        /// Resource actions in flight at once.
        #[arg(long, env = "ORC_CONCURRENCY", default_value_t = 64)]
        concurrency: usize,
        /// Print the full report as JSON.
        #[arg(long)]
        json: bool,
        /// Let plugins send HTTP requests to this origin (`https://api.example.com`,
        /// `http://10.0.0.5:8080`); repeat for more. None: no outgoing HTTP.
        #[arg(long = "allow-http", value_name = "ORIGIN")]
        allow_http: Vec<String>,
        /// Which addresses the allowed origins may resolve to: `public` (default),
        /// `public_and_private`, or networks separated by commas (`127.0.0.1/32,10.0.0.0/8`), the
        /// only way to reach loopback.
        #[arg(long, value_name = "RULE", default_value = "public")]
        http_addresses: String,
        /// A secret plugins may send as the `Authorization` header, its value (e.g. `Bearer …`)
        /// read from the environment variable VAR, so it never shows in the command line; sent
        /// only to the origins listed after `@` (comma-separated; at least one also given to
        /// `--allow-http`), over https only unless `--secrets-over-plain-http`; repeat for more.
        #[arg(long = "secret", value_name = "NAME=VAR@ORIGIN[,ORIGIN]")]
        secrets: Vec<String>,
        /// Let secrets be sent over plain `http://` to the origins they are bound to (the
        /// setting `http.secrets_over_plain_http`); otherwise over https only.
        #[arg(long)]
        secrets_over_plain_http: bool,
        /// Longest one plugin call may run, in seconds.
        #[arg(long, env = "ORC_CALL_TIMEOUT_S", default_value_t = 30)]
        call_timeout_s: u64,
        /// Let commands on the local node reach the host's network (they run confined, without
        /// it by default: with it they reach the host's local services, as the host's user).
        #[arg(long)]
        local_network: bool,
    },
    /// Server mode: the REST API (`/api/v1`) over persistent environments, one scheduler each.
    /// Prints `listening on http://ADDR` first; stops gracefully on SIGINT or SIGTERM.
    Serve(ServeArgs),
}

/// Flags and `ORC_*` variables override the configuration file, which overrides the defaults.
#[derive(clap::Args)]
struct ServeArgs {
    /// A TOML configuration file (see `host/orc-host.example.toml`); unknown keys are an error.
    #[arg(long, env = "ORC_CONFIG")]
    config: Option<PathBuf>,
    /// Listen address, e.g. `127.0.0.1:8420` (port 0 picks a free one).
    #[arg(long, env = "ORC_LISTEN")]
    listen: Option<std::net::SocketAddr>,
    /// Registry, compiled plugins, node roots and the default SQLite database.
    #[arg(long, env = "ORC_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// `sqlite:PATH` or `postgres://…` (default: SQLite file DATA_DIR/orc.db).
    #[arg(long, env = "ORC_DATABASE")]
    database: Option<String>,
    /// Largest request body, in bytes.
    #[arg(long, env = "ORC_MAX_BODY_BYTES")]
    max_body_bytes: Option<usize>,
    /// Seconds actions in flight get to finish at shutdown.
    #[arg(long, env = "ORC_SHUTDOWN_GRACE_S")]
    shutdown_grace_s: Option<u64>,
    /// The key node credentials are encrypted with (default: DATA_DIR/secret.key, created 0600);
    /// replicas on one PostgreSQL database must share it.
    #[arg(long, env = "ORC_SECRET_KEY_FILE")]
    secret_key_file: Option<PathBuf>,
    /// Seconds between attempts to reach nodes not verified yet or unreachable.
    #[arg(long, env = "ORC_NODE_REVERIFY_INTERVAL_S")]
    node_reverify_interval_s: Option<u64>,
}

impl ServeArgs {
    fn config(self) -> anyhow::Result<HostConfig> {
        let mut config = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
                HostConfig::from_toml(&text).with_context(|| format!("in {}", path.display()))?
            }
            None => HostConfig::default(),
        };
        if let Some(listen) = self.listen {
            config.listen = listen;
        }
        if let Some(dir) = self.data_dir {
            config.data_dir = dir;
        }
        if let Some(database) = self.database {
            config.database = Some(database);
        }
        if let Some(max) = self.max_body_bytes {
            config.max_body_bytes = max;
        }
        if let Some(grace) = self.shutdown_grace_s {
            config.shutdown_grace_s = grace;
        }
        if let Some(file) = self.secret_key_file {
            config.secret_key_file = Some(file);
        }
        if let Some(every) = self.node_reverify_interval_s {
            config.node_reverify_interval_s = every;
        }
        Ok(config)
    }
}

/// `mi_option_purge_delay`: its place in mimalloc 3's `mi_option_e` (libmimalloc-sys names no
/// constant for it), and its default there, in milliseconds.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
const MI_DEFAULT_PURGE_DELAY: std::ffi::c_long = 1000;

/// Has mimalloc give a freed page back to the system at once. By default it waits a second, and
/// then only purges when the thread that owns the page allocates again, so the idle threads of a
/// server at rest keep what they freed: after `api-bench 100000` the server held 259 MiB, of
/// which most was freed memory (heaptrack counts 45 MiB live after `api-bench 10000`, where
/// mimalloc's arena held 174 MiB), and 217 MiB with no delay. `MIMALLOC_PURGE_DELAY` still
/// rules when the operator sets it; a delay other than mimalloc 3's default means the option is
/// not where this expects it, and it is left alone.
#[allow(unsafe_code)]
fn purge_freed_pages_at_once() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: reading and setting an allocator option takes no pointers; mimalloc reads it
    // whenever it considers a purge.
    unsafe {
        if libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) == MI_DEFAULT_PURGE_DELAY {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
        }
    }
}

fn main() -> ExitCode {
    purge_freed_pages_at_once();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("ORC_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Deploy {
            intent,
            data_dir,
            root,
            dryrun,
            concurrency,
            json,
            allow_http,
            http_addresses,
            secrets,
            secrets_over_plain_http,
            call_timeout_s,
            local_network,
        } => {
            let bytes = std::fs::read(&intent).with_context(|| format!("reading {}", intent.display()))?;
            let addresses = match http_addresses.as_str() {
                "public" | "public_and_private" => AddressRule::Named(http_addresses),
                networks => AddressRule::Networks(networks.split(',').map(|n| n.trim().to_string()).collect()),
            };
            let secrets = secrets
                .iter()
                .map(|s| SecretConfig::from_flag(s).map_err(anyhow::Error::msg))
                .collect::<anyhow::Result<_>>()?;
            let config = EmbeddedConfig {
                local_root: root,
                http: HttpSettings {
                    allowed_origins: allow_http,
                    addresses,
                    secrets: Vec::new(),
                    secrets_over_plain_http,
                },
                secrets,
                call_timeout_s,
                local_network,
                ..EmbeddedConfig::new(data_dir, if dryrun { Mode::Dryrun } else { Mode::Deploy }, concurrency)
            };
            let bar = if std::io::stderr().is_terminal() && !json {
                ProgressBar::new(0)
            } else {
                ProgressBar::hidden()
            };
            bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("valid template"));
            let runtime = tokio::runtime::Runtime::new()?;
            let report = runtime
                .block_on(embedded::deploy(&config, &bytes, {
                    let bar = bar.clone();
                    move |resource, done, total| {
                        bar.set_length(total as u64);
                        bar.set_position(done as u64);
                        bar.set_message(resource.to_string());
                    }
                }))
                .with_context(|| format!("deploying {}", intent.display()))?;
            bar.finish_and_clear();
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print_summary(&report, config.mode);
            }
            Ok(if report.succeeded() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Serve(args) => {
            let config = args.config()?;
            orc_host::server::memory::tune_for_server(orc_host::server::memory::SERVER_ARENAS, orc_host::server::memory::TRIM_EVERY);
            tokio::runtime::Runtime::new()?.block_on(serve(config))
        }
    }
}

async fn serve(config: HostConfig) -> anyhow::Result<ExitCode> {
    let server = Server::start(&config).await.context("starting the server")?;
    // Before the address is printed: whoever reads it may signal at once.
    let shutdown = shutdown_signal();
    let addr = server.local_addr()?;
    println!("listening on http://{addr}");
    if let Some(token) = server.initial_token() {
        println!("admin token (shown once; only its hash is stored): {token}");
    }
    use std::io::Write as _;
    std::io::stdout().flush()?;
    server.run(shutdown).await.context("serving")?;
    Ok(ExitCode::SUCCESS)
}

/// Completes on SIGINT or SIGTERM. The handlers are installed when this is called, not when the
/// future is first polled: a signal that arrives once the address is printed (and before the
/// server polls this) still stops the server gracefully.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let interrupt = signal(SignalKind::interrupt());
        let term = signal(SignalKind::terminate());
        async move {
            match (interrupt, term) {
                (Ok(mut interrupt), Ok(mut term)) => {
                    tokio::select! {
                        _ = interrupt.recv() => {}
                        _ = term.recv() => {}
                    }
                }
                (interrupt, term) => {
                    if let Err(e) = interrupt.as_ref().and(term.as_ref()) {
                        tracing::error!(error = %e, "cannot listen for SIGINT and SIGTERM");
                    }
                    match (interrupt, term) {
                        (Ok(mut one), _) | (_, Ok(mut one)) => {
                            one.recv().await;
                        }
                        _ => std::future::pending::<()>().await,
                    }
                }
            }
            tracing::info!("shutting down");
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down");
    }
}

fn print_summary(report: &embedded::DeployReport, mode: Mode) {
    for a in &report.actions {
        let label = match a.outcome {
            Outcome::Unchanged => "ok",
            Outcome::Changed => "changed",
            Outcome::WouldChange => "would change",
            Outcome::Failed => "FAILED",
            Outcome::Unavailable => "UNAVAILABLE",
            Outcome::Skipped => "skipped",
        };
        println!("{label:>12}  {}  ({:.1} ms)", a.resource, a.duration.as_secs_f64() * 1e3);
        for c in &a.changes {
            let show = |v: &Option<serde_json::Value>| v.as_ref().map(|v| v.to_string()).unwrap_or_else(|| "-".into());
            println!("              {}: {} -> {}", c.field, show(&c.current), show(&c.desired));
        }
        if let Some(e) = &a.error {
            println!("              {}: {}", e.code, e.message);
        }
    }
    let verb = if mode == Mode::Dryrun { "would change" } else { "changed" };
    println!(
        "{} resources: {} {verb}, {} unchanged, {} failed, {} unavailable, {} skipped (local node root: {})",
        report.actions.len(),
        report.count(Outcome::Changed) + report.count(Outcome::WouldChange),
        report.count(Outcome::Unchanged),
        report.count(Outcome::Failed),
        report.count(Outcome::Unavailable),
        report.count(Outcome::Skipped),
        report.local_root.display()
    );
}
