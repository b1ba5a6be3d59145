//! The `sluice` command line: the arguments parsed, the log set up, and the command
//! handed to its module under [`cli`], whose error, if any, is printed as the last line
//! and makes the exit code 1.
//!
//! What each command does is its module's; what its flags are is `cli::args`'s. This
//! file owns only the order of those steps, the log's format and what counts as a
//! failure (not standard output's pipe closed early by its reader).

use anyhow::Result;
use clap::Parser;
use cli::args::{Cli, Command, LogFormat, NewCommand, ShadowCommand, StateCommand};
use sluice::operator::registry::Trial;
use std::io::{ErrorKind, IsTerminal};
use std::process::ExitCode;

mod cli;

/// jemalloc, for every allocation of the process: Rust's, and — its `malloc` unprefixed —
/// RocksDB's and librdkafka's too. Under glibc's malloc and free, which took about a
/// sixth of a windowed job's CPU, the 10,000-vehicle jobs spend 14-25% more CPU a record
/// (docs/benchmarks.md, "The allocator").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, which it reads at its start (`MALLOC_CONF` in the environment
/// adds to them): an arena per CPU the process may run on rather than jemalloc's four,
/// whose memory freed in one arena and not reusable in another added about 11 MiB to
/// every job's peak RSS. (Not `percpu_arena`, an arena per CPU with each thread on its
/// CPU's, which under a CPU affinity narrower than the machine — `taskset`, a
/// container's cpuset — turns itself off with a line on stderr at every start.)
#[allow(non_upper_case_globals)]
#[unsafe(no_mangle)]
// SAFETY: the pointer is to a NUL-terminated `'static` literal, which jemalloc reads as
// its `const char *malloc_conf` (the type tikv-jemalloc-sys declares) before `main`.
static malloc_conf: Option<&std::ffi::c_char> = Some(unsafe { &*c"narenas_ratio:1".as_ptr() });

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG").unwrap_or_else(|_| "info".into()));
    match cli.log_format {
        // Escape sequences only where a terminal shows them, never in a file or a pipe.
        LogFormat::Text => {
            log.with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()).init()
        }
        LogFormat::Json => log.json().flatten_event(true).with_current_span(true).with_span_list(false).init(),
    }
    match dispatch(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        // `sluice state dump | head` closing the pipe early is not a failure; a broken
        // pipe of any other connection (a store's, a broker's) is.
        Err(error) if is_broken_pipe(&error) && reader_gone(libc::STDOUT_FILENO) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether `error` comes from writing to a pipe whose reader has gone, directly or
/// through serde_json's writer.
fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        let kind = cause
            .downcast_ref::<std::io::Error>()
            .map(std::io::Error::kind)
            .or_else(|| cause.downcast_ref::<serde_json::Error>().and_then(serde_json::Error::io_error_kind));
        kind == Some(ErrorKind::BrokenPipe)
    })
}

/// Whether `fd` is the writing end of a pipe whose reader has gone (poll reports an
/// error on it): what a broken pipe on standard output means.
fn reader_gone(fd: i32) -> bool {
    let mut poll = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
    // SAFETY: one pollfd, valid for the call; a zero timeout never blocks.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready == 1 && poll.revents & libc::POLLERR != 0
}

/// Runs `command` by its module.
fn dispatch(command: Command) -> Result<()> {
    match command {
        Command::Run(args) => cli::run::run_job(*args),
        Command::Generate(args) => cli::generate::generate(&args),
        Command::Checkpoints { command } => cli::checkpoints::checkpoints(command),
        Command::Deploy { name, file, job, shadow: true, .. } => {
            cli::versions::start_trial(&name, &file, job, Trial::Shadow, None)
        }
        Command::Deploy { name, file, job, canary: Some(share), .. } => {
            cli::versions::start_trial(&name, &file, job, Trial::Canary, Some(&share))
        }
        Command::Deploy { name, file, job, .. } => cli::versions::deploy_version(&name, &file, job),
        Command::Shadow { command: ShadowCommand::Status { admin, name } } => {
            cli::versions::shadow_status(&name, &admin)
        }
        Command::Shadow { command: ShadowCommand::Promote { name, job } } => cli::versions::promote_shadow(&name, job),
        Command::Shadow { command: ShadowCommand::Stop { name, job } } => cli::versions::stop_shadow(&name, job),
        Command::Rollback { name, job } => cli::versions::roll_back(&name, job),
        Command::Versions { name, job } => cli::versions::versions(&name, job),
        Command::Status { state_dir: Some(state_dir), store, .. } => {
            cli::status::stored_status(&state_dir, store.as_deref())
        }
        Command::Status { admin, .. } => cli::status::status(&admin),
        Command::State { command: StateCommand::Dump { state_dir } } => cli::state::dump_state(&state_dir),
        Command::Test(args) => cli::test::test_operator(&args),
        Command::Replay(args) => cli::replay::replay(&args),
        Command::New { command: NewCommand::Operator { name, dir, sdk, lang } } => {
            cli::new::new_operator(&name, dir, sdk, lang.into())
        }
        // `--reference` is required: printing the reference is all the command does.
        Command::Config { .. } => cli::config::print_reference(),
    }
}

#[cfg(test)]
mod tests {
    /// A pipe is seen gone once its reader closed, not before: a broken pipe elsewhere
    /// while standard output is fine stays an error (a host whose store connection broke
    /// at its start once exited 0 with nothing said).
    #[test]
    fn a_pipe_is_gone_once_its_reader_closed() {
        let mut fds = [0; 2];
        // SAFETY: `pipe` fills the two descriptors, closed here once used.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            assert!(!super::reader_gone(fds[1]), "the reader is there");
            libc::close(fds[0]);
            assert!(super::reader_gone(fds[1]), "the reader has gone");
            libc::close(fds[1]);
        }
    }
}
