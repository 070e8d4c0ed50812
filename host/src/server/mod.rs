//! `orc-host serve`: the host as a long-running service. [`Server`] opens the application
//! ([`crate::app::App`]), makes the user `admin` and its first token on a first start, binds the REST API
//! ([`crate::api`]) and serves it until told to shut down; [`config`] is what it runs with and
//! [`memory`] how its heap is tuned.

pub mod config;
pub mod memory;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::app::{App, StartError};
use config::HostConfig;

/// The bound REST server.
pub struct Server {
    listener: tokio::net::TcpListener,
    app: Arc<App>,
    max_body_bytes: usize,
    shutdown_grace: Duration,
    initial_token: Option<String>,
}

impl Server {
    /// Opens everything and binds `config.listen`; nothing is served until [`Server::run`].
    pub async fn start(config: &HostConfig) -> Result<Server, StartError> {
        // Bound first: the address is what this replica is known by.
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| StartError::Bind {
                addr: config.listen,
                source,
            })?;
        let address = match &config.advertise {
            Some(address) => address.clone(),
            None => listener.local_addr().map_or_else(|_| config.listen.to_string(), |a| a.to_string()),
        };
        let app = App::open(config, &address).await?;
        app.start_ownership().await;
        let initial_token = app.ensure_first_admin().await?;
        Ok(Server {
            listener,
            app,
            max_body_bytes: config.max_body_bytes,
            shutdown_grace: Duration::from_secs(config.shutdown_grace_s),
            initial_token,
        })
    }

    /// The token of the user `admin` created on this first start of the host (no user existed).
    /// It is shown once: only its hash is stored.
    pub fn initial_token(&self) -> Option<&str> {
        self.initial_token.as_deref()
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, lets requests in flight finish, then stops the
    /// schedulers, giving actions in flight the configured grace period.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
        // The API and, beside it on the same port, the console's pages over the same `App`.
        let routes = crate::api::routes(self.app.clone()).merge(crate::console::router());
        let router = crate::api::layered(routes, self.app.clone(), self.max_body_bytes);
        // Requests other replicas relay for the environments held here run through it too.
        self.app.serve_commands(crate::api::commands::runner(router.clone()));
        let served = crate::api::serve(self.listener, router, shutdown).await;
        self.app.shutdown(self.shutdown_grace).await;
        served
    }
}
