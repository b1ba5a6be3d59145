//! Who may call the admin API ([`Access`]): the host's token, where it comes from, and
//! what a request without it may still ask (see the [module](super)'s list). It decides
//! about one request at a time; how many connections stay open is `connections`'.

use super::TOKEN_VARIABLE;
use super::events::{CROSS_ORIGIN, FOREIGN_HOST, NO_TOKEN, UNAUTHORIZED};
use crate::config::AdminConfig;
use anyhow::{Context, Result, bail};
use hyper::{Request, StatusCode};
use std::net::IpAddr;

/// The token a host requires, from `[admin] token_file`, else [`TOKEN_VARIABLE`];
/// `None`: no token, and the API changes nothing.
pub(super) fn token(config: &AdminConfig) -> Result<Option<String>> {
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
pub(super) struct Access {
    pub(super) token: Option<String>,
    /// Whether the API listens on loopback only: then questions need no token.
    pub(super) loopback: bool,
    /// `[admin] host_names`: the names besides IP addresses and `localhost` a question
    /// without the token may give as its `Host`.
    pub(super) host_names: Vec<String>,
}

impl Access {
    /// Whether `request` presents this host's token.
    pub(super) fn vouches<B>(&self, request: &Request<B>) -> bool {
        let presented = header(request, hyper::header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer "));
        matches!((presented, &self.token), (Some(presented), Some(token)) if same(presented.as_bytes(), token.as_bytes()))
    }

    /// Why `request` (changing state or not; presenting the token if `vouched`) may not
    /// go on, as the answer's status and body; `None`: it may.
    pub(super) fn refusal<B>(
        &self,
        request: &Request<B>,
        changes_state: bool,
        vouched: bool,
    ) -> Option<(StatusCode, String)> {
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
fn header<B>(request: &Request<B>, name: hyper::header::HeaderName) -> Option<&str> {
    request.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Whether `a` and `b` are equal, in a time that does not say where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(token: Option<&str>, loopback: bool) -> Access {
        Access { token: token.map(str::to_string), loopback, host_names: vec!["ops.internal".to_string()] }
    }

    fn request(headers: &[(&str, &str)]) -> Request<()> {
        let mut request = Request::builder().uri("/partitions");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).expect("a request")
    }

    /// The bearer token vouches for a request only when it is the host's, byte for
    /// byte; a host without a token vouches for none.
    #[test]
    fn only_the_hosts_own_token_vouches() {
        let with = |token| request(&[("authorization", token)]);
        assert!(access(Some("s3cret"), true).vouches(&with("Bearer s3cret")));
        assert!(!access(Some("s3cret"), true).vouches(&with("Bearer s3cre")));
        assert!(!access(Some("s3cret"), true).vouches(&with("Bearer s3cret ")));
        assert!(!access(Some("s3cret"), true).vouches(&with("s3cret")), "not a bearer token");
        assert!(!access(None, true).vouches(&with("Bearer ")));
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"abc", b"ab"));
    }

    /// On loopback a question without the token names this host by an IP address,
    /// localhost or a configured name (a rebinding site's name is refused); a change
    /// without it is refused, 401, or 403 where the host has no token; another site's
    /// page is refused whatever it presents.
    #[test]
    fn a_request_is_let_in_as_the_module_says() {
        let on_loopback = access(Some("s3cret"), true);
        let status = |access: &Access, headers: &[(&str, &str)], changes: bool, vouched: bool| {
            access.refusal(&request(headers), changes, vouched).map(|(status, _)| status.as_u16())
        };
        for host in ["127.0.0.1:8080", "[::1]:80", "localhost:9", "LOCALHOST", "ops.internal:1"] {
            assert_eq!(status(&on_loopback, &[("host", host)], false, false), None, "{host}");
        }
        assert_eq!(status(&on_loopback, &[("host", "evil.example:8080")], false, false), Some(403));
        assert_eq!(status(&on_loopback, &[], false, false), Some(403), "no Host at all");
        assert_eq!(status(&on_loopback, &[("host", "evil.example")], false, true), None, "the token vouches");
        assert_eq!(status(&on_loopback, &[("host", "localhost")], true, false), Some(401));
        assert_eq!(status(&access(None, true), &[("host", "localhost")], true, false), Some(403));
        assert_eq!(status(&access(Some("s3cret"), false), &[("host", "10.0.0.1")], false, false), Some(401));
        let cross = [("host", "localhost:80"), ("origin", "http://evil.example")];
        assert_eq!(status(&on_loopback, &cross, false, true), Some(403), "another site's page");
        assert_eq!(
            status(&on_loopback, &[("host", "localhost:80"), ("origin", "http://localhost:80")], false, false),
            None
        );
    }

    /// The token file's text, trimmed, is the token; an empty one is an error naming
    /// where it came from.
    #[test]
    fn the_token_comes_from_its_file_trimmed_and_is_never_empty() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("token");
        let config = AdminConfig { token_file: Some(path.clone()), ..AdminConfig::default() };
        std::fs::write(&path, "s3cret\n")?;
        assert_eq!(token(&config)?.as_deref(), Some("s3cret"));
        std::fs::write(&path, " \n")?;
        let empty = token(&config).expect_err("empty");
        assert!(empty.to_string().contains("the admin token is empty"), "{empty:#}");
        std::fs::remove_file(&path)?;
        let missing = token(&config).expect_err("missing");
        assert!(format!("{missing:#}").contains("[admin] token_file: reading"), "{missing:#}");
        Ok(())
    }
}
