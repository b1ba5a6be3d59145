//! What the host reads of the machine's clocks and of its own process: the wall clock
//! ([`now_ms`]), a thread's CPU time ([`thread_cpu`]), the process's CPU time over every
//! thread ([`process_cpu`]) and its peak resident memory ([`peak_rss`]). A leaf: it reads,
//! keeps nothing and imports nothing of the host.

use std::time::Duration;

/// The wall clock, ms since the Unix epoch.
pub fn now_ms() -> u64 {
    crate::millis(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default())
}

/// The CPU time the calling thread has used (a system call: worth it per batch, not
/// per record).
pub fn thread_cpu() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec for the call to write; the clock exists on
    // every Linux.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(status, 0, "reading the thread's CPU clock");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// User plus system CPU time of the whole process so far — every thread, RocksDB's
/// background work included — from `/proc/self/stat`, in clock ticks of 10 ms (Linux's
/// `USER_HZ`, 100 on every architecture it runs on); `None` where that is unreadable.
pub fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (which may hold spaces and parentheses) start
    // with the state, field 3; utime and stime are fields 14 and 15.
    let mut fields = stat[stat.rfind(')')? + 2..].split_whitespace().skip(11);
    let mut ticks = || fields.next()?.parse::<u64>().ok();
    Some(Duration::from_millis((ticks()? + ticks()?) * 10))
}

/// The most memory the process has held resident so far (`VmHWM` in
/// `/proc/self/status`); `None` where that is unreadable.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status.lines().find_map(|line| line.strip_prefix("VmHWM:"))?.trim().strip_suffix("kB")?;
    Some(kib.trim().parse::<u64>().ok()? << 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probes read this process: CPU time grows with work done on this thread, and
    /// the peak memory covers what was touched.
    #[test]
    fn the_probes_read_this_process() {
        let (thread, process) = (thread_cpu(), process_cpu().expect("/proc/self/stat on Linux"));
        let mut touched = vec![1u8; 64 << 20];
        let began = std::time::Instant::now();
        while began.elapsed() < Duration::from_millis(50) {
            touched.iter_mut().step_by(4096).for_each(|b| *b = b.wrapping_add(1));
        }
        assert!(thread_cpu() > thread, "this thread's CPU time grew");
        assert!(process_cpu().expect("readable") >= process);
        assert!(peak_rss().expect("/proc/self/status on Linux") >= 64 << 20, "the peak holds the touched 64 MiB");
        assert!(now_ms() > 1_700_000_000_000, "ms since the epoch");
        drop(touched);
    }
}
