//! The S3-compatible store the tests start on a free loopback port ([`S3Server`],
//! `s3s-fs`, installed by `./dev.sh test` and `./dev.sh bench`), stopped when dropped,
//! and finding such ports. Apache Kafka is [`kafka_broker`](crate::kafka_broker)'s.

use crate::binary::signal;
use anyhow::{Context, Result, bail};
use std::path::PathBuf;
use std::process::Command;

/// A loopback port nothing listens on (released again, for a server to take).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until something accepts connections on loopback `port`; fails after `timeout`.
pub fn wait_listening(port: u16, timeout: std::time::Duration) -> Result<()> {
    let started = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if started.elapsed() > timeout {
            bail!("nothing listens on port {port} after {timeout:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

/// Starts `command` (a server installed by `./dev.sh test`) quietly and waits until it
/// accepts connections on loopback `port`.
fn spawn_listening(mut command: Command, port: u16) -> Result<std::process::Child> {
    let name = command.get_program().to_string_lossy().into_owned();
    let mut child = command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting {name} (./dev.sh test and ./dev.sh bench install it)"))?;
    if let Err(e) = wait_listening(port, std::time::Duration::from_secs(20)) {
        child.kill().ok();
        return Err(e.context(format!("{name} did not start")));
    }
    Ok(child)
}

/// An S3-compatible server (`s3s-fs`, installed by `./dev.sh test`) on a free loopback
/// port, serving the bucket `sluice` from a temporary directory; stopped when dropped.
pub struct S3Server {
    child: std::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The bucket's directory: every object is a file under it.
    pub bucket_dir: PathBuf,
    _root: tempfile::TempDir,
}

impl S3Server {
    /// Starts the server and waits until it accepts connections.
    pub fn start() -> Result<Self> {
        let root = tempfile::tempdir()?;
        let bucket_dir = root.path().join("sluice");
        std::fs::create_dir(&bucket_dir)?;
        let port = free_port()?;
        let mut command = Command::new("s3s-fs");
        command
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--access-key",
                "sluice",
                "--secret-key",
                "sluice-secret",
            ])
            .arg(root.path());
        let child = spawn_listening(command, port)?;
        Ok(S3Server { child, endpoint: format!("http://127.0.0.1:{port}"), bucket_dir, _root: root })
    }

    /// Sets the `AWS_*` variables that point a `sluice` command at this server.
    pub fn configure<'a>(&self, command: &'a mut Command) -> &'a mut Command {
        command
            .env("AWS_ENDPOINT", &self.endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "sluice")
            .env("AWS_SECRET_ACCESS_KEY", "sluice-secret")
            .env("AWS_REGION", "us-east-1")
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) the server: to its clients, a store that
    /// stopped answering (connections are still accepted, requests never answered).
    pub fn freeze(&self, frozen: bool) -> Result<()> {
        signal(self.child.id(), if frozen { "STOP" } else { "CONT" })
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}
