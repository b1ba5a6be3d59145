//! A store of objects opened from a URL — a local directory or S3-compatible object
//! storage, both behind the `object_store` crate, so one code path serves both — and
//! the runtime its I/O runs on.
//!
//! This module owns opening a URL, reading an object within a bound, writing one
//! (unconditionally or only when it does not exist), listing, deleting, and telling a
//! store that fails to answer from one that answers "missing". It does not own what the
//! objects are: the checkpoints' layout is the [checkpoint
//! store](crate::checkpoint::store)'s, the deployed versions' the
//! [registry](crate::operator::registry)'s. Both live in the store a job configures as
//! its checkpoint store, which is what messages call it.

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetResult, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The most bytes sluice reads of a record it keeps in a store — a manifest, a claim,
/// the restore history, a registry entry — far more than it writes (a manifest names
/// each file in about 150 bytes, so this is over 400,000 files).
pub const MAX_RECORD_BYTES: u64 = 64 << 20;

/// The runtime store I/O runs on: two threads beside the partition workers.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sluice-checkpoint")
        .enable_all()
        .build()?)
}

/// The objects under one URL. Cheap to clone; every clone talks to the same store.
#[derive(Clone)]
pub struct Objects {
    objects: Arc<dyn ObjectStore>,
    url: String,
    /// The directory of a directory store.
    local_root: Option<PathBuf>,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Objects").field("url", &self.url).finish()
    }
}

impl Objects {
    /// Opens a store that exists, to read it (`sluice checkpoints …`, `status --store`):
    /// as [`open`](Objects::open), but a directory that does not exist is an error, not
    /// created (a mistyped path would otherwise leave an empty store behind).
    pub fn open_existing(url: &str) -> Result<Self> {
        Self::open_at(url, false)
    }

    /// Opens the store at `url`: `s3://bucket/prefix` (credentials, region and endpoint
    /// from the usual `AWS_*` environment variables), `file:///abs/dir`, or a plain
    /// directory path. A directory is created when missing.
    pub fn open(url: &str) -> Result<Self> {
        Self::open_at(url, true)
    }

    /// [`open`](Objects::open), creating a missing directory if `create`.
    fn open_at(url: &str, create: bool) -> Result<Self> {
        let mut local_root = None;
        let objects: Arc<dyn ObjectStore> = if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                bail!("checkpoint store `{url}` names no bucket (expected s3://bucket/prefix)");
            }
            let s3 = object_store::aws::AmazonS3Builder::from_env()
                .with_url(format!("s3://{bucket}"))
                .build()
                .with_context(|| format!("opening checkpoint store {url}"))?;
            match prefix.trim_matches('/') {
                "" => Arc::new(s3),
                prefix => Arc::new(object_store::prefix::PrefixStore::new(s3, prefix)),
            }
        } else {
            let dir = url.strip_prefix("file://").unwrap_or(url);
            if dir.contains("://") {
                bail!(
                    "checkpoint store `{url}`: unsupported scheme (use a directory, file:///dir or s3://bucket/prefix)"
                );
            }
            if create {
                std::fs::create_dir_all(dir).with_context(|| format!("creating checkpoint store directory {dir}"))?;
            } else if !Path::new(dir).is_dir() {
                bail!("checkpoint store directory {dir} does not exist");
            }
            let local = object_store::local::LocalFileSystem::new_with_prefix(dir)
                .with_context(|| format!("opening checkpoint store directory {dir}"))?
                // A manifest must not outlive (on disk) the files it lists.
                .with_fsync(true);
            local_root = Some(PathBuf::from(dir));
            Arc::new(local)
        };
        Ok(Objects { objects, url: url.to_string(), local_root })
    }

    /// The URL the store was opened with.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The directory of a directory store; `None` for object storage.
    pub fn local_root(&self) -> Option<&Path> {
        self.local_root.as_deref()
    }

    /// Reads object `path`, if the store holds it and it takes at most `limit` bytes;
    /// a larger one is refused, naming it, before anything of it is read, so a damaged
    /// or crafted object never chooses what the host allocates.
    pub async fn get_optional(&self, path: &str, limit: u64) -> Result<Option<Vec<u8>>> {
        match self.objects.get(&ObjectPath::from(path)).await {
            Ok(found) if found.meta.size > limit => bail!(
                "{path} in checkpoint store {} takes {} bytes, more than the {limit} sluice reads of such an object: \
                 it is damaged or not sluice's",
                self.url,
                found.meta.size
            ),
            Ok(found) => Ok(Some(
                found
                    .bytes()
                    .await
                    .with_context(|| format!("reading {path} in checkpoint store {}", self.url))?
                    .to_vec(),
            )),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {path} in checkpoint store {}", self.url)),
        }
    }

    /// Starts reading object `path`, of any size, to stream it; `None` when the store
    /// does not hold it.
    pub async fn get_stream(&self, path: &str) -> Result<Option<GetResult>> {
        match self.objects.get(&ObjectPath::from(path)).await {
            Ok(found) => Ok(Some(found)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {path} from checkpoint store {}", self.url)),
        }
    }

    /// Writes object `path` unless it exists (a conditional put, so of two hosts racing
    /// for one name exactly one wins); returns whether this call wrote it.
    pub async fn put_new(&self, path: &str, bytes: Vec<u8>) -> Result<bool> {
        let create = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        match self.objects.put_opts(&ObjectPath::from(path), PutPayload::from(bytes), create).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(e).with_context(|| format!("writing {path} to checkpoint store {}", self.url)),
        }
    }

    /// Writes object `path`, replacing whatever is there.
    pub async fn put_bytes(&self, path: &str, bytes: Vec<u8>) -> Result<()> {
        self.put(path, bytes, "writing").await
    }

    /// Uploads a file's `bytes` as object `path`, replacing whatever is there.
    pub async fn upload(&self, path: &str, bytes: Vec<u8>) -> Result<()> {
        self.put(path, bytes, "uploading").await
    }

    /// Writes object `path`; an error says it failed `doing` so.
    async fn put(&self, path: &str, bytes: Vec<u8>, doing: &str) -> Result<()> {
        self.objects
            .put(&ObjectPath::from(path), PutPayload::from(bytes))
            .await
            .with_context(|| format!("{doing} {path} to checkpoint store {}", self.url))?;
        Ok(())
    }

    /// The objects under folder `prefix`, as the store lists them.
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let prefix = ObjectPath::from(prefix);
        let mut found = Vec::new();
        let mut listing = self.objects.list(Some(&prefix));
        while let Some(meta) = listing.next().await {
            found.push(meta.with_context(|| format!("listing {prefix} in checkpoint store {}", self.url))?);
        }
        Ok(found)
    }

    /// The names of the objects under folder `prefix`.
    pub async fn object_names(&self, prefix: &str) -> Result<Vec<String>> {
        let listed = self.list(prefix).await?;
        Ok(listed.iter().filter_map(|meta| meta.location.filename().map(str::to_string)).collect())
    }

    /// Deletes object `path`; one already gone is no error.
    pub async fn delete(&self, path: &str) -> Result<()> {
        match self.objects.delete(&ObjectPath::from(path)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("deleting {path} from checkpoint store {}", self.url)),
        }
    }
}

/// Whether `error` is the store failing to answer — unreachable, refusing, erring —
/// rather than answering that something is missing or wrong: worth trying again later.
pub fn is_unavailable(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<object_store::Error>().is_some_and(|e| {
            !matches!(e, object_store::Error::NotFound { .. } | object_store::Error::AlreadyExists { .. })
        })
    })
}
