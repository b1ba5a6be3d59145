//! Checkpoints and restore through the real binary and a local checkpoint store:
//! a wiped state directory restores from the store, `kill -9` during an upload
//! leaves the last complete checkpoint usable, a corrupt and a missing file are named
//! and fallen back past, a local file damaged since it was trusted is fetched again, checkpoints upload only what changed, retention leaves
//! exactly the referenced files, and a host whose partitions another host claimed
//! changes nothing in the store; `sluice status`, `state dump` and `checkpoints` read a
//! stopped job's state and store and write nothing. (Expiries through a restore:
//! [`crate::state_ttl`].)

use anyhow::Result;
use serde_json::Value;
use sluice::events::{CLAIMED_ELSEWHERE, LOCAL_FILES_CORRUPT, LOCAL_MOVED_ASIDE, NO_RESTORE_HISTORY};
use sluice_e2e::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SEED: u64 = 11;

/// The final state in `dir/state` equals the reference fold of the first `count`
/// generator records.
fn assert_state_is_fold(dir: &Path, vehicles: u32, count: u64, context: &str) -> Result<()> {
    let input = dir.join(format!("input-{count}.jsonl"));
    generate(&input, vehicles, count, SEED)?;
    assert_state_matches(&dump_state(&dir.join("state"))?, &Reference::fold(&input)?, context);
    Ok(())
}

pub(crate) fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn with_config(command: &mut Command, dir: &Path, toml: &str) -> Result<()> {
    let path = dir.join("sluice.toml");
    std::fs::write(&path, format!("[operator]\npath = \"unused.wasm\"\n{toml}"))?;
    // The flags given by run_generator_job override the file's operator and paths.
    command.arg("--config").arg(path);
    Ok(())
}

/// A generator job whose only checkpoint is the one every job takes at its end.
pub(crate) fn checkpoint_at_end(dir: &Path, vehicles: u32, count: u64, partitions: u32) -> Command {
    let mut command = run_generator_job(dir, vehicles, count, SEED, partitions);
    command.args(["--checkpoint-interval", "3600"]);
    command
}

#[test]
fn a_wiped_state_directory_is_restored_from_the_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (dir, store) = (dir.path(), dir.path().join("state.checkpoints"));
    let job = |count| checkpoint_at_end(dir, 500, count, 4);
    run_ok(&mut job(20_000))?;
    let offsets: Vec<u64> = (0..4)
        .map(|p| checkpoint_manifests(&store, p).map(|m| m.last().unwrap()["offset"].as_u64().unwrap()))
        .collect::<Result<_>>()?;
    assert_eq!(offsets.iter().sum::<u64>(), 20_000, "the last checkpoints hold every record: {offsets:?}");

    std::fs::remove_dir_all(dir.join("state"))?;
    let estimate = run_ok(
        sluice().args(["checkpoints", "estimate", "--store"]).arg(&store).arg("--state-dir").arg(dir.join("state")),
    )?;
    let estimate = String::from_utf8(estimate.stdout)?;
    assert!(estimate.contains("partition 0: local state none; restore checkpoint"), "{estimate}");
    assert!(estimate.contains("predicted restore time"), "{estimate}");
    assert!(estimate.contains("assumed; no restore from this store measured yet"), "{estimate}");

    let before = read_jsonl(&dir.join("out.jsonl"))?.len();
    let mut restoring = job(30_000);
    with_config(&mut restoring, dir, "[checkpoint]\nrestore_budget_s = 0\n")?;
    let run = run_ok(&mut restoring)?;
    let report = stderr(&run);
    assert!(report.contains("exceeds the restore budget of 0.0s"), "the over-budget warning:\n{report}");
    assert!(report.contains("restore took"), "{report}");
    assert_eq!(report.matches("checkpoint 1@").count(), 4, "every partition restored its checkpoint:\n{report}");
    assert!(report.contains("20000 records skipped"), "restored offsets skip what the state holds:\n{report}");
    assert_eq!(read_jsonl(&dir.join("out.jsonl"))?.len() - before, 10_000, "only new records were processed");
    assert_state_is_fold(dir, 500, 30_000, "after a restore from the store")?;

    // The same store, the local state intact: local recovery, nothing fetched.
    let run = run_ok(&mut job(30_000))?;
    assert_eq!(stderr(&run).matches("local@").count(), 4, "{}", stderr(&run));
    let estimate = run_ok(
        sluice().args(["checkpoints", "estimate", "--store"]).arg(&store).arg("--state-dir").arg(dir.join("state")),
    )?;
    assert!(String::from_utf8(estimate.stdout)?.contains("local recovery, nothing to fetch"));

    // Twice wiped: restores the newest checkpoint again, processes nothing; the estimate
    // now rests on the bandwidth measured by the first restore.
    std::fs::remove_dir_all(dir.join("state"))?;
    let estimate = run_ok(sluice().args(["checkpoints", "estimate", "--store"]).arg(&store))?;
    assert!(String::from_utf8(estimate.stdout)?.contains("(measured on earlier restores)"));
    let run = run_ok(&mut job(30_000))?;
    assert!(stderr(&run).contains("processed 0 records"), "{}", stderr(&run));
    assert_state_is_fold(dir, 500, 30_000, "after a second restore")?;

    // Restore statistics are best effort: with the store's history neither readable nor
    // writable (a directory where the file should be), the restore still happens.
    std::fs::remove_dir_all(dir.join("state"))?;
    let history = store.join("restores.json");
    std::fs::remove_file(&history)?;
    std::fs::create_dir(&history)?;
    let run = run_ok(job(30_000).env("SLUICE_LOG", "warn"))?;
    let unrecorded = format!("{NO_RESTORE_HISTORY}: recording this one failed");
    assert!(stderr(&run).contains(&unrecorded), "{}", stderr(&run));
    assert!(stderr(&run).contains("30000 records skipped"), "restored: {}", stderr(&run));
    assert_state_is_fold(dir, 500, 30_000, "after a restore without statistics")?;

    // A history crafted by someone with write access to the store (times no restore
    // measures, sums past u64, a bandwidth that predicts past any duration) informs
    // no prediction it cannot make: the estimate is given, nothing panics.
    std::fs::remove_dir_all(&history)?;
    std::fs::remove_dir_all(dir.join("state"))?;
    for (samples, basis) in [
        (r#"[{"bytes":1,"seconds":-1e308},{"bytes":5,"seconds":0}]"#, "assumed; no restore"),
        (r#"[{"bytes":18446744073709551615,"seconds":1},{"bytes":18446744073709551615,"seconds":1}]"#, "measured"),
        (r#"[{"bytes":1,"seconds":1e308},{"bytes":1,"seconds":1e308}]"#, "assumed; no restore"),
        (r#"[{"bytes":1,"seconds":1e300}]"#, "measured"),
        (r#"[{"bytes":0,"seconds":1}]"#, "assumed; no restore"),
    ] {
        std::fs::write(&history, format!(r#"{{"samples":{samples}}}"#))?;
        let estimate = run_ok(sluice().args(["checkpoints", "estimate", "--store"]).arg(&store))?;
        let estimate = String::from_utf8(estimate.stdout)?;
        assert!(estimate.contains("predicted restore time") && estimate.contains(basis), "{samples}: {estimate}");
    }
    Ok(())
}

/// A local database RocksDB finds corrupt does not stop the start while the store has
/// checkpoints: it is moved aside, kept as it was, and the newest checkpoint takes its
/// place; the other partition recovers locally.
#[test]
fn a_corrupt_local_database_is_moved_aside_and_restored_from_the_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let job = |count| checkpoint_at_end(dir, 200, count, 2);
    run_ok(&mut job(5_000))?;
    std::fs::write(dir.join("state/partition-0001/CURRENT"), "garbage")?;
    let run = run_ok(&mut job(5_000))?;
    assert!(stderr(&run).contains(LOCAL_MOVED_ASIDE), "{}", stderr(&run));
    assert!(stderr(&run).contains("processed 0 records"), "{}", stderr(&run));
    let aside: Vec<PathBuf> = std::fs::read_dir(dir.join("state"))?
        .map(|entry| entry.map(|e| e.path()))
        .filter(|path| path.as_ref().map_or(true, |p| p.to_string_lossy().contains("partition-0001.unreadable-")))
        .collect::<std::io::Result<_>>()?;
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read_to_string(aside[0].join("CURRENT"))?, "garbage", "kept as it was");
    assert_state_is_fold(dir, 200, 5_000, "after the corrupt database was replaced")
}

/// A table file of the local database damaged in place — its size, inode and time
/// unchanged, as bit rot leaves them — is trusted by the checksum this host recorded
/// when it uploaded it, so the checkpoint built from it does not open: the build goes
/// again reading every local file, fetches the damaged one alone, and the start goes
/// on, instead of failing every checkpoint that lists the file and the host with them.
#[test]
fn a_local_file_damaged_since_its_checksum_was_recorded_is_read_and_fetched_again() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let job = |count| checkpoint_at_end(dir, 2_000, count, 1);
    run_ok(&mut job(20_000))?;
    let db = dir.join("state/partition-0000");
    let mut tables: Vec<(u64, PathBuf)> = std::fs::read_dir(&db)?
        .map(|entry| entry.map(|e| e.path()))
        .filter(|path| path.as_ref().map_or(true, |p| p.extension().is_some_and(|e| e == "sst")))
        .map(|path| path.and_then(|p| Ok((std::fs::metadata(&p)?.len(), p))))
        .collect::<std::io::Result<_>>()?;
    tables.sort();
    let (size, damaged) = tables.pop().expect("the checkpoint flushed a table file");
    let file = std::fs::OpenOptions::new().write(true).open(&damaged)?;
    let modified = file.metadata()?.modified()?;
    std::io::Write::write_all(&mut &file, &vec![0; size as usize])?;
    file.set_modified(modified)?;
    drop(file);

    let run = run_ok(&mut job(20_000))?;
    let report = stderr(&run);
    assert!(report.contains(LOCAL_MOVED_ASIDE), "the damaged database is kept aside:\n{report}");
    assert!(report.contains(LOCAL_FILES_CORRUPT), "{report}");
    let (_, fetched, bytes) = reported_restores(&report).pop().expect("the partition restored");
    assert_eq!(fetched, size, "only the damaged file is fetched, of {bytes} B:\n{report}");
    assert!(report.contains("processed 0 records"), "{report}");
    assert_state_is_fold(dir, 2_000, 20_000, "after the damaged file was fetched again")
}

#[test]
fn an_s3_store_checkpoints_and_restores_the_same_way() -> Result<()> {
    let s3 = S3Server::start()?;
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let job = |count| {
        let mut command = run_generator_job(dir, 300, count, SEED, 2);
        command.args(["--checkpoint-store", "s3://sluice/jobs/vehicles", "--checkpoint-interval", "3600"]);
        s3.configure(&mut command);
        command
    };
    run_ok(&mut job(8_000))?;
    let objects = s3.bucket_dir.join("jobs/vehicles");
    assert!(objects.join("sluice-checkpoints.json").exists(), "the store lives under the prefix");
    assert_eq!(checkpoint_manifests(&objects, 1)?.len(), 1);

    std::fs::remove_dir_all(dir.join("state"))?;
    let run = run_ok(&mut job(12_000))?;
    assert_eq!(stderr(&run).matches("checkpoint 1@").count(), 2, "{}", stderr(&run));
    assert_state_is_fold(dir, 300, 12_000, "after a restore from S3")?;

    let mut list = sluice();
    s3.configure(list.args(["checkpoints", "list", "--store", "s3://sluice/jobs/vehicles"]));
    let list = String::from_utf8(run_ok(&mut list)?.stdout)?;
    assert_eq!(list.lines().count(), 1 + 4, "checkpoints 1 and 2 of both partitions:\n{list}");
    Ok(())
}

#[test]
fn kill_9_during_an_upload_leaves_the_last_complete_checkpoint() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (dir, store) = (dir.path(), dir.path().join("state.checkpoints"));
    let (vehicles, count) = (3_000, 200_000);
    let mut command = run_generator_job(dir, vehicles, count, SEED, 2);
    with_config(&mut command, dir, "[checkpoint]\ninterval_s = 0.3\nupload_bytes_per_s = 100000\n")?;
    let mut child = command.args(["--rate", "6000"]).stderr(Stdio::null()).spawn()?;

    // Kill once a partition has a complete checkpoint and the next one is part-way up:
    // files in the store that no manifest lists yet.
    let started = Instant::now();
    let in_flight = loop {
        assert!(child.try_wait()?.is_none(), "the run ended before an upload could be interrupted");
        assert!(started.elapsed() < Duration::from_secs(60), "no upload was ever caught in flight");
        let mut in_flight = Vec::new();
        for partition in 0..2 {
            let manifests = checkpoint_manifests(&store, partition).unwrap_or_default();
            let listed: BTreeSet<String> = manifests.iter().flat_map(manifest_objects).collect();
            let files = checkpoint_files(&store, partition)?;
            let unlisted: Vec<String> = files.into_keys().filter(|f| !listed.contains(f)).collect();
            if !manifests.is_empty() && !unlisted.is_empty() {
                in_flight.push((partition, manifests.last().unwrap()["id"].as_u64().unwrap(), unlisted));
            }
        }
        if !in_flight.is_empty() {
            break in_flight;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    child.kill()?;
    child.wait()?;

    let (partition, last_complete, unlisted) = &in_flight[0];
    let after_kill = checkpoint_manifests(&store, *partition)?;
    let listed: BTreeSet<String> = after_kill.iter().flat_map(manifest_objects).collect();
    assert!(unlisted.iter().any(|f| !listed.contains(f)), "the kill did interrupt an upload: {unlisted:?}");
    let newest = after_kill.last().unwrap()["id"].as_u64().unwrap();
    assert!(newest >= *last_complete, "complete checkpoints survive the kill");

    // Lose the disk: the restart must come from the store.
    std::fs::remove_dir_all(dir.join("state"))?;
    let mut command = run_generator_job(dir, vehicles, count, SEED, 2);
    with_config(&mut command, dir, "[checkpoint]\ninterval_s = 0.3\n")?;
    let run = run_ok(&mut command)?;
    assert!(
        stderr(&run).contains(&format!("checkpoint {newest}@")),
        "restored the last complete checkpoint:\n{}",
        stderr(&run)
    );
    assert_state_is_fold(dir, vehicles, count, "after kill -9 mid-upload and a restore")?;

    // The interrupted upload's files (complete ones and a part-written one, if the kill
    // hit a write) were collected by the next checkpoints.
    let listed: BTreeSet<String> =
        checkpoint_manifests(&store, *partition)?.iter().flat_map(manifest_objects).collect();
    let files: BTreeSet<String> = checkpoint_files(&store, *partition)?.into_keys().collect();
    assert_eq!(files, listed, "no leftovers from the killed upload");
    Ok(())
}

#[test]
fn a_corrupt_and_a_missing_file_are_named_and_skipped() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (dir, store) = (dir.path(), dir.path().join("state.checkpoints"));
    // Three runs, each ending in a checkpoint that adds one new table file.
    for count in [10_000, 20_000, 30_000] {
        run_ok(&mut checkpoint_at_end(dir, 400, count, 1))?;
    }
    let manifests = checkpoint_manifests(&store, 0)?;
    assert_eq!(manifests.len(), 3);
    let tables =
        |m: &Value| -> BTreeSet<String> { manifest_objects(m).into_iter().filter(|f| f.contains(".sst.")).collect() };
    let newest_only =
        tables(&manifests[2]).difference(&tables(&manifests[1])).next().cloned().expect("checkpoint 3 adds a table");
    let second_only =
        tables(&manifests[1]).difference(&tables(&manifests[0])).next().cloned().expect("checkpoint 2 adds a table");
    let files = store.join("partition-0000").join("files");
    let mut bytes = std::fs::read(files.join(&newest_only))?;
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(files.join(&newest_only), bytes)?;
    std::fs::remove_file(files.join(&second_only))?;

    let verify = run_err(sluice().args(["checkpoints", "verify", "--partition", "0", "--store"]).arg(&store))?;
    // Checkpoint 3 lists both broken files (the second run's table is still live in it).
    assert!(verify.contains("checkpoint 3 of partition 0: 2 of"), "{verify}");
    let verify_out = sluice()
        .args(["checkpoints", "verify", "--partition", "0", "--checkpoint", "1", "--store"])
        .arg(&store)
        .output()?;
    assert!(verify_out.status.success(), "checkpoint 1 is intact: {}", String::from_utf8_lossy(&verify_out.stdout));

    std::fs::remove_dir_all(dir.join("state"))?;
    let mut command = checkpoint_at_end(dir, 400, 30_000, 1);
    command.env("SLUICE_LOG", "error");
    let run = run_ok(&mut command)?;
    let log = stderr(&run);
    let corrupt_name = newest_only.split(".sst.").next().unwrap();
    let missing_name = second_only.split(".sst.").next().unwrap();
    let failure = |id: u64| {
        log.lines()
            .find(|l| l.contains(&format!("checkpoint {id} (offset {}) cannot be restored", id * 10_000)))
            .unwrap_or_default()
    };
    assert!(failure(3).contains(&format!("file `{corrupt_name}.sst` is corrupt")), "{log}");
    assert!(failure(3).contains(&format!("file `{missing_name}.sst` is missing")), "{log}");
    assert!(failure(2).contains(&format!("file `{missing_name}.sst` is missing")), "{log}");
    assert!(!failure(2).contains(&format!("file `{corrupt_name}.sst`")), "{log}");
    assert!(log.contains("checkpoint 1@10000"), "fell back to checkpoint 1:\n{log}");
    assert_state_is_fold(dir, 400, 30_000, "after falling back to checkpoint 1")?;
    Ok(())
}

/// An object of the store too large to be a record sluice wrote — a manifest of 4 GiB
/// (sparse: it costs the disk nothing) — is named and skipped without being read: the
/// restore falls back to the checkpoint before it.
#[test]
fn an_oversized_manifest_is_named_and_skipped_unread() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (dir, store) = (dir.path(), dir.path().join("state.checkpoints"));
    for count in [10_000, 20_000] {
        run_ok(&mut checkpoint_at_end(dir, 400, count, 1))?;
    }
    let manifest = store.join("partition-0000/manifests/0000000002.json");
    std::fs::File::options().write(true).open(&manifest)?.set_len(4 << 30)?;
    std::fs::remove_dir_all(dir.join("state"))?;
    let mut command = checkpoint_at_end(dir, 400, 20_000, 1);
    let run = run_ok(command.env("SLUICE_LOG", "info"))?;
    let log = stderr(&run);
    let refused = format!("manifests/0000000002.json in checkpoint store {} takes 4294967296 bytes", store.display());
    assert!(log.contains("unreadable checkpoint: checkpoint 2") && log.contains(&refused), "{log}");
    assert!(log.contains("checkpoint 1@10000"), "fell back to checkpoint 1:\n{log}");
    assert_state_is_fold(dir, 400, 20_000, "after skipping the oversized manifest")
}

#[test]
fn a_small_change_uploads_a_small_fraction_of_the_state() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (dir, store) = (dir.path(), dir.path().join("state.checkpoints"));
    // Only the checkpoint at the end of each run: one snapshot of 60,000 records, then
    // one after 200 more.
    let job = |count| checkpoint_at_end(dir, 20_000, count, 1);
    run_ok(&mut job(60_000))?;
    let before = checkpoint_files(&store, 0)?;
    run_ok(&mut job(60_200))?;
    let last = checkpoint_manifests(&store, 0)?.pop().unwrap();
    let total = manifest_bytes(&last);
    let uploaded = last["uploaded_bytes"].as_u64().unwrap();
    // What the store gained is exactly what the manifest says it uploaded.
    let gained: u64 =
        checkpoint_files(&store, 0)?.iter().filter(|(f, _)| !before.contains_key(*f)).map(|(_, s)| s).sum();
    assert_eq!(gained, uploaded);
    assert!(total > 500_000, "state is large enough to tell: {total} bytes");
    assert!(uploaded * 10 < total, "200 more records uploaded {uploaded} of {total} bytes");
    eprintln!(
        "incremental checkpoint: uploaded {uploaded} of {total} bytes ({:.1}%)",
        100.0 * uploaded as f64 / total as f64
    );
    Ok(())
}

/// A host whose copy of a partition is a few hundred records behind the store's newest
/// checkpoint (it owned the partition before) restores incrementally: it fetches the
/// files it lacks, not the state — what the estimate predicted — and ends equal to the
/// fold, having processed nothing twice.
#[test]
fn a_stale_local_copy_fetches_only_the_files_it_lacks() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (dir, store) = (dir.path(), dir.path().join("state.checkpoints"));
    let job = |count| checkpoint_at_end(dir, 20_000, count, 1);
    run_ok(&mut job(60_000))?;
    let stale = dir.join("stale");
    run_ok(Command::new("cp").arg("-a").arg(dir.join("state")).arg(&stale))?;
    run_ok(&mut job(60_200))?;
    let total = newest_checkpoint_bytes(&store, 0)?;
    std::fs::remove_dir_all(dir.join("state"))?;
    std::fs::rename(&stale, dir.join("state"))?;

    let estimate = run_ok(
        sluice().args(["checkpoints", "estimate", "--store"]).arg(&store).arg("--state-dir").arg(dir.join("state")),
    )?;
    let estimate = String::from_utf8(estimate.stdout)?;
    assert!(estimate.contains("partition 0: local state offset 60000; restore checkpoint 2"), "{estimate}");
    let run = run_ok(&mut job(60_200))?;
    let report = stderr(&run);
    let (path, fetched, bytes) = reported_restores(&report).pop().expect("one partition restored");
    assert_eq!((path.as_str(), bytes), ("incremental", total), "{report}");
    assert!(fetched * 10 < total, "fetched {fetched} of {total} bytes:\n{report}");
    assert!(report.contains("processed 0 records"), "{report}");
    assert_state_is_fold(dir, 20_000, 60_200, "after an incremental restore")?;
    eprintln!("stale local copy: fetched {fetched} of {total} bytes ({:.1}%)", 100.0 * fetched as f64 / total as f64);
    Ok(())
}

/// `[checkpoint] download_bytes_per_s` holds a restore's downloads to the cap.
#[test]
fn a_restore_keeps_to_the_download_cap() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let job = |count| checkpoint_at_end(dir, 20_000, count, 1);
    run_ok(&mut job(40_000))?;
    std::fs::remove_dir_all(dir.join("state"))?;
    const CAP: f64 = 500_000.0;
    let mut capped = job(40_000);
    with_config(&mut capped, dir, &format!("[checkpoint]\ndownload_bytes_per_s = {CAP}\n"))?;
    let report = stderr(&run_ok(&mut capped)?);
    let (_, fetched, _) = reported_restores(&report).pop().expect("restored from the store");
    // The whole restore (plan, downloads, verification): a little longer than its downloads.
    let took: f64 = report
        .lines()
        .find_map(|l| l.strip_prefix("restore took ")?.split_once('s')?.0.parse().ok())
        .unwrap_or_else(|| panic!("the restore's duration is reported:\n{report}"));
    let rate = fetched as f64 / took;
    assert!(fetched > 1_000_000, "{fetched} bytes:\n{report}");
    assert!((CAP / 2.0..=CAP * 1.05).contains(&rate), "{fetched} bytes in {took}s: {rate:.0} B/s\n{report}");
    eprintln!("restore under a cap of {CAP} B/s: {fetched} bytes in {took:.2}s ({rate:.0} B/s)");
    Ok(())
}

/// A host that keeps no standby copies removes those an earlier run left: no one would
/// bring them up to date. (With checkpoints off, no restore would discard them either.)
#[test]
fn copies_no_one_follows_are_removed() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let job = || -> Result<Command> {
        let mut job = checkpoint_at_end(dir, 100, 1_000, 2);
        with_config(&mut job, dir, "[checkpoint]\nenabled = false\n")?;
        Ok(job)
    };
    run_ok(&mut job()?)?;
    let copy = dir.join("state/standby/partition-0001");
    std::fs::create_dir_all(&copy)?;
    std::fs::write(copy.join("000009.sst"), b"left by a Kafka host")?;
    run_ok(&mut job()?)?;
    assert!(!copy.exists(), "the copy is gone");
    Ok(())
}

#[test]
fn retention_keeps_the_newest_checkpoints_and_exactly_their_files() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (dir, store) = (dir.path(), dir.path().join("state.checkpoints"));
    let mut command = run_generator_job(dir, 2_000, 30_000, SEED, 2);
    with_config(&mut command, dir, "[checkpoint]\ninterval_s = 0.05\nretain = 2\n")?;
    let run = run_ok(command.args(["--rate", "20000"]))?;
    for partition in 0..2 {
        let manifests = checkpoint_manifests(&store, partition)?;
        let ids: Vec<u64> = manifests.iter().map(|m| m["id"].as_u64().unwrap()).collect();
        assert_eq!(ids.len(), 2, "partition {partition} keeps two checkpoints: {ids:?}");
        assert!(ids[1] >= 5, "partition {partition} took many checkpoints ({ids:?})\n{}", stderr(&run));
        assert_eq!(ids[0] + 1, ids[1], "the two newest are kept");
        let referenced: BTreeSet<String> = manifests.iter().flat_map(manifest_objects).collect();
        let stored: BTreeSet<String> = checkpoint_files(&store, partition)?.into_keys().collect();
        assert_eq!(stored, referenced, "partition {partition}: the store holds exactly the referenced files");
    }
    let list = run_ok(sluice().args(["checkpoints", "list", "--store"]).arg(&store))?;
    let list = String::from_utf8(list.stdout)?;
    assert_eq!(list.lines().count(), 1 + 4, "a header and two checkpoints per partition:\n{list}");
    assert!(list.contains("vehicle_stats@"), "{list}");
    // `sluice checkpoints list | head -1`: the reader gone, the command ends quietly.
    for command in [&["list"][..], &["verify", "--partition", "0"], &["estimate"]] {
        run_into_closed_pipe(sluice().arg("checkpoints").args(command).arg("--store").arg(&store))?;
    }
    Ok(())
}

#[test]
fn a_store_of_another_partition_count_or_job_is_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    run_ok(&mut run_generator_job(dir, 100, 1_000, SEED, 2))?;
    std::fs::remove_dir_all(dir.join("state"))?;
    let err = run_err(&mut run_generator_job(dir, 100, 1_000, SEED, 3))?;
    assert!(err.contains("holds 2 partitions but the job asks for 3"), "{err}");
    assert!(!dir.join("state").exists(), "refused before a state directory was made for 3 partitions");

    // Another job (another operator) with the same partition count: refused, the
    // store's checkpoints untouched, where it once restored the first job's state.
    // (Its operator's registry entry is written before: the component is checked first.)
    let manifests = checkpoint_manifests(&dir.join("state.checkpoints"), 0)?;
    let mut other_job = run_generator_job(dir, 100, 1_000, SEED, 2);
    with_config(&mut other_job, dir, "name = \"another_operator\"\n")?;
    let err = run_err(&mut other_job)?;
    assert!(
        err.contains("belongs to another job (operator vehicle_stats), not this one (operator another_operator)"),
        "{err}"
    );
    assert_eq!(checkpoint_manifests(&dir.join("state.checkpoints"), 0)?, manifests);

    // Checkpoints off: no store is touched.
    let other = dir.join("off");
    std::fs::create_dir(&other)?;
    run_ok(run_generator_job(&other, 100, 1_000, SEED, 2).arg("--no-checkpoints"))?;
    assert!(!other.join("state.checkpoints").exists());
    Ok(())
}

/// Host `a` still runs a job when host `b` takes its partitions (as after an eviction
/// `a` has not noticed yet) and restores them from the shared store: from `b`'s claim
/// on, `a` writes no checkpoint and deletes nothing there, stops processing the
/// partitions at its next checkpoint (it emits nothing more), and says so; every
/// checkpoint left in the store can be restored.
#[test]
fn a_host_whose_partitions_were_claimed_by_another_stops_writing_to_the_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (dir, store) = (dir.path(), dir.path().join("store"));
    let host = |name: &str, count: u64| -> Result<Command> {
        let home = dir.join(name);
        std::fs::create_dir_all(&home)?;
        let mut command = run_generator_job(&home, 200, count, SEED, 2);
        command.arg("--checkpoint-store").arg(&store);
        with_config(&mut command, &home, "[checkpoint]\ninterval = \"200ms\"\nretain = 1\n")?;
        Ok(command)
    };
    let mut a = Host::spawn("a", host("a", 10_000_000)?.args(["--rate", "2000"]), &dir.join("a.log"))?;
    let started = Instant::now();
    while (0..2).any(|p| checkpoint_manifests(&store, p).is_ok_and(|m| m.is_empty())) {
        assert!(started.elapsed() < Duration::from_secs(60), "a took no checkpoint:\n{}", a.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    run_ok(&mut host("b", 1_000)?)?;
    a.wait_for(CLAIMED_ELSEWHERE, 2, Duration::from_secs(60))?;
    let manifests: Vec<Vec<Value>> = (0..2).map(|p| checkpoint_manifests(&store, p)).collect::<Result<_>>()?;
    std::thread::sleep(Duration::from_secs(1));
    let emitted = read_jsonl(&dir.join("a/out.jsonl"))?.len();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(read_jsonl(&dir.join("a/out.jsonl"))?.len(), emitted, "a still processes partitions b took");
    a.kill_9()?;
    let log = std::fs::read_to_string(dir.join("a.log"))?;
    assert!(log.contains("no longer owns it"), "{log}");
    for p in 0..2 {
        assert!(log.contains(&format!("partition {p} was claimed by host")), "{log}");
    }
    for p in 0..2 {
        assert_eq!(checkpoint_manifests(&store, p)?, manifests[p as usize], "partition {p}: a wrote or deleted one");
        let stored = checkpoint_files(&store, p)?;
        for manifest in &manifests[p as usize] {
            let missing: Vec<String> =
                manifest_objects(manifest).into_iter().filter(|o| !stored.contains_key(o)).collect();
            assert!(missing.is_empty(), "partition {p}: checkpoint {} lost {missing:?}", manifest["id"]);
        }
    }
    run_ok(&mut host("c", 1_000)?)?;
    Ok(())
}

/// `sluice status --state-dir --store` of a job that ended: each partition's offset and
/// entries as its state holds them, and its newest checkpoint, which holds the same
/// offset.
#[test]
fn status_of_a_stopped_job_reads_its_state_and_its_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (dir, store) = (dir.path(), dir.path().join("state.checkpoints"));
    run_ok(&mut checkpoint_at_end(dir, 200, 5_000, 3))?;
    let status = run_ok(sluice().arg("status").arg("--state-dir").arg(dir.join("state")).arg("--store").arg(&store))?;
    let status = String::from_utf8(status.stdout)?;
    let rows: Vec<Vec<&str>> = status.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    let offsets = stored_offsets(&dir.join("state"), 3)?;
    assert_eq!(rows.len(), 3, "{status}");
    for (p, row) in rows.iter().enumerate() {
        let offset = offsets[p].to_string();
        assert_eq!(row[..2], [p.to_string().as_str(), offset.as_str()], "{status}");
        assert!(row.windows(3).any(|w| w[..2] == ["at", "offset"] && w[2] == format!("{offset},")), "{status}");
    }
    let entries: u64 = rows.iter().map(|row| row[2].parse::<u64>().unwrap_or(0)).sum();
    assert_eq!(entries, 200, "one entry per vehicle:\n{status}");
    Ok(())
}

/// The commands that read a stopped job's state and store — `state dump`, `status`,
/// `checkpoints list / verify / estimate` — write nothing: every file of both is as it
/// was (a partition never started gets no database, a leftover is not removed, an older
/// format is refused, not migrated), and a store path that does not exist is an error,
/// not a new empty store.
#[test]
fn reading_a_job_s_state_and_store_writes_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (dir, store) = (dir.path(), dir.path().join("state.checkpoints"));
    run_ok(&mut checkpoint_at_end(dir, 200, 5_000, 3))?;
    let state = dir.join("state");
    // As a job killed mid-upload leaves it, and a partition this host never started.
    std::fs::create_dir_all(state.join("snapshots/partition-0000-7"))?;
    std::fs::remove_dir_all(state.join("partition-0002"))?;
    let readers: [&[&std::ffi::OsStr]; 6] = [
        &["state".as_ref(), "dump".as_ref(), "--state-dir".as_ref(), state.as_os_str()],
        &["status".as_ref(), "--state-dir".as_ref(), state.as_os_str(), "--store".as_ref(), store.as_os_str()],
        &["checkpoints".as_ref(), "list".as_ref(), "--store".as_ref(), store.as_os_str()],
        &[
            "checkpoints".as_ref(),
            "verify".as_ref(),
            "--partition".as_ref(),
            "0".as_ref(),
            "--store".as_ref(),
            store.as_os_str(),
        ],
        &["checkpoints".as_ref(), "estimate".as_ref(), "--store".as_ref(), store.as_os_str()],
        &[
            "checkpoints".as_ref(),
            "estimate".as_ref(),
            "--store".as_ref(),
            store.as_os_str(),
            "--state-dir".as_ref(),
            state.as_os_str(),
        ],
    ];
    let before = tree(dir)?;
    for args in readers {
        run_ok(sluice().args(args))?;
        assert_eq!(tree(dir)?, before, "{args:?} changed the state or the store");
    }
    let dump = run_ok(sluice().args(["state", "dump", "--state-dir"]).arg(&state))?;
    assert!(!String::from_utf8(dump.stdout)?.is_empty(), "the started partitions' entries are dumped");

    // An older format is the job's to migrate.
    let manifest = state.join("sluice-state.json");
    let current = std::fs::read_to_string(&manifest)?;
    for older in [1, 2] {
        std::fs::write(&manifest, current.replace("\"format\": 3", &format!("\"format\": {older}")))?;
        let before = tree(dir)?;
        let err = run_err(sluice().args(["state", "dump", "--state-dir"]).arg(&state))?;
        assert!(err.contains(&format!("is in state format {older}")) && err.contains("nothing was changed"), "{err}");
        assert_eq!(tree(dir)?, before, "an older format is not migrated by a reader");
    }

    let missing = dir.join("no-such-store");
    for command in ["list", "estimate"] {
        let err = run_err(sluice().args(["checkpoints", command, "--store"]).arg(&missing))?;
        assert!(err.contains("does not exist"), "{err}");
    }
    assert!(!missing.exists(), "a mistyped store path is not created");
    Ok(())
}

/// Every file under `root` with its bytes' checksum and its modification time.
fn tree(root: &Path) -> Result<std::collections::BTreeMap<PathBuf, (String, std::time::SystemTime)>> {
    let mut files = std::collections::BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                dirs.push(entry.path());
            }
            let sum =
                if meta.is_file() { sluice::checksum::of_bytes(&std::fs::read(entry.path())?) } else { String::new() };
            files.insert(entry.path(), (sum, meta.modified()?));
        }
    }
    Ok(files)
}
