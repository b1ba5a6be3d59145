//! The admin HTTP API of a running host, and the client `sluice` uses to call it.
//!
//! ```text
//! GET  /                            the status page (HTML; it reads /partitions and /events)
//! GET  /metrics                     the host's metrics, Prometheus text (see [metrics](crate::metrics))
//! GET  /partitions                  each running partition's status and the host's (JSON, see
//!                                   [partitions](crate::metrics::partitions))
//! GET  /events                      the host's latest rebalances, restores, switches, warnings (JSON)
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

pub(crate) mod events;

use crate::config::AdminConfig;
use crate::lock;
use crate::metrics::{self, CONTENT_TYPE, Metrics};
use crate::operator::deploy::{self, DeployReport, Deployer};
use crate::operator::parse_share;
use crate::operator::registry::{DeployError, Deployment, MAX_COMPONENT_BYTES, Trial};
use crate::stats::{HostEvent, HostStats, now_ms};
use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use events::{CROSS_ORIGIN, FOREIGN_HOST, LISTENING, NO_TOKEN, REFUSALS_COUNTED, UNAUTHORIZED};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::task::{AbortHandle, JoinHandle};

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

/// The token a host requires, from `[admin] token_file`, else [`TOKEN_VARIABLE`];
/// `None`: no token, and the API changes nothing.
fn token(config: &AdminConfig) -> Result<Option<String>> {
    let token = match &config.token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("[admin] token_file: reading {}", path.display()))?
                .trim()
                .to_string(),
        ),
        None => std::env::var(TOKEN_VARIABLE).ok().map(|token| token.trim().to_string()),
    };
    match token {
        Some(token) if token.is_empty() => bail!("the admin token is empty ([admin] token_file or {TOKEN_VARIABLE})"),
        token => Ok(token),
    }
}

/// Who may call the API.
struct Access {
    token: Option<String>,
    /// Whether the API listens on loopback only: then questions need no token.
    loopback: bool,
    /// `[admin] host_names`: the names besides IP addresses and `localhost` a question
    /// without the token may give as its `Host`.
    host_names: Vec<String>,
}

impl Access {
    /// Whether `request` presents this host's token.
    fn vouches(&self, request: &Request<Incoming>) -> bool {
        let presented = header(request, hyper::header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer "));
        matches!((presented, &self.token), (Some(presented), Some(token)) if same(presented.as_bytes(), token.as_bytes()))
    }

    /// Why `request` (changing state or not; presenting the token if `vouched`) may not
    /// go on, as the answer's status and body; `None`: it may.
    fn refusal(&self, request: &Request<Incoming>, changes_state: bool, vouched: bool) -> Option<(StatusCode, String)> {
        if let Some(origin) = header(request, hyper::header::ORIGIN) {
            let own = header(request, hyper::header::HOST).map(|host| format!("http://{host}"));
            if own.as_deref() != Some(origin) {
                return Some((StatusCode::FORBIDDEN, format!("requests from {origin} are refused: {CROSS_ORIGIN}")));
            }
        }
        if vouched {
            return None;
        }
        if !changes_state && self.loopback {
            let host = header(request, hyper::header::HOST).unwrap_or_default();
            let reason = || {
                format!(
                    "Host {host:?} {FOREIGN_HOST}: a question without the token must name an IP address, localhost or \
                     one of [admin] host_names"
                )
            };
            return (!self.names_this_host(host)).then(|| (StatusCode::FORBIDDEN, reason()));
        }
        if self.token.is_none() {
            let reason = format!("{NO_TOKEN}: set [admin] token_file or {TOKEN_VARIABLE} on the host");
            return Some((StatusCode::FORBIDDEN, reason));
        }
        Some((StatusCode::UNAUTHORIZED, format!("{UNAUTHORIZED} (Authorization: Bearer <token>)")))
    }

    /// Whether `host`, a request's `Host`, is a name of this host no other site can give
    /// its pages: an IP address, `localhost` or one of `[admin] host_names`, with any port.
    /// Any other name may be a DNS rebinding's: a site pointing its own name at
    /// 127.0.0.1 once its page loaded, to read what that page fetches from there.
    fn names_this_host(&self, host: &str) -> bool {
        let Ok(authority) = host.parse::<hyper::http::uri::Authority>() else { return false };
        let name = authority.host();
        name.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok()
            || name.eq_ignore_ascii_case("localhost")
            || self.host_names.iter().any(|own| own.eq_ignore_ascii_case(name))
    }
}

/// Header `name` of `request`, if it is there and text.
fn header(request: &Request<Incoming>, name: hyper::header::HeaderName) -> Option<&str> {
    request.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Whether `a` and `b` are equal, in a time that does not say where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// The API's open connections: how many presented the token, and the others, oldest
/// first, each with the handle that closes it.
#[derive(Default)]
struct Connections {
    strangers: VecDeque<(u64, AbortHandle)>,
    trusted: usize,
    opened: u64,
}

impl Connections {
    /// Gives a new connection its [`Slot`] and has `serve` start serving it, closing the
    /// oldest connection without the token first if [`MAX_CONNECTIONS`] are open; whether
    /// it closed one.
    fn admit(this: &Arc<Mutex<Self>>, serve: impl FnOnce(Arc<Slot>) -> JoinHandle<()>) -> bool {
        let mut open = lock(this);
        let oldest = if open.strangers.len() >= MAX_CONNECTIONS { open.strangers.pop_front() } else { None };
        open.opened += 1;
        let id = open.opened;
        // Started under the lock, so its slot is listed before the task can give it up.
        let task = serve(Arc::new(Slot { id, trusted: AtomicBool::new(false), connections: this.clone() }));
        open.strangers.push_back((id, task.abort_handle()));
        drop(open);
        // Outside the lock, which the closed connection's slot takes as it is given up.
        oldest.map(|(_, task)| task.abort()).is_some()
    }
}

/// One connection's place among the [`Connections`], given up when its task ends or is
/// aborted (the task owns it).
struct Slot {
    id: u64,
    trusted: AtomicBool,
    connections: Arc<Mutex<Connections>>,
}

impl Slot {
    /// Moves the connection, which presented the token, among the trusted ones, if fewer
    /// than [`MAX_TRUSTED_CONNECTIONS`] are; whether it is one now (it may stay open).
    fn trust(&self) -> bool {
        if self.trusted.load(Ordering::Acquire) {
            return true;
        }
        let mut open = lock(&self.connections);
        // Not listed any more: closed for a newer connection, on its way out.
        let Some(at) = open.strangers.iter().position(|(id, _)| *id == self.id) else { return false };
        if open.trusted >= MAX_TRUSTED_CONNECTIONS {
            return false;
        }
        open.strangers.remove(at);
        open.trusted += 1;
        self.trusted.store(true, Ordering::Release);
        true
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = lock(&self.connections);
        if *self.trusted.get_mut() {
            open.trusted -= 1;
        } else {
            open.strangers.retain(|(id, _)| *id != self.id);
        }
    }
}

/// The API's log of refusals, bounded: at most [`REFUSALS_LOGGED`] lines one by one per
/// [`REFUSAL_LOG_WINDOW`], and one counting the rest.
struct Refusals(Mutex<RefusalWindow>);

struct RefusalWindow {
    began: Instant,
    logged: u64,
    counted: u64,
}

impl Refusals {
    fn new() -> Self {
        Refusals(Mutex::new(RefusalWindow { began: Instant::now(), logged: 0, counted: 0 }))
    }

    /// Logs `line`, cut at [`REFUSAL_LINE_BYTES`], as a warning, unless the window's
    /// lines are spent: then counts it.
    fn note(&self, line: &str) {
        let mut window = lock(&self.0);
        window.roll();
        if window.logged < REFUSALS_LOGGED {
            window.logged += 1;
            tracing::warn!("admin API: {}", &line[..line.floor_char_boundary(REFUSAL_LINE_BYTES)]);
        } else {
            window.counted += 1;
        }
    }

    /// Ends the window if it is over, logging how many it counted.
    fn roll(&self) {
        lock(&self.0).roll();
    }
}

impl RefusalWindow {
    fn roll(&mut self) {
        if self.began.elapsed() < REFUSAL_LOG_WINDOW {
            return;
        }
        if self.counted > 0 {
            tracing::warn!(
                "admin API: {} {REFUSALS_COUNTED} (at most {REFUSALS_LOGGED} per {REFUSAL_LOG_WINDOW:?} are)",
                self.counted
            );
        }
        *self = RefusalWindow { began: Instant::now(), logged: 0, counted: 0 };
    }
}

/// The answer to a deploy or rollback.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeployAnswer {
    /// The registry entry now in force.
    pub deployment: Deployment,
    /// Fetching, compiling and trying out the version, ms.
    pub prepared_ms: f64,
    /// From activation until every partition of this host switched, ms.
    pub switched_ms: f64,
    /// Partitions that run the version now.
    pub partitions: usize,
    /// The longest a partition stood still for the switch, µs.
    pub worst_stall_us: u64,
    /// Partitions that had not switched when the host stopped waiting.
    pub not_switched: Vec<u32>,
    /// All of the above in one line.
    pub summary: String,
}

impl From<DeployReport> for DeployAnswer {
    fn from(report: DeployReport) -> Self {
        DeployAnswer {
            summary: report.to_string(),
            prepared_ms: report.prepared.as_secs_f64() * 1e3,
            switched_ms: report.switched.as_secs_f64() * 1e3,
            partitions: report.partitions,
            worst_stall_us: crate::micros(report.worst_stall),
            not_switched: report.not_switched,
            deployment: report.deployment,
        }
    }
}

/// The answer to `GET /events`.
#[derive(Debug, Clone, Serialize)]
pub struct EventsAnswer {
    /// The host's clock, ms since the epoch, for placing the events.
    pub now_ms: u64,
    /// The latest events, oldest first.
    pub events: Vec<HostEvent>,
}

/// The answer to a versions request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VersionsAnswer {
    /// Every entry, oldest first.
    pub history: Vec<Deployment>,
    /// The version this host runs.
    pub running: String,
}

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
    let token = token(config)?;
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

/// Where the metrics are served.
pub const METRICS_PATH: &str = "/metrics";
/// Where the partitions' status is served.
pub const PARTITIONS_PATH: &str = "/partitions";
/// Where the status page is served.
pub const STATUS_PAGE_PATH: &str = "/";
/// Where the host's events are served.
pub const EVENTS_PATH: &str = "/events";

/// The status page (`admin/status.html`, in the binary).
const STATUS_PAGE: &str = include_str!("admin/status.html");

/// Answers `method` on `path` with `body`, for a request that presented the token if
/// `vouched` (the partitions' shadow samples are shown only then).
fn route(served: &Served, method: &Method, path: &str, body: &[u8], vouched: bool) -> (StatusCode, String) {
    let read_only: Option<fn(&Served, bool) -> String> = match path {
        STATUS_PAGE_PATH => Some(|_, _| STATUS_PAGE.to_string()),
        METRICS_PATH => Some(|served, _| metrics::encode(&served.registry)),
        PARTITIONS_PATH => Some(|served, vouched| json(&served.metrics.partitions(vouched))),
        EVENTS_PATH => Some(|served, _| json(&EventsAnswer { now_ms: now_ms(), events: served.host.events() })),
        _ => None,
    };
    if let Some(read) = read_only {
        return match *method {
            Method::GET => (StatusCode::OK, read(served, vouched)),
            _ => (StatusCode::METHOD_NOT_ALLOWED, format!("{method} {path} is not part of the admin API")),
        };
    }
    let deployer = &served.deployer;
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (name, what) = match segments.as_slice() {
        ["operators", name, what] => (*name, *what),
        _ => return (StatusCode::NOT_FOUND, format!("no such resource: {path}")),
    };
    if let Err(e) = deploy::check_name(deployer.registry(), name) {
        return failure(e);
    }
    let result = match (method, what) {
        (&Method::GET, "versions") => {
            deployer.versions().map(|(history, running)| json(&VersionsAnswer { history, running }))
        }
        (&Method::POST, "versions") => deployer
            .deploy(body, &format!("admin API ({} bytes uploaded)", body.len()))
            .map(|report| json(&DeployAnswer::from(report))),
        (&Method::POST, "rollback") => deployer.rollback("admin API").map(|report| json(&DeployAnswer::from(report))),
        (&Method::GET, "shadow") => Ok(json(&deployer.shadow_status())),
        (&Method::POST, "shadow") => deployer
            .start_trial(Trial::Shadow, body, None, &format!("admin API ({} bytes uploaded)", body.len()))
            .map(|record| json(&record)),
        (&Method::DELETE, "shadow") => deployer.stop_trial(Trial::Shadow).map(|record| json(&record)),
        (&Method::POST, canary) if canary.starts_with("canary:") => match parse_share(&canary["canary:".len()..]) {
            Ok(share) => deployer
                .start_trial(Trial::Canary, body, Some(share), &format!("admin API ({} bytes uploaded)", body.len()))
                .map(|record| json(&record)),
            Err(e) => return (StatusCode::BAD_REQUEST, format!("{path}: {e:#}")),
        },
        (&Method::POST, "promote") => {
            deployer.promote_shadow("admin API: promoted shadow").map(|report| json(&DeployAnswer::from(report)))
        }
        _ => return (StatusCode::METHOD_NOT_ALLOWED, format!("{method} {path} is not part of the admin API")),
    };
    match result {
        Ok(answer) => (StatusCode::OK, answer),
        Err(e) => failure(e),
    }
}

/// The status a failed request answers with: what kind of failure `error` is.
fn status(error: &DeployError) -> StatusCode {
    match error {
        DeployError::Refused(_) => StatusCode::BAD_REQUEST,
        DeployError::UnknownOperator { .. } => StatusCode::NOT_FOUND,
        DeployError::AlreadyInForce { .. } | DeployError::NothingToRollBack(_) | DeployError::Conflict(_) => {
            StatusCode::CONFLICT
        }
        DeployError::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        DeployError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The answer to a request that failed with `error`: its status and the reason (which
/// the API logs with every answer but a success).
fn failure(error: DeployError) -> (StatusCode, String) {
    (status(&error), format!("{:#}", anyhow::Error::from(error)))
}

/// An answer as the API sends it.
fn json(answer: &impl Serialize) -> String {
    serde_json::to_string_pretty(answer).expect("answers are plain structs, which always serialize")
}

/// Calls the admin API at `admin` (`http://host:port` or `host:port`): `method` on
/// `path` with `body`, presenting the token in [`TOKEN_VARIABLE`] if it is set; returns
/// the answer's body, or an error with the host's reason.
pub fn call(admin: &str, method: Method, path: &str, body: Vec<u8>) -> Result<String> {
    let address = admin.strip_prefix("http://").unwrap_or(admin).trim_end_matches('/').to_string();
    if address.contains('/') || address.contains("://") {
        bail!("--admin {admin:?}: expected http://host:port");
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (status, text) = runtime
        .block_on(async {
            let stream = TcpStream::connect(&address).await?;
            let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(connection);
            let mut request = Request::builder().method(method.clone()).uri(path).header(hyper::header::HOST, &address);
            if let Ok(token) = std::env::var(TOKEN_VARIABLE) {
                request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {}", token.trim()));
            }
            let request = request.body(Full::new(Bytes::from(body)))?;
            let response = sender.send_request(request).await?;
            let status = response.status();
            let text = response.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, String::from_utf8_lossy(&text).into_owned()))
        })
        .with_context(|| format!("calling the admin API at {address}"))?;
    if !status.is_success() {
        return Err(anyhow!("{text}")).with_context(|| format!("{method} {path} at {address}: {status}"));
    }
    Ok(text)
}
