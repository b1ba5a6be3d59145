//! The admin HTTP API of a running host, and the client `sluice` uses to call it.
//!
//! ```text
//! GET  /operators/<name>/versions   the history of deployed versions (JSON)
//! POST /operators/<name>/versions   deploy the component in the body (application/wasm)
//! POST /operators/<name>/rollback   roll back to the version before the newest deploy
//! ```
//!
//! A deploy or rollback answers once every partition of this host has switched or
//! refused the version (or after the deployer's timeout), with what the switch took
//! (JSON); other hosts of the job follow through the registry. A failed request
//! answers with the reason as text, and the running version keeps running; the status
//! says what kind of failure it was: 400 a component that cannot run, 404 another
//! operator's name, 409 a request the history does not allow (already in force,
//! nothing to roll back to, changed meanwhile), 503 the store holding the registry
//! unavailable, 500 this host's own failure. The API listens where `[admin] listen`
//! says (loopback is the safe choice: it has no authentication). This module owns the
//! HTTP surface only; what a deploy does is the [deployer](crate::operator::deploy)'s.

use crate::operator::deploy::{self, DeployReport, Deployer};
use crate::operator::registry::{DeployError, Deployment};
use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

/// Logged once the API listens: `admin API listening on http://127.0.0.1:PORT`.
pub const LISTENING: &str = "admin API listening on ";

/// The largest component a deploy accepts.
const MAX_COMPONENT_BYTES: usize = 256 << 20;

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
            worst_stall_us: report.worst_stall.as_micros() as u64,
            not_switched: report.not_switched,
            deployment: report.deployment,
        }
    }
}

/// The answer to a versions request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VersionsAnswer {
    /// Every entry, oldest first.
    pub history: Vec<Deployment>,
    /// The version this host runs.
    pub running: String,
}

/// Starts serving the API for `deployer` on `listen` (`host:port`; port 0 picks one)
/// on `runtime`; returns the address it listens on, which is also logged.
pub fn serve(listen: &str, deployer: Arc<Deployer>, runtime: &Runtime) -> Result<SocketAddr> {
    let listener = runtime
        .block_on(TcpListener::bind(listen))
        .with_context(|| format!("[admin] listen = {listen:?}: cannot listen there"))?;
    let address = listener.local_addr()?;
    tracing::info!("{LISTENING}http://{address}");
    runtime.spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("admin API: accepting a connection failed: {e}");
                    continue;
                }
            };
            let deployer = deployer.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| answer(deployer.clone(), request));
                if let Err(e) =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await
                {
                    tracing::debug!("admin API connection: {e}");
                }
            });
        }
    });
    Ok(address)
}

async fn answer(deployer: Arc<Deployer>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    let (status, body) = match Limited::new(request.into_body(), MAX_COMPONENT_BYTES).collect().await {
        Ok(body) => {
            let body = body.to_bytes();
            // Deploys compile and wait for partitions: off the runtime's threads.
            tokio::task::spawn_blocking(move || route(&deployer, &method, &path, &body))
                .await
                .unwrap_or_else(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("the request panicked: {e}")))
        }
        Err(e) => (StatusCode::PAYLOAD_TOO_LARGE, format!("reading the request body: {e}")),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    Ok(response)
}

fn route(deployer: &Deployer, method: &Method, path: &str, body: &[u8]) -> (StatusCode, String) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (name, what) = match segments.as_slice() {
        ["operators", name, what] => (*name, *what),
        _ => return (StatusCode::NOT_FOUND, format!("no such resource: {path}")),
    };
    if let Err(e) = deploy::check_name(deployer.registry(), name) {
        return failure(method, path, e);
    }
    let result = match (method, what) {
        (&Method::GET, "versions") => {
            deployer.versions().map(|(history, running)| json(&VersionsAnswer { history, running }))
        }
        (&Method::POST, "versions") => deployer
            .deploy(body, &format!("admin API ({} bytes uploaded)", body.len()))
            .map(|report| json(&DeployAnswer::from(report))),
        (&Method::POST, "rollback") => deployer.rollback("admin API").map(|report| json(&DeployAnswer::from(report))),
        _ => return (StatusCode::METHOD_NOT_ALLOWED, format!("{method} {path} is not part of the admin API")),
    };
    match result {
        Ok(answer) => (StatusCode::OK, answer),
        Err(e) => failure(method, path, e),
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

/// The answer to a request that failed with `error`: its status and the reason.
fn failure(method: &Method, path: &str, error: DeployError) -> (StatusCode, String) {
    let status = status(&error);
    let reason = format!("{:#}", anyhow::Error::from(error));
    tracing::warn!("admin API: {method} {path}: {status}: {reason}");
    (status, reason)
}

/// An answer as the API sends it.
fn json(answer: &impl Serialize) -> String {
    serde_json::to_string_pretty(answer).expect("answers are plain structs, which always serialize")
}

/// Calls the admin API at `admin` (`http://host:port` or `host:port`): `method` on
/// `path` with `body`; returns the answer's body, or an error with the host's reason.
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
            let request = Request::builder()
                .method(method.clone())
                .uri(path)
                .header(hyper::header::HOST, &address)
                .body(Full::new(Bytes::from(body)))?;
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
