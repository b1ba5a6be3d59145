//! What the admin API answers ([`route`]): the paths it serves, the status page, the
//! answers' shapes, and the status each kind of failed deploy gets. Who may ask is
//! `access`'; reading the request and writing the response is the [module](super)'s.

use super::Served;
use crate::metrics;
use crate::operator::deploy::{self, DeployReport};
use crate::operator::parse_share;
use crate::operator::registry::{DeployError, Deployment, Trial};
use crate::probes::now_ms;
use crate::stats::TimelineEntry;
use hyper::{Method, StatusCode};
use serde::{Deserialize, Serialize};

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

/// The answer to `GET /timeline`.
#[derive(Debug, Clone, Serialize)]
pub struct TimelineAnswer {
    /// The host's clock, ms since the epoch, for placing the entries.
    pub now_ms: u64,
    /// The latest entries of the host's timeline, oldest first.
    pub entries: Vec<TimelineEntry>,
}

/// The answer to a versions request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VersionsAnswer {
    /// Every entry, oldest first.
    pub history: Vec<Deployment>,
    /// The version this host runs.
    pub running: String,
}

/// Where the metrics are served.
pub const METRICS_PATH: &str = "/metrics";
/// Where the partitions' status is served.
pub const PARTITIONS_PATH: &str = "/partitions";
/// Where the status page is served.
pub const STATUS_PAGE_PATH: &str = "/";
/// Where the host's timeline is served.
pub const TIMELINE_PATH: &str = "/timeline";

/// The status page (`admin/status.html`, in the binary).
const STATUS_PAGE: &str = include_str!("status.html");

/// Answers `method` on `path` with `body`, for a request that presented the token if
/// `vouched` (the partitions' shadow samples are shown only then).
pub(super) fn route(served: &Served, method: &Method, path: &str, body: &[u8], vouched: bool) -> (StatusCode, String) {
    let read_only: Option<fn(&Served, bool) -> String> = match path {
        STATUS_PAGE_PATH => Some(|_, _| STATUS_PAGE.to_string()),
        METRICS_PATH => Some(|served, _| metrics::encode(&served.registry)),
        PARTITIONS_PATH => Some(|served, vouched| json(&served.metrics.partitions(vouched))),
        TIMELINE_PATH => Some(|served, _| json(&TimelineAnswer { now_ms: now_ms(), entries: served.host.timeline() })),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind of failed deploy answers with its own status, and with its reason.
    #[test]
    fn a_failed_request_answers_with_the_status_of_its_kind() {
        let unknown = DeployError::UnknownOperator { runs: "stats".into(), asked: "other".into() };
        let in_force = DeployError::AlreadyInForce { version: "stats@ab".into(), seq: 3 };
        let cases = [
            (DeployError::Refused(anyhow::anyhow!("not a component")), 400, "not a component"),
            (unknown, 404, "this job runs operator `stats`, not `other`"),
            (in_force, 409, "stats@ab is already the version in force (entry 3)"),
            (DeployError::NothingToRollBack("nothing before entry 1".into()), 409, "nothing before entry 1"),
            (DeployError::Conflict("the history changed".into()), 409, "the history changed"),
            (DeployError::StoreUnavailable(anyhow::anyhow!("timed out")), 503, "timed out"),
            (DeployError::Internal(anyhow::anyhow!("disk full")), 500, "disk full"),
        ];
        for (error, code, reason) in cases {
            let (status, body) = failure(error);
            assert_eq!((status.as_u16(), body.as_str()), (code, reason));
        }
    }
}
