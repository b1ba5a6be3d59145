//! The admin HTTP API of a running host, and the client `sluice` uses to call it.
//!
//! ```text
//! GET  /                            the status page (HTML; it reads /partitions and /timeline)
//! GET  /metrics                     the host's metrics, Prometheus text (see [metrics](crate::metrics))
//! GET  /partitions                  each running partition's status and the host's (JSON, see
//!                                   [partitions](crate::metrics::partitions))
//! GET  /timeline                    the host's latest rebalances, restores, switches, warnings (JSON)
//! GET  /operators/<name>/versions   the history of deployed versions (JSON)
//! POST /operators/<name>/versions   deploy the component in the body (application/wasm)
//! POST /operators/<name>/rollback   roll back to the version before the newest deploy
//! GET  /operators/<name>/shadow     what the shadow found on this host (JSON)
//! POST /operators/<name>/shadow     run the component in the body as the shadow (application/wasm)
//! DELETE /operators/<name>/shadow   stop the shadow
//! POST /operators/<name>/promote    deploy the shadow as the version in force, and stop it
//! POST /operators/<name>/canary:5   run the component in the body as a canary for 5% of the
//!                                   keys (a deploy or a rollback ends it)
//! ```
//!
//! A deploy or rollback answers once every partition of this host has switched or
//! refused the version (or after the deployer's timeout), with what the switch took
//! (JSON); other hosts of the job follow through the registry. A failed request
//! answers with the reason as text, and the running version keeps running; the status
//! says what kind of failure it was: 400 a component that cannot run, 404 another
//! operator's name, 409 a request the history does not allow (already in force,
//! nothing to roll back to, changed meanwhile), 503 the store holding the registry
//! unavailable, 500 this host's own failure. This module owns the HTTP surface only;
//! what a deploy does is the [deployer](crate::operator::deploy)'s.
//!
//! The API runs whatever a caller uploads on every host of the job, so it lets in
//! only who it must, and a stranger spends little of the host:
//! - a deploy or rollback presents the bearer token (`[admin] token_file` or
//!   `SLUICE_ADMIN_TOKEN`; never in argv): 401 without it, 403 when the host has none;
//! - beyond loopback a host refuses to start without a token, and every request needs it
//!   but the status page's own HTML, which holds no data (the page asks for the token);
//! - on loopback, a question without the token is answered only if its `Host` is an IP
//!   address, `localhost` or one of `[admin] host_names` (403 otherwise): a site that
//!   points its own name at 127.0.0.1 after its page loaded (DNS rebinding) cannot read
//!   the host through that page;
//! - a request a browser makes for another site's page (an `Origin` that is not this
//!   host) is refused, 403;
//! - only a deploy's (or a shadow's or canary's) body is read, after its token is checked, up to
//!   [`MAX_COMPONENT_BYTES`] (413) and within [`BODY_TIMEOUT`]; headers must arrive
//!   within [`HEADER_TIMEOUT`];
//! - a connection stays open for another request only once it presented the token, and
//!   for at most [`MAX_TRUSTED_CONNECTIONS`] such; every other one closes after its first
//!   answer. At most [`MAX_CONNECTIONS`] of those are open at once, and a new one closes
//!   the oldest, so strangers cannot hold the API against its owner, whose request
//!   follows the moment its connection opens;
//! - refusals are logged at most [`REFUSALS_LOGGED`] per [`REFUSAL_LOG_WINDOW`], each line
//!   cut at [`REFUSAL_LINE_BYTES`], and the rest counted in one line.

//!
//! One room per concern: `access` (who may ask), `connections` (how many stay open),
//! `refusals` (their log, bounded), `routes` (what is answered, and the answers'
//! shapes), `client` (how `sluice` calls the API); this file reads a request and
//! writes its response.

mod access;
mod client;
mod connections;
pub(crate) mod events;
mod refusals;
mod routes;

pub use client::call;
pub use routes::{
    DeployAnswer, METRICS_PATH, PARTITIONS_PATH, STATUS_PAGE_PATH, TIMELINE_PATH, TimelineAnswer, VersionsAnswer,
};

use crate::config::AdminConfig;
use crate::metrics::{CONTENT_TYPE, Metrics};
use crate::operator::deploy::Deployer;
use crate::operator::registry::MAX_COMPONENT_BYTES;
use crate::stats::HostStats;
use access::Access;
use anyhow::{Context, Result, bail};
use bytes::Bytes;
use connections::{Connections, Slot};
use events::LISTENING;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use refusals::Refusals;
use routes::route;
use std::convert::Infallible;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::runtime::Runtime;

/// The longest a connection may take to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest a deploy may take to upload its component.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(120);

/// The most connections open at once that have not presented the token; a new one past
/// these closes the oldest of them.
pub const MAX_CONNECTIONS: usize = 16;

/// The most connections kept open for more requests after presenting the token; past
/// these, a connection closes after its answer.
pub const MAX_TRUSTED_CONNECTIONS: usize = 16;

/// The most refusals logged one by one per [`REFUSAL_LOG_WINDOW`]; the rest are counted,
/// in one line once the window is over.
pub const REFUSALS_LOGGED: u64 = 5;

/// The window [`REFUSALS_LOGGED`] counts in.
pub const REFUSAL_LOG_WINDOW: Duration = Duration::from_secs(10);

/// The most bytes of one logged refusal: its path and headers are the caller's.
pub const REFUSAL_LINE_BYTES: usize = 512;

/// How long the API waits after failing to accept a connection (out of file
/// descriptors, say) before it accepts again, rather than spinning.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// The environment variable holding the admin token, for the host (without `[admin]
/// token_file`) and for `sluice deploy`, `rollback` and `versions --admin`.
pub const TOKEN_VARIABLE: &str = "SLUICE_ADMIN_TOKEN";

/// Starts serving the API for `deployer`, `metrics` and the events of `host` on `listen`
/// (`host:port`; port 0 picks one) on `runtime`, letting in callers with the token and
/// host names of `config` as the module says; returns the address it listens on, which
/// is also logged. Beyond loopback without a token it refuses to start.
pub fn serve(
    listen: &str,
    config: &AdminConfig,
    deployer: Arc<Deployer>,
    metrics: Metrics,
    host: Arc<HostStats>,
    runtime: &Runtime,
) -> Result<SocketAddr> {
    let token = access::token(config)?;
    let addresses: Vec<SocketAddr> =
        listen.to_socket_addrs().with_context(|| format!("[admin] listen = {listen:?}: not a host:port"))?.collect();
    let loopback = addresses.iter().all(|a| a.ip().is_loopback());
    if !loopback && token.is_none() {
        bail!(
            "[admin] listen = {listen:?} is beyond loopback: anyone who reaches it could deploy code, so it needs a \
             token ([admin] token_file or {TOKEN_VARIABLE})"
        );
    }
    let listener = runtime
        .block_on(TcpListener::bind(&addresses[..]))
        .with_context(|| format!("[admin] listen = {listen:?}: cannot listen there"))?;
    let address = listener.local_addr()?;
    tracing::info!("{LISTENING}http://{address}");
    let access = Access { token, loopback, host_names: config.host_names.clone() };
    let registry = metrics.clone().registry();
    let served = Arc::new(Served { deployer, registry, metrics, host, access, refusals: Refusals::new() });
    let rolled = served.clone();
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(REFUSAL_LOG_WINDOW / 2);
        loop {
            tick.tick().await;
            rolled.refusals.roll();
        }
    });
    let connections = Arc::new(Mutex::new(Connections::default()));
    runtime.spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    served.refusals.note(&format!("accepting a connection failed: {e}"));
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            };
            let closed_oldest = Connections::admit(&connections, |slot| {
                let served = served.clone();
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |request| answer(served.clone(), slot.clone(), request));
                    let connection = hyper::server::conn::http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .serve_connection(TokioIo::new(stream), service);
                    if let Err(e) = connection.await {
                        tracing::debug!("admin API connection: {e}");
                    }
                })
            });
            if closed_oldest {
                served.refusals.note(&format!(
                    "{MAX_CONNECTIONS} connections without the token were open: closed the oldest for a new one"
                ));
            }
        }
    });
    Ok(address)
}

/// What the API serves, and to whom.
struct Served {
    deployer: Arc<Deployer>,
    /// What `/metrics` encodes.
    registry: Registry,
    /// What `/partitions` reads.
    metrics: Metrics,
    host: Arc<HostStats>,
    access: Access,
    refusals: Refusals,
}

async fn answer(
    served: Arc<Served>,
    slot: Arc<Slot>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    // A shadow's samples are records' keys and values: like a change, they are the
    // token's to see.
    let needs_token = method != Method::GET || path.ends_with("/shadow");
    // The page's HTML holds no data: it is served to anyone, and asks for the token itself.
    let page = method == Method::GET && path == STATUS_PAGE_PATH;
    let answer_type = match path.as_str() {
        STATUS_PAGE_PATH => "text/html; charset=utf-8",
        METRICS_PATH => CONTENT_TYPE,
        _ => "application/json",
    };
    let vouched = served.access.vouches(&request);
    let refusal = if page { None } else { served.access.refusal(&request, needs_token, vouched) };
    let (status, body) = match refusal {
        Some(refusal) => refusal,
        None => {
            // Only a deploy (or a shadow's) has a body worth reading.
            let trial =
                path.ends_with("/shadow") || path.rsplit('/').next().is_some_and(|last| last.starts_with("canary:"));
            let takes_body = method == Method::POST && (path.ends_with("/versions") || trial);
            let body = match takes_body {
                true => read_body(request.into_body()).await,
                false => Ok(Bytes::new()),
            };
            match body {
                // Deploys compile and wait for partitions: off the runtime's threads.
                Ok(body) => {
                    let (routed, method, path) = (served.clone(), method.clone(), path.clone());
                    tokio::task::spawn_blocking(move || route(&routed, &method, &path, &body, vouched))
                        .await
                        .unwrap_or_else(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("the request panicked: {e}")))
                }
                Err(refusal) => refusal,
            }
        }
    };
    if status != StatusCode::OK {
        let line = format!("{method} {path}: {status}: {body}");
        // A stranger's requests are the ones that could flood the log.
        match vouched {
            true => tracing::warn!("admin API: {line}"),
            false => served.refusals.note(&line),
        }
    }
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    // A connection holds a slot beyond its first answer only for who presented the token.
    if !(vouched && slot.trust()) {
        headers.insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
    }
    // A refusal or failure answers with its reason as text.
    let content_type = if status == StatusCode::OK { answer_type } else { "text/plain; charset=utf-8" };
    headers.insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    if page {
        headers.insert(hyper::header::CONTENT_SECURITY_POLICY, hyper::header::HeaderValue::from_static(PAGE_POLICY));
    }
    Ok(response)
}

/// The status page may run its own inline script and style and reach its own host,
/// nothing else: no CDN, no other site, no frame around it.
const PAGE_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                           connect-src 'self'; img-src 'self'; frame-ancestors 'none'";

/// A deploy's body: at most [`MAX_COMPONENT_BYTES`], within [`BODY_TIMEOUT`].
async fn read_body(body: Incoming) -> std::result::Result<Bytes, (StatusCode, String)> {
    match tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, MAX_COMPONENT_BYTES as usize).collect()).await {
        Ok(Ok(body)) => Ok(body.to_bytes()),
        Ok(Err(e)) => Err((StatusCode::PAYLOAD_TOO_LARGE, format!("reading the request body: {e}"))),
        Err(_) => Err((StatusCode::REQUEST_TIMEOUT, format!("the body took more than {BODY_TIMEOUT:?}"))),
    }
}
