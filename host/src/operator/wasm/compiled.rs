//! Compiled components kept on disk, so a host compiles a build once: a restart, a
//! deploy or a replay of a build compiled before maps its machine code in milliseconds
//! instead of compiling it again — seconds for a Python or JavaScript component, whose
//! interpreter is inside it.
//!
//! This module owns the cache directory's layout and its bound: one file per build and
//! engine, named by the component's SHA-256 and a hash of the engine's compatibility
//! (wasmtime's version and every setting that changes the code), the least recently
//! used removed past the budget. Whether a job keeps compiled components, and where, is
//! the job's to say ([`keep_compiled`]); without it every component is compiled.
//!
//! A compiled file is machine code the host runs, so the cache must be as trusted as
//! the binary: a job's lives in its state directory, which only the host writes;
//! `sluice test`'s in the user's cache directory, which only the user writes, shared by
//! the runs of that user (so processes may write one file at once: each writes its own
//! temporary file, and the last rename wins with the same bytes). wasmtime refuses a
//! file another version or configuration wrote, and a file it refuses is compiled
//! again and replaced.

use crate::operator::events::{COMPILED, READ_COMPILED};
use anyhow::{Context, Result, bail};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Where compiled components are kept, and how many bytes of them.
struct CompiledCache {
    dir: PathBuf,
    budget: u64,
}

static CACHE: OnceLock<CompiledCache> = OnceLock::new();

/// What a compiled component's file name ends with.
const EXTENSION: &str = "cwasm";

/// Keeps the components this process compiles from now on under `dir` (created when
/// missing), at most `budget` bytes of them; 0 keeps none. Set once per process (a
/// second call with another directory or budget is an error).
pub fn keep_compiled(dir: &Path, budget: u64) -> Result<()> {
    if budget == 0 {
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let cache = CACHE.get_or_init(|| CompiledCache { dir: dir.to_path_buf(), budget });
    if cache.dir != dir || cache.budget != budget {
        bail!("compiled components are kept in {} already ({} bytes)", cache.dir.display(), cache.budget);
    }
    Ok(())
}

/// `component` compiled by `engine`: read from the cache when [`keep_compiled`] set
/// one and it holds it, else compiled (and kept, when a cache is set).
pub(super) fn compile(engine: &Engine, component: &[u8]) -> Result<Component> {
    match CACHE.get() {
        Some(cache) => cache.compile(engine, component),
        None => build(engine, component),
    }
}

/// Compiles `component`, logging how long it took.
fn build(engine: &Engine, component: &[u8]) -> Result<Component> {
    let started = Instant::now();
    let compiled = Component::new(engine, component)?;
    let digest = crate::operator::sha256_hex(component);
    tracing::info!("operator component {:.12}… {COMPILED} {} ms", digest, started.elapsed().as_millis());
    Ok(compiled)
}

impl CompiledCache {
    /// `component` compiled by `engine`, from this cache or compiled and kept.
    fn compile(&self, engine: &Engine, component: &[u8]) -> Result<Component> {
        let path = self.path(engine, component);
        let started = Instant::now();
        if path.exists() {
            // SAFETY: the file is one this host wrote with `Component::serialize` (see the
            // module's note on trust); wasmtime checks its header against the engine.
            match unsafe { Component::deserialize_file(engine, &path) } {
                Ok(compiled) => {
                    // Its time says when it was last used: the least recently used goes first.
                    let touched = std::fs::File::options()
                        .append(true)
                        .open(&path)
                        .and_then(|f| f.set_modified(SystemTime::now()));
                    if let Err(e) = touched {
                        tracing::debug!("marking {} used: {e}", path.display());
                    }
                    let took = started.elapsed().as_millis();
                    tracing::info!("operator component {READ_COMPILED} {} in {took} ms", path.display());
                    return Ok(compiled);
                }
                Err(e) => tracing::warn!("compiled component {} is unusable ({e:#}); compiling again", path.display()),
            }
        }
        let compiled = build(engine, component)?;
        if let Err(e) = self.keep(&path, &compiled) {
            tracing::warn!("keeping the compiled component in {}: {e:#}", self.dir.display());
        }
        Ok(compiled)
    }

    /// The file of `component` compiled by `engine`.
    fn path(&self, engine: &Engine, component: &[u8]) -> PathBuf {
        // The same binary hashes the same compatibility the same way: the hasher's keys
        // are fixed.
        let mut hasher = std::hash::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let digest = crate::operator::sha256_hex(component);
        self.dir.join(format!("{digest}-{:016x}.{EXTENSION}", hasher.finish()))
    }

    /// Writes `compiled` to `path` through a temporary file of this write's own renamed
    /// over it — never in place: a component read from a file maps it, and would fault
    /// on a file cut short under it — then removes the least recently used files past
    /// the budget (removing a mapped file leaves the mapping whole).
    fn keep(&self, path: &Path, compiled: &Component) -> Result<()> {
        static WRITES: AtomicU64 = AtomicU64::new(0);
        let bytes = compiled.serialize()?;
        if bytes.len() as u64 > self.budget {
            return Ok(());
        }
        let write = WRITES.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_extension(format!("{}-{write}.tmp", std::process::id()));
        std::fs::write(&tmp, &bytes).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
        self.evict()
    }

    /// Removes the least recently used compiled files until the rest fit the budget.
    fn evict(&self) -> Result<()> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.dir).with_context(|| format!("reading {}", self.dir.display()))? {
            let entry = entry?;
            let path = entry.path();
            if path.extension().is_some_and(|extension| extension == EXTENSION) {
                let metadata = entry.metadata()?;
                files.push((metadata.modified()?, metadata.len(), path));
            }
        }
        files.sort();
        let mut total: u64 = files.iter().map(|(_, len, _)| len).sum();
        for (_, len, path) in files {
            if total <= self.budget {
                break;
            }
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
            tracing::info!("compiled component {} removed: [operator] compiled_cache_mib is reached", path.display());
            total -= len;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        files
    }

    /// A build compiled once is read back, not compiled again; a file wasmtime refuses
    /// is compiled again and replaced; past the budget the least recently used goes.
    #[test]
    fn a_build_is_compiled_once_and_the_least_recently_used_leaves_past_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::default();
        let probe = std::fs::read(sluice_e2e::operator_wasm("probe")).unwrap();
        let stats = std::fs::read(sluice_e2e::operator_wasm("vehicle_stats")).unwrap();
        let cache = CompiledCache { dir: dir.path().into(), budget: u64::MAX };
        cache.compile(&engine, &probe).unwrap();
        let [probe_file] = &files(dir.path())[..] else { panic!("{:?}", files(dir.path())) };
        let probe_len = std::fs::metadata(probe_file).unwrap().len();

        // Read back: a file that only deserializes (a compile would replace it).
        let written = std::fs::metadata(probe_file).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let started = std::time::Instant::now();
        let again = cache.compile(&engine, &probe).unwrap();
        assert!(again.serialize().unwrap().len() as u64 == probe_len);
        assert!(std::fs::metadata(probe_file).unwrap().modified().unwrap() > written, "marked used");
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "{:?}", started.elapsed());

        // A corrupt file is compiled again, and replaced. (Written over here with no
        // component of it alive: a live one maps the file, which is why the cache only
        // ever replaces a file by a rename.)
        drop(again);
        std::fs::write(probe_file, b"not machine code").unwrap();
        cache.compile(&engine, &probe).unwrap();
        assert_eq!(std::fs::metadata(probe_file).unwrap().len(), probe_len);

        // Without room for both, a second build pushes the least recently used out.
        let stats_len = Component::new(&engine, &stats).unwrap().serialize().unwrap().len() as u64;
        let small = CompiledCache { dir: dir.path().into(), budget: probe_len + stats_len - 1 };
        std::thread::sleep(std::time::Duration::from_millis(20));
        small.compile(&engine, &stats).unwrap();
        let left = files(dir.path());
        assert_eq!(left.len(), 1, "{left:?}");
        assert_ne!(&left[0], probe_file, "the probe was used least recently");
    }
}
