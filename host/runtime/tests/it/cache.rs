//! The compiled-artifact cache: a second runtime loads the cached artifact, and a cache file that
//! was changed behind the host's back is discarded and recompiled, never deserialised.

use orc_manifest::{Capability, Digest, PluginKind};
use orc_plugin_artifacts::FILE;
use orc_runtime::{CallContext, Grants, Runtime, RuntimeConfig};
use serde_json::json;

use crate::target;

fn cached_runtime(dir: &std::path::Path) -> Runtime {
    Runtime::new(RuntimeConfig {
        cache_dir: Some(dir.to_path_buf()),
        max_instances: 10,
        ..RuntimeConfig::default()
    })
    .unwrap()
}

#[tokio::test]
async fn cached_artifacts_are_reused_and_verified() {
    let cache = tempfile::tempdir().unwrap();
    let digest: Digest = FILE.digest.parse().unwrap();
    cached_runtime(cache.path())
        .load_bytes(
            &digest,
            FILE.bytes,
            PluginKind::Adaptor,
            &Grants::none().with(Capability::NodeFiles),
        )
        .unwrap();
    let artifact = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .expect("an artifact was cached");
    assert!(artifact.file_name().unwrap().to_string_lossy().starts_with(&digest.hex()));

    // Flip a byte in the cached machine code: the next runtime must not trust it.
    let mut bytes = std::fs::read(&artifact).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&artifact, &bytes).unwrap();
    let rt = cached_runtime(cache.path());
    let plugin = rt
        .load_bytes(
            &digest,
            FILE.bytes,
            PluginKind::Adaptor,
            &Grants::none().with(Capability::NodeFiles),
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ctx = CallContext {
        ..crate::local_context(dir.path())
    };
    let mut a = plugin.adaptor(&ctx).await.unwrap();
    assert_eq!(a.read(&target("file", "/absent", json!({"content": ""}))).await.unwrap(), None);
    // It was rewritten with a good copy.
    assert_ne!(std::fs::read(&artifact).unwrap(), bytes);
    let _ = CallContext::new("unused");
}
