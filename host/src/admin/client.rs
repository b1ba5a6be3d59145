//! The client `sluice deploy`, `rollback`, `versions --admin` and the tests call the
//! admin API with ([`call`]).

use super::TOKEN_VARIABLE;
use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

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
