//! The `orc-host` binary: flags, logging and terminal output around the library.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use orc_host::embedded::{self, EmbeddedConfig};
use orc_host::executor::{Mode, Outcome};

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
    },
}

fn main() -> ExitCode {
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
        } => {
            let bytes = std::fs::read(&intent).with_context(|| format!("reading {}", intent.display()))?;
            let config = EmbeddedConfig {
                data_dir,
                local_root: root,
                mode: if dryrun { Mode::Dryrun } else { Mode::Deploy },
                concurrency,
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
