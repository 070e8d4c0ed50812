//! `orc-registry serve`: the registry's HTTP service on its own, over one directory.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use orc_registry::{DEFAULT_MAX_BLOB_SIZE, Store, StoreOptions};
use tower_http::trace::TraceLayer;

#[derive(Parser)]
#[command(
    name = "orc-registry",
    version,
    about = "The orc plugin registry: a content-addressed store served over HTTP"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the registry rooted at a directory until SIGINT or SIGTERM.
    Serve {
        /// The registry directory (created if missing).
        #[arg(long, env = "ORC_REGISTRY_ROOT")]
        root: PathBuf,
        /// Address to listen on; port 0 picks a free port (the bound address is printed).
        #[arg(long, env = "ORC_REGISTRY_LISTEN", default_value = "127.0.0.1:7878")]
        listen: SocketAddr,
        /// The largest plugin or blob accepted, in bytes.
        #[arg(long, env = "ORC_REGISTRY_MAX_BLOB_SIZE", default_value_t = DEFAULT_MAX_BLOB_SIZE)]
        max_blob_size: u64,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("ORC_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Serve {
            root,
            listen,
            max_blob_size,
        } => serve(root, listen, max_blob_size).await,
    }
}

async fn serve(root: PathBuf, listen: SocketAddr, max_blob_size: u64) -> anyhow::Result<()> {
    let store = Store::open(&root, StoreOptions { max_blob_size }).with_context(|| format!("cannot open registry {}", root.display()))?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    // The one line scripts and tests wait for.
    println!("listening on http://{addr}");
    tracing::info!(%addr, root = %root.display(), "registry serving");
    let app = orc_registry::server::router(store).layer(TraceLayer::new_for_http());
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("server failed")?;
    tracing::info!("registry stopped");
    Ok(())
}

async fn shutdown_signal() {
    let interrupt = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => tracing::info!("SIGINT: shutting down"),
        () = terminate => tracing::info!("SIGTERM: shutting down"),
    }
}
