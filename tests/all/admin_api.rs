//! The admin API of a running host, through the real binary: it lets in only who it
//! must, strangers cannot hold its connections against its owner, and their refusals
//! cost a bounded log.

use crate::hot_swap::{PacedJob, SEED, paced_job};
use anyhow::Result;
use sluice_e2e::*;
use std::time::Duration;

/// The admin API refuses strangers, each with its reason: a deploy or rollback without
/// the token or with another (401); a request from another site's page (403); a
/// question without the token naming a `Host` that is not this host's (a page of a site
/// that pointed its name at 127.0.0.1, 403), but for an IP address, `localhost` and
/// `[admin] host_names`; an unauthenticated upload is answered before its body is read;
/// a connection past the limit closes the oldest one without a request, and idle ones
/// are closed after the header timeout, freeing their slots. Questions on loopback need
/// no token. A host told to listen beyond loopback without a token does not start.
#[test]
fn the_admin_api_lets_in_only_who_it_must() -> Result<()> {
    use sluice::admin::{HEADER_TIMEOUT, MAX_CONNECTIONS};
    use sluice::events::{CROSS_ORIGIN, FOREIGN_HOST, UNAUTHORIZED};
    use std::io::Read;
    use std::net::TcpStream;
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let PacedJob { mut host, admin, .. } = PacedJob::start(
        dir,
        (20, 100_000),
        1_000,
        &operator_wasm("vehicle_stats"),
        "host_names = [\"devbox.test\"]\n",
    )?;
    let address = admin.trim_start_matches("http://").to_string();
    let port = address.rsplit_once(':').map(|(_, port)| port).unwrap_or_default();
    let ask = |head: &str| ask(&address, head);
    let rollback = "POST /operators/vehicle_stats/rollback HTTP/1.1\r\n";
    let answer = ask(rollback)?;
    assert!(answer.starts_with("HTTP/1.1 401") && answer.contains(UNAUTHORIZED), "{answer}");
    let answer = ask(&format!("{rollback}Authorization: Bearer wrong\r\n"))?;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    let answer = ask(&format!("{rollback}Authorization: Bearer {ADMIN_TOKEN}\r\n"))?;
    assert!(answer.starts_with("HTTP/1.1 409") && answer.contains("nothing to roll back to"), "{answer}");
    let versions = "GET /operators/vehicle_stats/versions HTTP/1.1\r\n";
    assert!(ask(versions)?.starts_with("HTTP/1.1 200"), "a question on loopback needs no token");
    let answer = ask(&format!("{versions}Origin: http://elsewhere.example\r\n"))?;
    assert!(answer.starts_with("HTTP/1.1 403") && answer.contains(CROSS_ORIGIN), "{answer}");
    // What a page of rebound.example sends once its name points at 127.0.0.1.
    let rebound = format!("Host: rebound.example:{port}\r\n");
    for question in
        [versions, "GET /metrics HTTP/1.1\r\n", "GET /partitions HTTP/1.1\r\n", "GET /timeline HTTP/1.1\r\n"]
    {
        let answer = ask_as(&address, &rebound, question)?;
        assert!(answer.starts_with("HTTP/1.1 403") && answer.contains(FOREIGN_HOST), "{answer}");
    }
    for own in ["localhost", "127.0.0.1", "[::1]", "DevBox.test"] {
        let answer = ask_as(&address, &format!("Host: {own}:{port}\r\n"), versions)?;
        assert!(answer.starts_with("HTTP/1.1 200"), "{own}: {answer}");
    }
    let with_token = format!("{versions}Authorization: Bearer {ADMIN_TOKEN}\r\n");
    assert!(ask_as(&address, &rebound, &with_token)?.starts_with("HTTP/1.1 200"), "the token vouches for itself");
    // 100 MB announced, none sent: the refusal comes without waiting for them.
    let answer = ask("POST /operators/vehicle_stats/versions HTTP/1.1\r\nContent-Length: 100000000\r\n")?;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    // A shadow's samples show records' keys and values: the token's to see.
    let v2 = operator_wasm("vehicle_stats_v2");
    run_ok(sluice().args(["deploy", "vehicle_stats"]).arg(&v2).args(["--shadow", "--admin", &admin]))?;
    let shadow = "GET /operators/vehicle_stats/shadow HTTP/1.1\r\n";
    let vouched = |head: &str| ask(&format!("{head}Authorization: Bearer {ADMIN_TOKEN}\r\n"));
    let started = std::time::Instant::now();
    while !vouched(shadow)?.contains("idle_count") {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no sample of the shadow's difference: {}",
            vouched(shadow)?
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let answer = ask(shadow)?;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    let partitions = "GET /partitions HTTP/1.1\r\n";
    assert!(vouched(partitions)?.contains("idle_count"), "with the token, the samples");
    let answer = ask(partitions)?;
    assert!(answer.starts_with("HTTP/1.1 200") && !answer.contains("idle_count"), "{answer}");

    let mut idle: Vec<TcpStream> =
        (0..MAX_CONNECTIONS).map(|_| TcpStream::connect(&address)).collect::<std::io::Result<_>>()?;
    std::thread::sleep(Duration::from_millis(300));
    // The connection past the limit is served, and the oldest one closed for it.
    assert!(ask(versions)?.starts_with("HTTP/1.1 200"), "a new connection is served");
    let oldest = idle.remove(0);
    assert!(closed_within(oldest, Duration::from_secs(2)), "the oldest connection is closed for the new one");
    let started = std::time::Instant::now();
    for mut connection in idle {
        connection.set_read_timeout(Some(HEADER_TIMEOUT * 4))?;
        let closed = connection.read(&mut [0; 1024]).map(|_| true).unwrap_or(false);
        assert!(closed, "an idle connection is closed after the header timeout");
    }
    assert!(started.elapsed() < HEADER_TIMEOUT * 3, "closed after {:?}", started.elapsed());
    assert!(ask(versions)?.starts_with("HTTP/1.1 200"), "their slots are free again");
    host.kill_9()?;

    let config = paced_job(dir, &dir.join("input.jsonl"), 1_000, &operator_wasm("vehicle_stats"), "")?;
    let open = std::fs::read_to_string(&config)?.replace("127.0.0.1:0", "0.0.0.0:0");
    std::fs::write(&config, open)?;
    let err = run_err(sluice().env_remove(sluice::admin::TOKEN_VARIABLE).arg("run").arg("--config").arg(&config))?;
    assert!(err.contains("is beyond loopback") && err.contains("needs a token"), "{err}");
    Ok(())
}

/// Strangers cannot hold the admin API against its owner. Beyond loopback, connections
/// that fetched the status page (all it serves without the token) are closed after
/// their answer instead of kept open, and of as many more that send nothing the oldest
/// is closed for each new connection; meanwhile a deploy and a scrape with the token get
/// through, and a connection that presented the token stays open for its next request.
#[test]
fn strangers_cannot_hold_the_admin_api_against_its_owner() -> Result<()> {
    use sluice::admin::MAX_CONNECTIONS;
    use std::net::TcpStream;
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let input = dir.join("input.jsonl");
    generate(&input, 20, 100_000, SEED)?;
    let config = paced_job(dir, &input, 1_000, &operator_wasm("vehicle_stats"), "")?;
    std::fs::write(&config, std::fs::read_to_string(&config)?.replace("127.0.0.1:0", "0.0.0.0:0"))?;
    let mut host = Host::spawn("host", sluice().arg("run").arg("--config").arg(&config), &dir.join("host.log"))?;
    let port = host.admin_url()?.rsplit_once(':').map(|(_, port)| port.to_string()).unwrap_or_default();
    let address = format!("127.0.0.1:{port}");

    let page = "GET / HTTP/1.1\r\n";
    let mut strangers = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        let mut stranger = TcpStream::connect(&address)?;
        let answer = exchange(&mut stranger, &address, page)?;
        assert!(answer.starts_with("HTTP/1.1 200") && answer.contains("<html"), "{answer}");
        strangers.push(stranger);
    }
    for stranger in strangers {
        assert!(closed_within(stranger, Duration::from_secs(2)), "a stranger's connection closes after its answer");
    }
    let silent: Vec<TcpStream> =
        (0..MAX_CONNECTIONS).map(|_| TcpStream::connect(&address)).collect::<std::io::Result<_>>()?;
    std::thread::sleep(Duration::from_millis(300));
    let deployed = run_ok(
        sluice().arg("deploy").arg("vehicle_stats").arg(operator_wasm("vehicle_stats_v2")).arg("--admin").arg(&address),
    )?;
    assert!(String::from_utf8_lossy(&deployed.stdout).contains("(entry 2)"));
    let mut owner = TcpStream::connect(&address)?;
    let scrape = format!("GET /metrics HTTP/1.1\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n");
    for _ in 0..2 {
        let answer = exchange(&mut owner, &address, &scrape)?;
        let kept_open = !answer.to_lowercase().contains("connection: close");
        assert!(answer.starts_with("HTTP/1.1 200") && kept_open, "{answer}");
    }
    let oldest = silent.into_iter().next().expect("connections were opened");
    assert!(closed_within(oldest, Duration::from_secs(2)), "the oldest was closed for the deploy's connection");
    host.kill_9()
}

/// Refused requests cost a bounded log: of a burst of 200, at most
/// [`REFUSALS_LOGGED`](sluice::admin::REFUSALS_LOGGED) per window are logged one by one,
/// and the rest in a line counting them once the window is over.
#[test]
fn refused_requests_cost_a_bounded_log() -> Result<()> {
    use sluice::admin::{REFUSAL_LOG_WINDOW, REFUSALS_LOGGED};
    use sluice::events::REFUSALS_COUNTED;
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let PacedJob { mut host, admin, .. } =
        PacedJob::start(dir, (20, 100_000), 1_000, &operator_wasm("vehicle_stats"), "")?;
    let address = admin.trim_start_matches("http://").to_string();
    let rollback = "POST /operators/vehicle_stats/rollback HTTP/1.1\r\n";
    let (burst, started) = (200, std::time::Instant::now());
    for _ in 0..burst {
        assert!(ask(&address, rollback)?.starts_with("HTTP/1.1 401"));
    }
    // So it spans two windows at most.
    assert!(started.elapsed() < REFUSAL_LOG_WINDOW, "the burst took {:?}", started.elapsed());
    host.wait_for(REFUSALS_COUNTED, 1, REFUSAL_LOG_WINDOW * 2)?;
    let log = host.log();
    let one_by_one = log.lines().filter(|line| line.contains("POST /operators/vehicle_stats/rollback")).count() as u64;
    let counted: u64 = log
        .lines()
        .filter_map(|line| line.split_once(&format!(" {REFUSALS_COUNTED}"))?.0.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(one_by_one <= 2 * REFUSALS_LOGGED && one_by_one + counted == burst, "{one_by_one} + {counted}:\n{log}");
    host.kill_9()
}

/// One request with `head` (its request line and headers but `Host`) on its own
/// connection to `address`, naming it as the `Host`; the answer's status line, headers
/// and body.
fn ask(address: &str, head: &str) -> Result<String> {
    ask_as(address, &format!("Host: {address}\r\n"), head)
}

/// [`ask`] with the `Host` header line `host`.
fn ask_as(address: &str, host: &str, head: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(format!("{head}{host}Connection: close\r\n\r\n").as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// One request with `head` on `stream`, kept open, to `address`; the whole answer,
/// read as far as its `content-length` says.
fn exchange(stream: &mut std::net::TcpStream, address: &str, head: &str) -> Result<String> {
    use std::io::{Read, Write};
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(format!("{head}Host: {address}\r\n\r\n").as_bytes())?;
    let mut answer = Vec::new();
    let mut buffer = [0; 8192];
    loop {
        let n = stream.read(&mut buffer)?;
        anyhow::ensure!(n > 0, "the connection closed mid-answer: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buffer[..n]);
        let text = String::from_utf8_lossy(&answer).to_lowercase();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end].lines().find_map(|line| line.strip_prefix("content-length: "));
            let length: usize = length.and_then(|l| l.trim().parse().ok()).unwrap_or(0);
            if answer.len() >= end + 4 + length {
                return Ok(String::from_utf8_lossy(&answer).into_owned());
            }
        }
    }
}

/// Whether the host closes `stream` within `timeout` (it reads the end of the stream).
fn closed_within(mut stream: std::net::TcpStream, timeout: Duration) -> bool {
    use std::io::Read;
    stream.set_read_timeout(Some(timeout)).is_ok() && stream.read_to_end(&mut Vec::new()).is_ok()
}
