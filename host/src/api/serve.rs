//! The HTTP transport of the API: the accept loop over hyper-util's connection builder, and the
//! limits on a request's head, answered in JSON like every other refusal.
//!
//! hyper refuses a head it cannot hold on its own, with a bare status and no body (414 past its
//! fixed URI limit, 431 past its buffer or header count). So hyper is given limits well above
//! ours ([`HYPER_MAX_BUF_BYTES`], [`HYPER_MAX_HEADERS`]), and [`refuse_oversized_heads`] answers
//! what lies between with `{code, message}`: 414 `uri_too_long` past [`MAX_URI_BYTES`], 431
//! `headers_too_large` past [`MAX_HEADER_BYTES`] or [`MAX_HEADERS`]. What hyper still answers
//! itself is only what lies past its own limits (documented in `docs/api.md`).

use std::future::Future;
use std::io;
use std::pin::pin;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceExt as _;

use super::ApiError;

/// The longest request target (path and query) the API takes, in bytes. A resource id in a path
/// or an `after` cursor is percent-encoded: a 4,096-byte file path can triple.
pub const MAX_URI_BYTES: usize = 32 * 1024;
/// The largest header block the API takes: the header fields as sent (name, value and 4 bytes of
/// separators each).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// The most header fields the API takes.
pub const MAX_HEADERS: usize = 100;

/// hyper's read buffer, which must hold a whole request head: well above a head of the largest
/// URI and header block we answer ourselves. Past it hyper answers a bare 431. Also HTTP/2's
/// limit on a head's decoded fields.
pub const HYPER_MAX_BUF_BYTES: usize = 1024 * 1024;
/// hyper's count of header fields it parses (HTTP/1). Past it hyper answers a bare 431.
pub const HYPER_MAX_HEADERS: usize = 256;
// hyper's own URI limit, not configurable: 65,534 bytes (past it, a bare 414).
const _: () = assert!(MAX_URI_BYTES < 65_534 && MAX_URI_BYTES + MAX_HEADER_BYTES < HYPER_MAX_BUF_BYTES);
const _: () = assert!(MAX_HEADERS < HYPER_MAX_HEADERS);

/// Middleware: a request whose URI or header block is over our limits is answered 414
/// `uri_too_long` or 431 `headers_too_large`, and the connection closes (its body is not read).
pub async fn refuse_oversized_heads(request: Request, next: Next) -> Response {
    let Some(refusal) = head_refusal(&request) else {
        return next.run(request).await;
    };
    let mut response = refusal.into_response();
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

fn head_refusal(request: &Request) -> Option<ApiError> {
    let uri = request.uri();
    let uri_bytes = uri.scheme_str().map_or(0, |s| s.len() + 3)
        + uri.authority().map_or(0, |a| a.as_str().len())
        + uri.path_and_query().map_or(0, |p| p.as_str().len());
    if uri_bytes > MAX_URI_BYTES {
        return Some(ApiError::new(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            format!("the request's URI is {uri_bytes} bytes; this host takes at most {MAX_URI_BYTES}"),
        ));
    }
    let headers = request.headers();
    let header_bytes: usize = headers.iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum();
    if header_bytes > MAX_HEADER_BYTES || headers.len() > MAX_HEADERS {
        return Some(ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!(
                "the request has {} header fields of {header_bytes} bytes; this host takes at most {MAX_HEADERS} fields of \
                 {MAX_HEADER_BYTES} bytes",
                headers.len()
            ),
        ));
    }
    None
}

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting, lets each
/// connection finish the request it is serving and waits for them all to close (as
/// `axum::serve(…).with_graceful_shutdown` does, with hyper's limits set).
pub async fn serve(listener: TcpListener, app: Router, shutdown: impl Future<Output = ()> + Send + 'static) -> io::Result<()> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().max_buf_size(HYPER_MAX_BUF_BYTES).max_headers(HYPER_MAX_HEADERS);
    // HTTP/2 (cleartext, with prior knowledge) counts a head by its decoded fields (name, value
    // and 32 bytes each); its default, 16 KiB, is below ours.
    builder.http2().max_header_list_size(HYPER_MAX_BUF_BYTES as u32);
    // Every connection holds a receiver of each: dropping `stop` tells them to finish, and the
    // last one to close lets `open.closed()` resolve.
    let (stop, stopping) = watch::channel(());
    let (open, open_rx) = watch::channel(());
    let mut shutdown = pin!(shutdown);
    loop {
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let builder = builder.clone();
        // Each request knows its peer's address (`ConnectInfo`): the sign-in throttle and the
        // audit trail read it.
        let service = TowerToHyperService::new(app.clone().map_request(move |mut request: Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(remote));
            request
        }));
        let mut stopping = stopping.clone();
        let open_rx = open_rx.clone();
        tokio::spawn(async move {
            let mut connection = pin!(builder.serve_connection_with_upgrades(TokioIo::new(stream), service));
            let mut told = false;
            loop {
                tokio::select! {
                    served = connection.as_mut() => {
                        if let Err(e) = served {
                            tracing::trace!(error = %e, "connection ended with an error");
                        }
                        break;
                    }
                    // Once: the connection finishes what it serves, then closes.
                    _ = stopping.changed(), if !told => {
                        told = true;
                        connection.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(open_rx);
        });
    }
    drop(listener);
    drop(stop);
    drop(open_rx);
    open.closed().await;
    Ok(())
}

/// A failed accept: a connection reset before it was accepted is nothing; anything else (out
/// of descriptors) is logged and waited out for a second, as hyper's and axum's servers do.
async fn accept_failed(e: io::Error) {
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accept failed");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
