//! The deterministic WASI a job may give components that import WASI (`[operator] wasi =
//! "deterministic"`; by default every WASI call traps, naming itself): a CPython or
//! JavaScript runtime built with its WASI imports in place starts and runs, and a replay
//! of it decides as the first run did, because nothing of the machine reaches it.
//!
//! - **Clocks** read the moment the guest runs for: the wall clock is the record's event
//!   time (a timer's or an expiry's time in `fired` and `expired`; the epoch in `init` and
//!   for a record without one), the monotonic clock the partition's clock (the one timers
//!   fire on), which never goes back. Sleeping (`subscribe-duration`, `subscribe-instant`)
//!   traps: an operator's time is its record's, and a sleep would hold the partition in
//!   real time without spending the CPU its deadline counts.
//! - **Randomness**, secure and insecure alike, is a stream of SHA-256 blocks seeded from
//!   the version, the partition and the moment (the record's offset, or the timer's
//!   offset, key and name); the insecure seed from the version and partition.
//! - **stdout and stderr** go to the operator's log after each call, line by line
//!   (stderr's at `warn` first, then stdout's at `info`), under `[operator.limits]`' log bounds as
//!   `log` is; a call's printing past `log_bytes_per_s` is dropped, and counted.
//! - **No files, no environment, no arguments, no network**: no preopened directory, no
//!   variable, TCP, UDP and name lookups refused; stdin is closed.
//! - The handles a guest holds (streams, pollables) are bounded per instance
//!   ([`MAX_WASI_HANDLES`]).
//!
//! This room owns what the WASI functions read. Which jobs get it is the config's to say
//! ([`WasiGrant`]); the linker setup is `component`'s, the moment's per-record update the
//! callers' that open a record scope.

use super::*;
use crate::config::WasiGrant;
use sha2::{Digest, Sha256};
use std::sync::Mutex;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};

/// The WASI packages wasmtime-wasi's linker defines, at [`WASI_VERSION`]; a component's
/// import of any 0.2.x version of them links to those (semver).
const PROVIDED: [&str; 6] =
    ["wasi:io/", "wasi:clocks/", "wasi:random/", "wasi:filesystem/", "wasi:cli/", "wasi:sockets/"];
/// The version of WASI 0.2 wasmtime-wasi 48 defines its interfaces at.
const WASI_VERSION: &str = "0.2.12";
/// The monotonic clock's functions that wait in real time, which the deterministic WASI
/// denies.
const SLEEPS: [&str; 2] = ["subscribe-duration", "subscribe-instant"];

/// Whether the deterministic WASI defines the interface `import` names (as
/// `wasi:clocks/wall-clock@0.2.9`); the sandbox denies the others (`wasi:http`'s, say).
pub(super) fn provides(import: &str) -> bool {
    PROVIDED.iter().any(|package| import.starts_with(package))
        && import.split_once('@').is_some_and(|(_, version)| version.starts_with("0.2."))
}

/// Defines the deterministic WASI's interfaces in `linker`, the sleeps as traps.
pub(super) fn add_to_linker(linker: &mut Linker<HostCtx>) -> Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    linker.allow_shadowing(true);
    let clock = format!("wasi:clocks/monotonic-clock@{WASI_VERSION}");
    let mut instance = linker.instance(&clock)?;
    for sleep in SLEEPS {
        deny_function(&mut instance, &clock, sleep)?;
    }
    linker.allow_shadowing(false);
    Ok(())
}

/// A live instance's WASI: what its functions read, and the handles it holds.
pub(super) struct DeterministicWasi {
    ctx: WasiCtx,
    table: ResourceTable,
    moment: Arc<Mutex<Moment>>,
    stdout: Printed,
    stderr: Printed,
}

impl DeterministicWasi {
    /// A fresh WASI for an instance of `version` on `partition`, its printing bounded to
    /// `print_bytes` a call, at the moment of `init`.
    pub(super) fn new(version: &str, partition: u32, print_bytes: usize) -> Self {
        let origin = Sha256::new().chain_update(version.as_bytes()).chain_update(partition.to_be_bytes());
        let insecure_seed = u128::from_be_bytes(origin.clone().finalize()[..16].try_into().expect("16 bytes"));
        let moment = Arc::new(Mutex::new(Moment { origin, ..Moment::default() }));
        let (stdout, stderr) = (Printed::new(print_bytes), Printed::new(print_bytes));
        let ctx = WasiCtx::builder()
            .wall_clock(EventClock(moment.clone()))
            .monotonic_clock(EventClock(moment.clone()))
            .secure_random(MomentRandom(moment.clone()))
            .insecure_random(MomentRandom(moment.clone()))
            .insecure_random_seed(insecure_seed)
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_WASI_HANDLES);
        DeterministicWasi { ctx, table, moment, stdout, stderr }
    }

    /// The guest runs for what is at `offset` (and, for a timer or expiry, its `key` and
    /// `name`), at event time `time_ms`, the partition's clock at `clock_ms`.
    pub(super) fn enter(&mut self, offset: u64, key: &[u8], name: &str, time_ms: i64, clock_ms: u64) {
        let mut moment = self.moment.lock().expect("no panic holds the moment");
        moment.inputs.clear();
        moment.inputs.extend_from_slice(&offset.to_be_bytes());
        moment.inputs.extend_from_slice(&(key.len() as u64).to_be_bytes());
        moment.inputs.extend_from_slice(key);
        moment.inputs.extend_from_slice(name.as_bytes());
        (moment.time_ms, moment.clock_ms, moment.stream) = (time_ms.max(0) as u64, clock_ms, None);
    }

    /// What the guest printed since the last call, at the level each goes to the log
    /// at, with the bytes dropped past the bound: stderr's first, which a log short of
    /// its rate had better keep.
    pub(super) fn take_printed(&mut self) -> [(log::Level, Vec<u8>, usize); 2] {
        [(log::Level::Warn, &self.stderr), (log::Level::Info, &self.stdout)].map(|(level, printed)| {
            let (bytes, dropped) = printed.take();
            (level, bytes, dropped)
        })
    }
}

impl WasiView for HostCtx {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let wasi =
            self.wasi.as_mut().expect("WASI is linked only where the job grants it, and then every instance has one");
        WasiCtxView { ctx: &mut wasi.ctx, table: &mut wasi.table }
    }
}

impl HostCtx {
    /// The WASI an instance of `operator` gets under `grant`.
    pub(super) fn grant_wasi(&mut self, grant: WasiGrant, version: &str) {
        self.wasi = (grant == WasiGrant::Deterministic)
            .then(|| DeterministicWasi::new(version, self.partition, self.per_call.log_bytes_per_s as usize));
    }

    /// Writes what the guest printed in the last call to the operator's log, a line at a
    /// time, as `log` would.
    pub(super) fn forward_printed(&mut self) {
        let Some(wasi) = self.wasi.as_mut() else { return };
        for (level, bytes, dropped) in wasi.take_printed() {
            for line in bytes.split(|&b| b == b'\n').filter(|line| !line.is_empty()) {
                log::Host::log(self, level, String::from_utf8_lossy(line).into_owned()).expect("logging cannot fail");
            }
            if dropped > 0 {
                let (operator, partition) = (&*self.operator, self.partition);
                tracing::warn!(
                    operator,
                    partition,
                    "operator printed {dropped} bytes past [operator.limits] log_bytes_per_s in one call: its \
                     {LOG_LINES_DROPPED}"
                );
            }
        }
    }
}

/// Opens the moment of `wasi`, if the instance has one, for the record at `offset` of
/// `key` at `time_ms` (a timer's or expiry's `name` with it), at the clock of `txn`: see
/// [`DeterministicWasi::enter`]. (Free of [`HostCtx`], so a caller can lend it fields
/// of the context while another field holds the key.)
pub(super) fn enter_moment(
    wasi: &mut Option<DeterministicWasi>,
    txn: &Transaction,
    offset: u64,
    key: &[u8],
    name: &str,
    time_ms: i64,
) {
    if let Some(wasi) = wasi.as_mut() {
        wasi.enter(offset, key, name, time_ms, txn.clock().now_ms());
    }
}

/// What the clocks and the random streams read: the moment the guest runs for.
#[derive(Default)]
struct Moment {
    /// The version and partition, hashed: every seed starts from it.
    origin: Sha256,
    /// What the guest runs for: the offset, and a timer's key and name.
    inputs: Vec<u8>,
    time_ms: u64,
    clock_ms: u64,
    /// The random stream of the moment, once read: its seed and the next block's number.
    stream: Option<([u8; 32], u64)>,
}

impl Moment {
    /// The next 32 random bytes of the moment's stream.
    fn next_block(&mut self) -> [u8; 32] {
        let (origin, inputs) = (&self.origin, &self.inputs);
        let (seed, block) =
            self.stream.get_or_insert_with(|| (origin.clone().chain_update(inputs).finalize().into(), 0));
        let bytes = Sha256::new().chain_update(*seed).chain_update(block.to_be_bytes()).finalize().into();
        *block += 1;
        bytes
    }
}

/// The clocks, at the moment's event time (wall) and partition clock (monotonic).
struct EventClock(Arc<Mutex<Moment>>);

impl EventClock {
    fn read(&self) -> (u64, u64) {
        let moment = self.0.lock().expect("no panic holds the moment");
        (moment.time_ms, moment.clock_ms)
    }
}

impl HostWallClock for EventClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }

    fn now(&self) -> Duration {
        Duration::from_millis(self.read().0)
    }
}

impl HostMonotonicClock for EventClock {
    fn resolution(&self) -> u64 {
        1_000_000
    }

    fn now(&self) -> u64 {
        self.read().1.saturating_mul(1_000_000)
    }
}

/// Random bytes, the moment's stream.
struct MomentRandom(Arc<Mutex<Moment>>);

impl rand_core::TryRng for MomentRandom {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> std::result::Result<u32, Self::Error> {
        let mut bytes = [0; 4];
        self.try_fill_bytes(&mut bytes)?;
        Ok(u32::from_le_bytes(bytes))
    }

    fn try_next_u64(&mut self) -> std::result::Result<u64, Self::Error> {
        let mut bytes = [0; 8];
        self.try_fill_bytes(&mut bytes)?;
        Ok(u64::from_le_bytes(bytes))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> std::result::Result<(), Self::Error> {
        let mut moment = self.0.lock().expect("no panic holds the moment");
        for chunk in dst.chunks_mut(32) {
            chunk.copy_from_slice(&moment.next_block()[..chunk.len()]);
        }
        Ok(())
    }
}

/// stdout or stderr: what the guest printed in the running call, up to its bound.
#[derive(Clone)]
struct Printed(Arc<Mutex<PrintedBytes>>);

struct PrintedBytes {
    bytes: Vec<u8>,
    bound: usize,
    dropped: usize,
}

impl Printed {
    fn new(bound: usize) -> Self {
        Printed(Arc::new(Mutex::new(PrintedBytes { bytes: Vec::new(), bound, dropped: 0 })))
    }

    /// The bytes printed, and how many were dropped past the bound, since the last take.
    fn take(&self) -> (Vec<u8>, usize) {
        let mut printed = self.0.lock().expect("no panic holds what was printed");
        (std::mem::take(&mut printed.bytes), std::mem::take(&mut printed.dropped))
    }
}

impl IsTerminal for Printed {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Printed {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    /// WASI 0.3's stream, which the host does not link.
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(tokio::io::sink())
    }
}

impl OutputStream for Printed {
    /// Keeps what fits the bound, drops the rest: printing never fails the guest.
    fn write(&mut self, bytes: bytes::Bytes) -> std::result::Result<(), StreamError> {
        let mut printed = self.0.lock().expect("no panic holds what was printed");
        let kept = bytes.len().min(printed.bound - printed.bytes.len().min(printed.bound));
        printed.bytes.extend_from_slice(&bytes[..kept]);
        printed.dropped += bytes.len() - kept;
        Ok(())
    }

    fn flush(&mut self) -> std::result::Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> std::result::Result<usize, StreamError> {
        // What one write may hand over (the usual WASI stream's), whatever fits.
        Ok(64 << 10)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Printed {
    async fn ready(&mut self) {}
}
