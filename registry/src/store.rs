//! The registry on disk: verified, content-addressed blobs and a `name@version → digest` index,
//! confined to one directory opened as a capability.
//!
//! Layout under the root:
//! - `blobs/sha256/<64 hex>` — the bytes of each blob, named by their sha256;
//! - `index/<name>/<version>.json` — an [`Entry`], created once and never re-pointed;
//! - `tmp/` — files being written. Every write goes to `tmp/`, is fsynced, then renamed (blobs) or
//!   hard-linked (index entries, which must not replace an existing one) to its final name, so a
//!   crash never leaves a partial file under a final name.
//!
//! Architecture invariant: only [`Store::open`] uses ambient authority; every other path is
//! resolved inside the root by `cap_std`, and names and versions are validated before any of them
//! becomes a path.

use std::collections::BTreeSet;
use std::fmt;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use cap_std::fs::{Dir, OpenOptions};
use orc_manifest::{Capability, Digest, PluginKind};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::error::{RegistryError, Result};

/// The default largest blob a store accepts: 64 MiB.
pub const DEFAULT_MAX_BLOB_SIZE: u64 = 64 * 1024 * 1024;

/// Temporary files older than this are removed when a store is opened: whoever wrote them crashed.
const STALE_TMP_AGE: Duration = Duration::from_secs(3600);

const BLOB_DIR: &str = "blobs/sha256";
const INDEX_DIR: &str = "index";
const TMP_DIR: &str = "tmp";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// The largest blob (and so plugin) accepted, in bytes.
    pub max_blob_size: u64,
}

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            max_blob_size: DEFAULT_MAX_BLOB_SIZE,
        }
    }
}

/// One published plugin version: what `index/<name>/<version>.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    pub version: String,
    pub kind: PluginKind,
    pub world: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default)]
    pub description: String,
    /// `node` in an entry written before the split reads as both node capabilities.
    #[serde(default, deserialize_with = "orc_manifest::deserialize_capabilities")]
    pub capabilities: BTreeSet<Capability>,
    #[serde(default)]
    pub resource_types: Vec<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub published_at: OffsetDateTime,
}

impl Entry {
    /// `name@version`.
    pub fn reference(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
}

/// The outcome of a publish: the entry, and whether this call created it (`false` when the same
/// bytes were already published under that name and version).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    pub entry: Entry,
    pub created: bool,
}

/// What the store files by `name@version` under a directory of its own: plugins ([`Entry`],
/// `index/`) and service versions ([`crate::ServiceEntry`], `services/`).
pub(crate) trait Indexed: Serialize + serde::de::DeserializeOwned {
    /// The index directory.
    const DIR: &'static str;
    /// What an entry is, for messages (`plugin`, `service`).
    const WHAT: &'static str;
    fn name(&self) -> &str;
    fn version(&self) -> &str;
    fn digest(&self) -> Digest;
    /// Validates a name before it becomes a path component.
    fn check_name(name: &str) -> Result<()>;
}

impl Indexed for Entry {
    const DIR: &'static str = INDEX_DIR;
    const WHAT: &'static str = "plugin";
    fn name(&self) -> &str {
        &self.name
    }
    fn version(&self) -> &str {
        &self.version
    }
    fn digest(&self) -> Digest {
        self.digest
    }
    fn check_name(name: &str) -> Result<()> {
        check_name(name)
    }
}

/// A registry directory. Cheap to clone; all methods block on the file system (async callers use
/// `spawn_blocking`, as [`crate::Registry`] and the HTTP service do).
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    root: PathBuf,
    dir: Dir,
    options: StoreOptions,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("root", &self.inner.root)
            .field("options", &self.inner.options)
            .finish()
    }
}

/// Validates a plugin name before it becomes a path component.
pub fn check_name(name: &str) -> Result<()> {
    orc_manifest::validate_name(name).map_err(|e| RegistryError::InvalidName(e.to_string()))
}

/// Validates a version before it becomes a path component.
pub fn check_version(version: &str) -> Result<()> {
    orc_manifest::validate_version(version).map_err(|e| RegistryError::InvalidName(e.to_string()))
}

impl Store {
    /// Opens (creating if needed) the registry rooted at `path`.
    pub fn open(path: impl AsRef<Path>, options: StoreOptions) -> Result<Store> {
        let root = path.as_ref().to_path_buf();
        let shown = root.display().to_string();
        std::fs::create_dir_all(&root).map_err(RegistryError::io(format!("cannot create registry directory {shown}")))?;
        let dir = Dir::open_ambient_dir(&root, cap_std::ambient_authority())
            .map_err(RegistryError::io(format!("cannot open registry directory {shown}")))?;
        for sub in [BLOB_DIR, INDEX_DIR, TMP_DIR] {
            dir.create_dir_all(sub)
                .map_err(RegistryError::io(format!("cannot create {sub} in registry {shown}")))?;
        }
        let store = Store {
            inner: Arc::new(Inner { root, dir, options }),
        };
        store.sweep_tmp();
        tracing::debug!(root = %shown, "opened registry store");
        Ok(store)
    }

    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    pub fn options(&self) -> &StoreOptions {
        &self.inner.options
    }

    pub fn max_blob_size(&self) -> u64 {
        self.inner.options.max_blob_size
    }

    fn dir(&self) -> &Dir {
        &self.inner.dir
    }

    fn blob_path(digest: &Digest) -> String {
        format!("{BLOB_DIR}/{}", digest.hex())
    }

    pub(crate) fn check_size(&self, size: usize) -> Result<()> {
        let size = size as u64;
        let limit = self.max_blob_size();
        if size > limit {
            Err(RegistryError::TooLarge { size, limit })
        } else {
            Ok(())
        }
    }

    /// Whether a blob is filed under `digest` (without verifying it; [`Store::get_blob`] does).
    pub fn has_blob(&self, digest: &Digest) -> Result<bool> {
        self.dir()
            .try_exists(Self::blob_path(digest))
            .map_err(RegistryError::io(format!("cannot look up blob {digest}")))
    }

    /// Stores `bytes` under their digest. Returns the digest and whether the blob is new.
    pub fn put_blob(&self, bytes: &[u8]) -> Result<(Digest, bool)> {
        self.check_size(bytes.len())?;
        let digest = Digest::of(bytes);
        let created = self.write_blob(&digest, bytes)?;
        Ok((digest, created))
    }

    /// Stores `bytes`, which must hash to `expected` (an upload that names its digest).
    pub fn put_blob_expecting(&self, bytes: &[u8], expected: &Digest) -> Result<(Digest, bool)> {
        self.check_size(bytes.len())?;
        let actual = Digest::of(bytes);
        if actual != *expected {
            return Err(RegistryError::DigestMismatch {
                expected: *expected,
                actual,
            });
        }
        let created = self.write_blob(&actual, bytes)?;
        Ok((actual, created))
    }

    /// Writes a blob whose digest the caller has computed. An existing good copy is kept; a corrupt
    /// one is replaced, which is how a re-upload repairs a damaged store.
    fn write_blob(&self, digest: &Digest, bytes: &[u8]) -> Result<bool> {
        match self.get_blob(digest) {
            Ok(_) => return Ok(false),
            Err(RegistryError::UnknownDigest(_)) => {}
            Err(RegistryError::Corrupt { actual, .. }) => {
                tracing::warn!(%digest, %actual, "replacing corrupt blob with a verified upload");
            }
            Err(e) => return Err(e),
        }
        let tmp = self.write_tmp(bytes, &format!("blob {digest}"))?;
        let path = Self::blob_path(digest);
        self.dir()
            .rename(&tmp.name, self.dir(), &path)
            .map_err(RegistryError::io(format!("cannot move blob {digest} into place")))?;
        tmp.persisted();
        self.sync_dir(BLOB_DIR)?;
        tracing::info!(%digest, size = bytes.len(), "stored blob");
        Ok(true)
    }

    /// The bytes filed under `digest`, re-hashed on every read.
    pub fn get_blob(&self, digest: &Digest) -> Result<Vec<u8>> {
        let bytes = match self.dir().read(Self::blob_path(digest)) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(RegistryError::UnknownDigest(*digest)),
            Err(e) => return Err(RegistryError::io(format!("cannot read blob {digest}"))(e)),
        };
        let actual = Digest::of(&bytes);
        if actual != *digest {
            tracing::error!(%digest, %actual, "blob is corrupt: its bytes no longer hash to its name");
            return Err(RegistryError::Corrupt { digest: *digest, actual });
        }
        Ok(bytes)
    }

    /// Publishes a plugin component: reads and validates its embedded manifest, stores the bytes,
    /// and points `name@version` at their digest. Publishing the same bytes again is a no-op;
    /// pointing an existing `name@version` at other bytes is refused with `VersionTaken`.
    pub fn publish(&self, bytes: &[u8]) -> Result<Published> {
        self.check_size(bytes.len())?;
        let manifest = match orc_manifest::extract(bytes) {
            Ok(Some(m)) => m,
            Ok(None) => {
                return Err(RegistryError::InvalidPlugin(format!(
                    "the component carries no `{}` manifest section (build it with `orc-plugin build`)",
                    orc_manifest::MANIFEST_SECTION
                )));
            }
            Err(e) => return Err(RegistryError::InvalidPlugin(orc_manifest::error_chain(&e))),
        };
        check_name(&manifest.name)?;
        check_version(&manifest.version)?;
        let digest = Digest::of(bytes);
        let entry = Entry {
            name: manifest.name,
            version: manifest.version,
            kind: manifest.kind,
            world: manifest.world,
            digest,
            size: bytes.len() as u64,
            description: manifest.description,
            capabilities: manifest.capabilities,
            resource_types: manifest.resource_types,
            published_at: OffsetDateTime::now_utc(),
        };
        let (entry, created) = self.file_entry(entry, bytes)?;
        Ok(Published { entry, created })
    }

    /// Stores `bytes` (whose digest `entry` names) and files `entry` under its name and version.
    /// Re-filing the same digest is a no-op; another digest under a filed `name@version` is
    /// refused with `VersionTaken`.
    pub(crate) fn file_entry<T: Indexed>(&self, entry: T, bytes: &[u8]) -> Result<(T, bool)> {
        // Fast path: a re-publish or a refused re-point never writes anything.
        if let Some(existing) = self.try_resolve_in::<T>(entry.name(), entry.version())? {
            return Self::compare(existing, entry.digest());
        }
        self.write_blob(&entry.digest(), bytes)?;
        self.link_entry(entry)
    }

    fn compare<T: Indexed>(existing: T, attempted: Digest) -> Result<(T, bool)> {
        if existing.digest() == attempted {
            Ok((existing, false))
        } else {
            Err(RegistryError::VersionTaken {
                name: existing.name().to_string(),
                version: existing.version().to_string(),
                existing: existing.digest(),
                attempted,
            })
        }
    }

    /// Files `entry` under its name and version with create-new semantics: of two racing
    /// publishers exactly one links its file; the other sees the winner's entry.
    fn link_entry<T: Indexed>(&self, entry: T) -> Result<(T, bool)> {
        let reference = format!("{} {}@{}", T::WHAT, entry.name(), entry.version());
        let json = serde_json::to_vec_pretty(&entry).expect("an entry always serialises");
        let name_dir = format!("{}/{}", T::DIR, entry.name());
        self.dir()
            .create_dir_all(&name_dir)
            .map_err(RegistryError::io(format!("cannot create index directory for {reference}")))?;
        let tmp = self.write_tmp(&json, &format!("index entry {reference}"))?;
        let path = Self::index_path::<T>(entry.name(), entry.version());
        match self.dir().hard_link(&tmp.name, self.dir(), &path) {
            Ok(()) => {
                drop(tmp);
                self.sync_dir(&name_dir)?;
                tracing::info!(entry = %reference, digest = %entry.digest(), "published");
                Ok((entry, true))
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                drop(tmp);
                let existing = self.resolve_in::<T>(entry.name(), entry.version())?;
                Self::compare(existing, entry.digest())
            }
            Err(e) => Err(RegistryError::io(format!("cannot write index entry {reference}"))(e)),
        }
    }

    fn index_path<T: Indexed>(name: &str, version: &str) -> String {
        format!("{}/{name}/{version}.json", T::DIR)
    }

    /// The entry for `name@version`.
    pub fn resolve(&self, name: &str, version: &str) -> Result<Entry> {
        self.resolve_in(name, version)
    }

    pub(crate) fn resolve_in<T: Indexed>(&self, name: &str, version: &str) -> Result<T> {
        self.try_resolve_in(name, version)?.ok_or_else(|| RegistryError::NotFound {
            what: format!("{} {name}@{version}", T::WHAT),
        })
    }

    fn try_resolve_in<T: Indexed>(&self, name: &str, version: &str) -> Result<Option<T>> {
        T::check_name(name)?;
        check_version(version)?;
        let path = Self::index_path::<T>(name, version);
        let text = match self.dir().read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(RegistryError::io(format!("cannot read index entry {name}@{version}"))(e)),
        };
        let corrupt = |message: String| {
            tracing::error!(path = %path, %message, "corrupt index entry");
            RegistryError::IndexCorrupt {
                path: path.clone(),
                message,
            }
        };
        let entry: T = serde_json::from_slice(&text).map_err(|e| corrupt(e.to_string()))?;
        if entry.name() != name || entry.version() != version {
            return Err(corrupt(format!("it describes {}@{} instead", entry.name(), entry.version())));
        }
        Ok(Some(entry))
    }

    /// Every published version of `name`, oldest first.
    pub fn versions(&self, name: &str) -> Result<Vec<Entry>> {
        self.versions_in(name)
    }

    pub(crate) fn versions_in<T: Indexed>(&self, name: &str) -> Result<Vec<T>> {
        T::check_name(name)?;
        let not_found = || RegistryError::NotFound {
            what: format!("{} `{name}`", T::WHAT),
        };
        let name_dir = format!("{}/{name}", T::DIR);
        let entries = match self.dir().read_dir(&name_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(not_found()),
            Err(e) => return Err(RegistryError::io(format!("cannot list versions of {name}"))(e)),
        };
        let mut out = Vec::new();
        for item in entries {
            let item = item.map_err(RegistryError::io(format!("cannot list versions of {name}")))?;
            let file_name = item.file_name();
            // Only `<valid version>.json` is an entry; anything else (an editor's backup, a stray
            // temp file) is ignored rather than trusted.
            let Some(version) = file_name.to_str().and_then(|f| f.strip_suffix(".json")) else {
                continue;
            };
            if check_version(version).is_err() {
                tracing::warn!(file = %file_name.to_string_lossy(), %name, "ignoring a file in the index that is not an entry");
                continue;
            }
            if let Some(entry) = self.try_resolve_in::<T>(name, version)? {
                out.push(entry);
            }
        }
        if out.is_empty() {
            return Err(not_found());
        }
        out.sort_by(|a, b| orc_manifest::version_order(a.version()).cmp(&orc_manifest::version_order(b.version())));
        Ok(out)
    }

    /// Every entry, sorted by name then version.
    pub fn list(&self) -> Result<Vec<Entry>> {
        self.list_in()
    }

    pub(crate) fn list_in<T: Indexed>(&self) -> Result<Vec<T>> {
        let entries = match self.dir().read_dir(T::DIR) {
            Ok(entries) => entries,
            // The services index is made by the first service published.
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(RegistryError::io(format!("cannot list the registry's {} index", T::WHAT))(e)),
        };
        let mut names = Vec::new();
        for item in entries {
            let item = item.map_err(RegistryError::io(format!("cannot list the registry's {} index", T::WHAT)))?;
            match item.file_name().to_str() {
                Some(name) if T::check_name(name).is_ok() => names.push(name.to_string()),
                _ => {
                    tracing::warn!(file = %item.file_name().to_string_lossy(), what = T::WHAT, "ignoring a file in the index that is not a name")
                }
            }
        }
        names.sort();
        let mut out = Vec::new();
        for name in names {
            match self.versions_in::<T>(&name) {
                Ok(v) => out.extend(v),
                Err(RegistryError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Writes `bytes` to a fresh file in `tmp/` and fsyncs it. The returned guard removes the file
    /// unless it has been renamed away.
    fn write_tmp(&self, bytes: &[u8], what: &str) -> Result<TmpFile<'_>> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        loop {
            let nanos = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let name = format!(
                "{TMP_DIR}/{}-{}-{nanos}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            );
            let mut file = match self.dir().open_with(&name, &options) {
                Ok(f) => f,
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(RegistryError::io(format!("cannot create a temporary file for {what}"))(e)),
            };
            let tmp = TmpFile {
                dir: self.dir(),
                name,
                armed: true,
            };
            file.write_all(bytes)
                .and_then(|()| file.sync_all())
                .map_err(RegistryError::io(format!("cannot write {what}")))?;
            return Ok(tmp);
        }
    }

    fn sync_dir(&self, path: &str) -> Result<()> {
        // `open_dir` gives an `O_PATH` handle, which cannot be fsynced; a read-only open can.
        self.dir()
            .open(path)
            .and_then(|d| d.sync_all())
            .map_err(RegistryError::io(format!("cannot sync registry directory {path}")))
    }

    /// Best effort: removes temporary files left by a writer that crashed long ago. Recent ones may
    /// belong to another process writing to the same store right now.
    fn sweep_tmp(&self) {
        let Ok(entries) = self.dir().read_dir(TMP_DIR) else { return };
        let now = SystemTime::now();
        for item in entries.flatten() {
            let old = item
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| now.duration_since(t.into_std()).is_ok_and(|age| age > STALE_TMP_AGE));
            if old {
                let path = Path::new(TMP_DIR).join(item.file_name());
                match self.dir().remove_file(&path) {
                    Ok(()) => tracing::info!(file = %path.display(), "removed a stale temporary file"),
                    Err(e) => tracing::warn!(file = %path.display(), error = %e, "cannot remove a stale temporary file"),
                }
            }
        }
    }
}

/// A file in `tmp/`, removed on drop unless [`TmpFile::persisted`] says it was renamed away.
struct TmpFile<'a> {
    dir: &'a Dir,
    name: String,
    armed: bool,
}

impl TmpFile<'_> {
    fn persisted(mut self) {
        self.armed = false;
    }
}

impl Drop for TmpFile<'_> {
    fn drop(&mut self) {
        if self.armed
            && let Err(e) = self.dir.remove_file(&self.name)
            && e.kind() != ErrorKind::NotFound
        {
            tracing::warn!(file = %self.name, error = %e, "cannot remove a temporary file");
        }
    }
}
