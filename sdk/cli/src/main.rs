//! `orc-plugin`: the plugin author's command line — scaffold a plugin crate, build it into a
//! verified component with its manifest, inspect a component, publish it to a registry; publish a
//! service version to a registry's catalog.

mod build;
mod inspect;
mod publish;
mod scaffold;
mod service;
mod vendor;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use orc_manifest::PluginKind;

#[derive(Parser)]
#[command(name = "orc-plugin", version, about = "Build, inspect and publish orc plugins (Wasm components)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Scaffold a plugin crate that builds as is.
    New {
        /// adaptor, solver or automator
        kind: PluginKind,
        /// The plugin's name (a-z, 0-9, `-`); also the directory created.
        name: String,
        /// Where to create the crate (default: ./NAME).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Compile a plugin crate for wasm32-wasip2, check it implements its world, embed its manifest.
    Build {
        /// The plugin crate (default: the current directory).
        dir: Option<PathBuf>,
        /// Where to write the component and its manifest (default: DIR/target/orc).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Cargo profile to build with.
        #[arg(long, default_value = "release")]
        profile: String,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a component's digest, manifest, world, imports and exports.
    Inspect {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Publish a component (or build a crate and publish it) to a registry.
    Publish {
        /// A `.wasm` file, or a plugin crate to build first (default: the current directory).
        path: Option<PathBuf>,
        /// A registry URL (`http://…`) or a registry directory.
        #[arg(long, env = "ORC_REGISTRY")]
        registry: String,
        /// Bearer token for a registry that wants one to publish (the one `orc-host serve`
        /// serves at `/registry`: an admin token).
        #[arg(long, env = "ORC_TOKEN", hide_env_values = true)]
        token: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Publish a service version (a TOML or `.json` document) to a registry's service catalog.
    PublishService {
        /// The service document.
        file: PathBuf,
        /// A registry URL (`http://…`) or a registry directory.
        #[arg(long, env = "ORC_REGISTRY")]
        registry: String,
        /// Bearer token for a registry that wants one to publish.
        #[arg(long, env = "ORC_TOKEN", hide_env_values = true)]
        token: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("ORC_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::New { kind, name, dir } => scaffold::new(kind, &name, dir),
        Command::Build { dir, out, profile, json } => build::run(dir, out, &profile, json).map(|_| ()),
        Command::Inspect { file, json } => inspect::run(&file, json),
        Command::Publish {
            path,
            registry,
            token,
            json,
        } => publish::run(path, &registry, token.as_deref(), json),
        Command::PublishService {
            file,
            registry,
            token,
            json,
        } => service::publish(&file, &registry, token.as_deref(), json),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
