//! Following the partitions this host does not run: a thread that keeps a standby copy
//! of each up to date with the checkpoint store, round after round, and a warm-up that
//! brings every copy up to date once before the host joins its group — so the old
//! owners go on processing until this host can take over warm, as Kafka Streams'
//! warm-up replicas (KIP-441) do, without a probing rebalance.
//!
//! A copy is updated only while its partition is held for it ([`Occupancy`]): no start
//! or worker uses the partition's directories meanwhile, and a start that wants the
//! partition — or any start restoring, whose downloads go first — makes the update
//! give way between two files. A checkpoint that does not fit
//! in the disk budget left (`[checkpoint] standby_max_bytes`) is not followed; downloads
//! share the store's cap (`download_bytes_per_s`) with restores. The budget holds what
//! this host keeps of every partition it does not run, on disk: copies, next copies,
//! and the databases of partitions it ran before, which go once the copy holds the
//! newest checkpoint or where they do not fit.
//!
//! This module owns which copies are followed and when; a copy and its update are
//! [`checkpoint::standby`]'s.

use super::events::{WARMED_UP, WARMING_UP};
use super::occupancy::{Occupancy, wait_unless};
use super::setup::WorkerSetup;
use crate::checkpoint::assemble::Interrupted;
use crate::checkpoint::{bytes, standby};
use crate::checksum;
use crate::source::kafka::GroupMember;
use crate::stats::{HostStats, StandbyCopy};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Which of the partitions it does not run a host keeps standby copies of.
pub enum Followed {
    /// Every one (`[checkpoint] standby = "all"`).
    All,
    /// Those the function names, asked again at every round (`standby = N`: see
    /// [`chosen_copies`]); a copy of one it no longer names is dropped.
    Chosen(ChooseCopies),
}

/// What [`Followed::Chosen`] asks at each round: the partitions to follow.
pub type ChooseCopies = Box<dyn FnMut() -> BTreeSet<u32> + Send>;

/// The partitions host `own` keeps standby copies of when each of `partitions` is
/// followed by `copies` hosts of the group: of the `members` that do not run it (this
/// host counted, even before it joined), the `copies` that rank highest for it by
/// rendezvous hashing — a checksum of the member's name and the partition. Every host
/// reading the same description picks the same hosts, and a host joining or leaving
/// moves only the copies it ranks among the first for.
pub fn chosen_copies(own: &str, members: &[GroupMember], partitions: u32, copies: usize) -> BTreeSet<u32> {
    let mut names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
    if !names.contains(&own) {
        names.push(own);
    }
    let runs = |name: &str, p: u32| members.iter().any(|m| m.name == name && m.partitions.contains(&p));
    (0..partitions)
        .filter(|&p| {
            let mut ranked: Vec<(String, &str)> = names
                .iter()
                .filter(|name| !runs(name, p))
                .map(|&name| (checksum::of_bytes(format!("{name}\0{p}").as_bytes()), name))
                .collect();
            // Highest first; the checksum is fixed-width hex, so it orders as the number.
            ranked.sort_unstable_by(|a, b| b.cmp(a));
            ranked.iter().take(copies).any(|&(_, name)| name == own)
        })
        .collect()
}

/// How a host follows the partitions it does not run (`[checkpoint] standby`).
#[derive(Debug, Clone, Copy)]
pub struct StandbySettings {
    /// The disk the copies may take.
    pub max_bytes: u64,
    /// Between two rounds of updates.
    pub poll: Duration,
    /// The longest a starting host waits for its copies before it joins its group.
    pub warm_up: Duration,
}

/// Updates this host's standby copies.
pub(super) struct Follower {
    setup: Arc<WorkerSetup>,
    occupancy: Arc<Occupancy>,
    host: Arc<HostStats>,
    settings: StandbySettings,
    followed: Followed,
    /// The partitions whose updates failed in the latest round.
    failing: BTreeSet<u32>,
}

/// The follower's thread: stopped and waited for when dropped.
pub(super) struct Following {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Following {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().ok();
        }
    }
}

/// What one round did.
#[derive(Debug, Default)]
struct Round {
    /// Copies holding the newest checkpoint at the end.
    current: usize,
    /// Bytes downloaded.
    fetched: u64,
}

impl Follower {
    /// Follows the copies of `setup`'s partitions that `followed` names and `occupancy`
    /// says nothing holds, recording them in `host`.
    pub(super) fn new(
        setup: Arc<WorkerSetup>,
        occupancy: Arc<Occupancy>,
        host: Arc<HostStats>,
        settings: StandbySettings,
        followed: Followed,
    ) -> Self {
        Follower { setup, occupancy, host, settings, followed, failing: BTreeSet::new() }
    }

    /// Brings every copy up to date once — but not those of partitions this host's disk
    /// holds a database of: a restart within its session finds them there — logging
    /// how long it took, for at most [`StandbySettings::warm_up`]; then follows the
    /// copies on a thread of its own until the returned [`Following`] is dropped or the
    /// host stops.
    pub(super) fn warm_up_and_follow(mut self) -> std::io::Result<Following> {
        let started = Instant::now();
        let partitions = match self.followed {
            Followed::All => format!("all {} partitions", self.setup.state.partitions()),
            Followed::Chosen(_) => "the partitions chosen for this host ([checkpoint] standby)".into(),
        };
        tracing::info!(
            "{WARMING_UP}: bringing standby copies of {partitions} up to date from {} for up to {:.0}s \
             ([checkpoint] standby_warm_up), so the partitions this host is given resume from them",
            self.setup.checkpoints.as_ref().map_or("", |c| c.store.url()),
            self.settings.warm_up.as_secs_f64()
        );
        let (stopping, warm_up) = (self.setup.stopping.clone(), self.settings.warm_up);
        let out_of_time = || stopping.load(Ordering::Relaxed) || started.elapsed() > warm_up;
        let round = self.round(&out_of_time, true);
        tracing::info!(
            "{WARMED_UP} in {:.1}s: {} copies current, {} fetched{}",
            started.elapsed().as_secs_f64(),
            round.current,
            bytes(round.fetched),
            if out_of_time() { "; out of time, joining with the copies as they are" } else { "" }
        );
        self.host.record_warm_up(round.current, round.fetched, started.elapsed());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new().name("sluice-standby".into()).spawn({
            let stop = stop.clone();
            move || self.follow(&stop)
        })?;
        Ok(Following { stop, thread: Some(thread) })
    }

    /// Rounds of updates, [`StandbySettings::poll`] apart, until `stop` or the host
    /// stops.
    fn follow(mut self, stop: &AtomicBool) {
        let stopping = self.setup.stopping.clone();
        let stopped = || stop.load(Ordering::Relaxed) || stopping.load(Ordering::Relaxed);
        while !stopped() {
            let began = Instant::now();
            self.round(&stopped, false);
            wait_unless(self.settings.poll.saturating_sub(began.elapsed()), stopped);
        }
    }

    /// Updates the copy of each followed partition nothing holds (and, if `skip_local`,
    /// whose database is not on this disk), until `stop` says so; drops the database of
    /// one this host ran before once its copy is current or where it does not fit. What
    /// this host keeps of a partition no longer followed goes, but at warm-up (a restart
    /// may be given its partitions back).
    fn round(&mut self, stop: &(dyn Fn() -> bool + Sync), skip_local: bool) -> Round {
        let Some(checkpoints) = &self.setup.checkpoints else { return Round::default() };
        let state = &self.setup.state;
        let followed = match &mut self.followed {
            Followed::All => None,
            Followed::Chosen(choose) => Some(choose()),
        };
        let kept =
            |partition| self.occupancy.try_hold(partition).map_or(0, |_held| standby::kept_bytes(state, partition));
        let mut used: u64 = (0..state.partitions()).map(kept).sum();
        let mut round = Round::default();
        let progress = Arc::new(AtomicU64::new(0));
        let mut failed = Vec::new();
        for partition in 0..state.partitions() {
            if stop() {
                break;
            }
            if skip_local && state.partition_path(partition).exists() {
                continue;
            }
            let Some(_held) = self.occupancy.try_hold(partition) else { continue };
            if followed.as_ref().is_some_and(|followed| !followed.contains(&partition)) {
                if !skip_local {
                    self.unfollow(partition);
                }
                continue;
            }
            let own = standby::kept_bytes(state, partition);
            let budget = self.settings.max_bytes.saturating_sub(used.saturating_sub(own));
            // A start that wants the partition, or any start restoring: a takeover's
            // downloads go first.
            let give_way = || stop() || self.occupancy.is_wanted(partition) || self.occupancy.is_restoring();
            let update = standby::update(state, &checkpoints.store, partition, budget, &progress, &give_way);
            let updated = self.setup.runtime.block_on(update).and_then(|followed| {
                // A database this host ran the partition with serves as long as the
                // copy is behind (its files are reused), and may stay only within the
                // budget; a copy at the newest checkpoint holds what the database would.
                let current = followed.copy.is_some() && followed.lag() == Some(0);
                if current || followed.over_budget || standby::kept_bytes(state, partition) > budget {
                    standby::drop_former(state, partition)?;
                }
                Ok(followed)
            });
            match updated {
                Ok(followed) => {
                    used = used.saturating_sub(own) + standby::kept_bytes(state, partition);
                    round.fetched += followed.fetched;
                    round.current += usize::from(followed.copy.is_some() && followed.lag() == Some(0));
                    // A copy over the budget is not followed, however close it still is.
                    let lag = followed.lag().filter(|_| !followed.over_budget);
                    let copy = StandbyCopy { checkpoint: followed.copy, lag, bytes: followed.bytes };
                    self.host.record_standby(partition, copy, followed.fetched);
                    if followed.fetched > 0 {
                        tracing::debug!(
                            partition,
                            "standby copy at checkpoint {:?}: fetched {}",
                            followed.copy,
                            bytes(followed.fetched)
                        );
                    }
                    if followed.over_budget {
                        // Warned about, once a minute, as a copy behind (see `warnings`).
                        tracing::debug!(
                            partition,
                            "standby copy not followed: its newest checkpoint does not fit in the {} left of \
                             [checkpoint] standby_max_bytes",
                            bytes(budget)
                        );
                    }
                }
                Err(e) if e.is::<Interrupted>() => {}
                // The owner's garbage collection may have deleted a file mid-build: the
                // next round starts from the newest checkpoint.
                Err(e) => {
                    let checkpoint = standby::recorded(state, partition).map(|m| m.id);
                    let bytes = standby::recorded(state, partition).map_or(0, |m| m.bytes());
                    self.host.record_standby(partition, StandbyCopy { checkpoint, lag: None, bytes }, 0);
                    failed.push((partition, e));
                }
            }
        }
        self.log_failures(failed);
        round
    }

    /// Drops what this host keeps of `partition`, which it no longer follows nor runs
    /// (the caller holds it): its copy and the database it ran it with.
    fn unfollow(&self, partition: u32) {
        let state = &self.setup.state;
        if standby::recorded(state, partition).is_some() || state.partition_path(partition).exists() {
            let dropped = standby::discard(state, partition).and_then(|()| standby::drop_former(state, partition));
            match dropped {
                Ok(()) => tracing::info!(partition, "standby copy dropped: another host keeps this partition's now"),
                Err(e) => tracing::warn!(partition, "dropping the standby copy no longer followed: {e:#}"),
            }
        }
        self.host.forget_standby(partition);
    }

    /// Logs the partitions whose copies a round failed to update, with the first error:
    /// at info when they are not the ones the round before logged, else at debug — a
    /// store down for an hour is one line, and the `standby copies behind` warning.
    fn log_failures(&mut self, failed: Vec<(u32, anyhow::Error)>) {
        let partitions: BTreeSet<u32> = failed.iter().map(|(p, _)| *p).collect();
        if let Some((_, first)) = failed.first() {
            let message =
                format!("standby copies of partitions {partitions:?} not brought up to date this round: {first:#}");
            match self.failing == partitions {
                true => tracing::debug!("{message}"),
                false => tracing::info!("{message}"),
            }
        }
        self.failing = partitions;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn member(name: &str, partitions: impl IntoIterator<Item = u32>) -> GroupMember {
        GroupMember { name: name.into(), partitions: partitions.into_iter().collect() }
    }

    /// The copies of every host of a group, by host.
    fn copies(members: &[GroupMember], partitions: u32, n: usize) -> BTreeMap<String, BTreeSet<u32>> {
        members.iter().map(|m| (m.name.clone(), chosen_copies(&m.name, members, partitions, n))).collect()
    }

    /// Each partition is followed by exactly N hosts, never its owner; a host not yet
    /// in the description picks as it will once it is; a host joining or leaving moves
    /// only the copies it takes or held.
    #[test]
    fn each_partition_is_followed_by_n_hosts_other_than_its_owner() {
        let hosts: Vec<GroupMember> = (0..10u32).map(|h| member(&format!("host-{h}"), [h * 2, h * 2 + 1])).collect();
        for n in [1, 2, 3] {
            let chosen = copies(&hosts, 20, n);
            for p in 0..20 {
                let followers: Vec<&String> = chosen.iter().filter(|(_, c)| c.contains(&p)).map(|(h, _)| h).collect();
                assert_eq!(followers.len(), n, "partition {p} with standby = {n}: {followers:?}");
                let owner = hosts.iter().find(|m| m.partitions.contains(&p)).expect("owned");
                assert!(!followers.contains(&&owner.name), "partition {p} is followed by its owner");
            }
            // The load spreads: no host follows more than a third of the partitions.
            assert!(chosen.values().all(|c| c.len() <= 20 / 3 + n), "{chosen:?}");
        }
        // A host about to join picks what it will hold once the description lists it.
        let (joining, others) = hosts.split_last().expect("hosts");
        let listed = chosen_copies(&joining.name, &hosts, 20, 1);
        let before = chosen_copies(&joining.name, others, 20, 1);
        let runs = &joining.partitions;
        assert_eq!(
            before.difference(runs).copied().collect::<BTreeSet<u32>>(),
            listed,
            "{before:?} against {listed:?}"
        );
        // One host leaving (its partitions not yet reassigned) moves only its own copies.
        let after = copies(others, 20, 1);
        let with_all = copies(&hosts, 20, 1);
        for (host, copies) in &after {
            assert!(with_all[host].is_subset(copies), "{host} kept {:?}, now {copies:?}", with_all[host]);
        }
    }
}
