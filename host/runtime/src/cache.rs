//! The on-disk cache of precompiled components, keyed by plugin digest and the engine's
//! compatibility hash.
//!
//! Deserialising a precompiled artifact is `unsafe`: wasmtime trusts those bytes to be machine
//! code it produced. So the cache only loads files this host wrote, and checks each one against the
//! sha256 recorded beside it before deserialising. A file that fails the check is recompiled.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use orc_manifest::Digest;
use wasmtime::Engine;
use wasmtime::component::Component;

use crate::error::LoadError;

pub(crate) struct CompileCache {
    dir: Option<PathBuf>,
    engine_key: String,
}

impl CompileCache {
    pub(crate) fn new(dir: Option<PathBuf>, engine: &Engine) -> CompileCache {
        // `DefaultHasher::new()` uses fixed keys, so the value is stable for one build of the host;
        // a different wasmtime or configuration gives a different key and so a different file.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        CompileCache {
            dir,
            engine_key: format!("{:016x}", h.finish()),
        }
    }

    fn paths(&self, digest: &Digest) -> Option<(PathBuf, PathBuf)> {
        let dir = self.dir.as_ref()?;
        let base = format!("{}-{}", digest.hex(), self.engine_key);
        Some((dir.join(format!("{base}.cwasm")), dir.join(format!("{base}.sha256"))))
    }

    /// The compiled component for `bytes` (which the caller has verified hash to `digest`).
    pub(crate) fn component(&self, engine: &Engine, digest: &Digest, bytes: &[u8]) -> Result<Component, LoadError> {
        if let Some((artifact, checksum)) = self.paths(digest) {
            match load_verified(engine, &artifact, &checksum) {
                Ok(Some(c)) => return Ok(c),
                Ok(None) => {}
                Err(reason) => tracing::warn!(path = %artifact.display(), %reason, "discarding cached artifact"),
            }
        }
        let component = Component::new(engine, bytes).map_err(|e| LoadError::Compile {
            digest: *digest,
            message: format!("{e:#}"),
        })?;
        if let Some((artifact, checksum)) = self.paths(digest)
            && let Err(e) = store(&component, &artifact, &checksum)
        {
            // The cache is an optimisation: failing to write it is worth a warning, not an error.
            tracing::warn!(path = %artifact.display(), error = %e, "cannot write compiled artifact to cache");
        }
        Ok(component)
    }
}

fn load_verified(engine: &Engine, artifact: &Path, checksum: &Path) -> Result<Option<Component>, String> {
    let expected = match std::fs::read_to_string(checksum) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read checksum: {e}")),
    };
    let bytes = match std::fs::read(artifact) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read artifact: {e}")),
    };
    if Digest::of(&bytes).hex() != expected.trim() {
        return Err("checksum mismatch: the file was changed after this host wrote it".into());
    }
    deserialize(engine, &bytes)
        .map(Some)
        .map_err(|e| format!("incompatible artifact: {e}"))
}

#[allow(unsafe_code)]
fn deserialize(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: `bytes` is a file this host serialised with `Component::serialize` (its sha256 was
    // recorded beside it at write time and has just been checked), and the file name carries the
    // engine's compatibility hash; wasmtime additionally checks the engine configuration.
    unsafe { Component::deserialize(engine, bytes) }
}

fn store(component: &Component, artifact: &Path, checksum: &Path) -> std::io::Result<()> {
    let bytes = component.serialize().map_err(std::io::Error::other)?;
    if let Some(dir) = artifact.parent() {
        std::fs::create_dir_all(dir)?;
    }
    write_atomic(artifact, &bytes)?;
    write_atomic(checksum, Digest::of(&bytes).hex().as_bytes())
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
