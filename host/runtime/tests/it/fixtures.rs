//! Each misbehaving fixture gives its own outcome, and the runtime serves the next call.

use std::time::{Duration, Instant};

use orc_manifest::{Capability, Digest, PluginKind};
use orc_plugin_artifacts::{MISBEHAVE, WRONG_WORLD};
use orc_runtime::{CallContext, CallError, Grants, LoadError, PluginErrorKind};
use serde_json::json;

use crate::{load, runtime, target};

async fn read(rt: &orc_runtime::Runtime, ctx: &CallContext, behave: serde_json::Value) -> Result<Option<String>, CallError> {
    // The fixture requests every capability: only full grants load it.
    let plugin = load(rt, &MISBEHAVE, &Grants::all());
    let mut instance = plugin.adaptor(ctx).await?;
    instance.read(&target("misbehave", "/x", behave)).await
}

#[tokio::test]
async fn each_misbehaviour_is_reported_distinctly_and_the_next_call_works() {
    let rt = runtime();
    let ctx = CallContext {
        deadline: Some(Duration::from_millis(300)),
        ..CallContext::new("test")
    };

    assert_eq!(
        read(&rt, &ctx, json!({"behave": "ok"})).await.unwrap().as_deref(),
        Some(r#"{"ok":true}"#)
    );

    let started = Instant::now();
    let err = read(&rt, &ctx, json!({"behave": "loop"})).await.unwrap_err();
    assert!(matches!(err, CallError::TimedOut { .. }), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "interrupted promptly: {:?}",
        started.elapsed()
    );

    let err = read(&rt, &ctx, json!({"behave": "alloc"})).await.unwrap_err();
    assert!(
        matches!(err, CallError::MemoryLimit { limit_bytes, .. } if limit_bytes == 32 << 20),
        "{err}"
    );

    let err = read(&rt, &ctx, json!({"behave": "panic"})).await.unwrap_err();
    match &err {
        CallError::Crashed { message, .. } => assert!(message.contains("misbehave: asked to panic"), "{message}"),
        other => panic!("expected a crash, got {other}"),
    }

    let err = read(&rt, &ctx, json!({"behave": "trap"})).await.unwrap_err();
    assert!(
        matches!(err, CallError::Crashed { ref message, .. } if message.contains("unreachable")),
        "{err}"
    );

    let err = read(&rt, &ctx, json!({"behave": "error"})).await.unwrap_err();
    let e = err.plugin_error().expect("a plugin error");
    assert_eq!(
        (e.kind, e.message.as_str()),
        (PluginErrorKind::Permanent, "misbehave: asked to fail")
    );

    let err = read(&rt, &ctx, json!({"behave": "nonsense"})).await.unwrap_err();
    assert_eq!(err.plugin_error().unwrap().kind, PluginErrorKind::InvalidInput);

    // The http capability is linked, but this context allows no origin: refused before connecting.
    let err = read(&rt, &ctx, json!({"behave": "http"})).await.unwrap_err();
    let e = err.plugin_error().expect("a plugin error");
    assert_eq!(e.kind, PluginErrorKind::Denied, "{e:?}");
    assert!(
        e.message.contains("127.0.0.1:9") && e.message.contains("not allowed"),
        "{}",
        e.message
    );

    // And after all that, the runtime still serves.
    assert!(read(&rt, &ctx, json!({"behave": "ok"})).await.unwrap().is_some());
}

#[tokio::test]
async fn a_trapped_instance_refuses_further_calls_but_new_instances_work() {
    let rt = runtime();
    // The fixture requests every capability: only full grants load it.
    let ctx = CallContext::new("test");
    let plugin = load(&rt, &MISBEHAVE, &Grants::all());
    let mut instance = plugin.adaptor(&ctx).await.unwrap();
    assert!(instance.read(&target("misbehave", "/x", json!({"behave": "trap"}))).await.is_err());
    let err = instance
        .read(&target("misbehave", "/x", json!({"behave": "ok"})))
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::Host { .. }), "{err}");
    let mut fresh = plugin.adaptor(&ctx).await.unwrap();
    assert!(fresh.read(&target("misbehave", "/x", json!({"behave": "ok"}))).await.is_ok());
}

#[test]
fn capabilities_not_granted_are_refused_at_load_time() {
    let rt = runtime();
    let digest: Digest = MISBEHAVE.digest.parse().unwrap();
    let grants = Grants::none()
        .with(Capability::NodeFiles)
        .with(Capability::NodeCommands)
        .with(Capability::Kv);
    let err = rt.load_bytes(&digest, MISBEHAVE.bytes, PluginKind::Adaptor, &grants).unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::NotGranted {
                capability: Capability::Http,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("misbehave@0.1.0") && err.to_string().contains("`http`"),
        "{err}"
    );
}

// Here and below, `Grants::all()`: what is refused is the component itself, whatever is granted.
#[test]
fn a_component_of_the_wrong_world_is_refused() {
    let rt = runtime();
    let digest: Digest = WRONG_WORLD.digest.parse().unwrap();
    let err = rt
        .load_bytes(&digest, WRONG_WORLD.bytes, PluginKind::Adaptor, &Grants::all())
        .unwrap_err();
    assert!(matches!(err, LoadError::WrongWorld { .. }), "{err}");
    assert!(err.to_string().contains("orc:plugin/cluster-solver@0.1.0"), "{err}");
    assert!(err.to_string().contains("must export `orc:plugin/resource-adaptor@0.1.0`"), "{err}");
    // Asking for a different kind than the manifest says is refused too.
    let err = rt
        .load_bytes(
            &MISBEHAVE.digest.parse().unwrap(),
            MISBEHAVE.bytes,
            PluginKind::Solver,
            &Grants::all(),
        )
        .unwrap_err();
    assert!(matches!(err, LoadError::WrongKind { .. }), "{err}");
}

#[test]
fn tampered_or_unmanifested_bytes_are_refused() {
    let rt = runtime();
    let digest: Digest = MISBEHAVE.digest.parse().unwrap();
    let mut tampered = MISBEHAVE.bytes.to_vec();
    let last = tampered.len() - 3;
    tampered[last] ^= 0x20;
    let err = rt.load_bytes(&digest, &tampered, PluginKind::Adaptor, &Grants::all()).unwrap_err();
    assert!(matches!(err, LoadError::DigestMismatch { .. }), "{err}");

    // The component exactly as cargo wrote it, without the manifest section: refused.
    let bare = strip_manifest(MISBEHAVE.bytes);
    let err = rt
        .load_bytes(&Digest::of(&bare), &bare, PluginKind::Adaptor, &Grants::all())
        .unwrap_err();
    assert!(matches!(err, LoadError::NoManifest { .. }), "{err}");
}

/// The component without the `orc:manifest` custom section that `embed` appended last.
fn strip_manifest(bytes: &[u8]) -> Vec<u8> {
    let manifest = orc_manifest::extract(bytes).unwrap().unwrap();
    let payload = 1 + orc_manifest::MANIFEST_SECTION.len() + manifest.to_json().len();
    let leb_len = (usize::BITS - payload.leading_zeros()).div_ceil(7).max(1) as usize;
    let cut = bytes.len() - (1 + leb_len + payload);
    assert_eq!(bytes[cut], 0, "custom section id");
    let bare = bytes[..cut].to_vec();
    assert!(orc_manifest::extract(&bare).unwrap().is_none());
    bare
}

/// The `node` interface is linked whole for a plugin with either node capability; the part it
/// was not granted refuses at call time with `denied`. Load refuses a plugin that requests what
/// is not granted, so a guest reaches `run` without `node-commands` only through a manifest that
/// under-declares: misbehave re-labelled as requesting node files (and not node commands).
#[tokio::test]
async fn a_plugin_granted_node_files_only_is_denied_run() {
    let rt = runtime();
    let root = tempfile::tempdir().unwrap();
    let ctx = crate::local_context(root.path());
    let mut manifest = orc_manifest::extract(MISBEHAVE.bytes).unwrap().unwrap();
    manifest.capabilities = [Capability::NodeFiles, Capability::Kv, Capability::Http].into();
    let bytes = orc_manifest::embed(&strip_manifest(MISBEHAVE.bytes), &manifest).unwrap();
    let files_only = Grants::none()
        .with(Capability::NodeFiles)
        .with(Capability::Kv)
        .with(Capability::Http);
    let plugin = rt
        .load_bytes(&Digest::of(&bytes), &bytes, PluginKind::Adaptor, &files_only)
        .unwrap();
    assert!(!plugin.linked_capabilities().contains(&Capability::NodeCommands));
    let mut instance = plugin.adaptor(&ctx).await.unwrap();
    let err = instance
        .read(&target("misbehave", "/x", json!({"behave": "node"})))
        .await
        .unwrap_err();
    let returned = err.plugin_error().unwrap_or_else(|| panic!("a returned error, not {err}"));
    assert_eq!(returned.kind, PluginErrorKind::Denied, "{err}");
    assert!(returned.message.contains("`node-commands` is not granted"), "{err}");

    // The unchanged fixture (it requests every capability, hence `Grants::all()`) under full
    // grants: `run` is not refused for want of a grant.
    let plugin = load(&rt, &MISBEHAVE, &Grants::all());
    let mut instance = plugin.adaptor(&ctx).await.unwrap();
    let outcome = instance.read(&target("misbehave", "/x", json!({"behave": "node"}))).await;
    if let Err(e) = outcome {
        assert!(!e.to_string().contains("not granted"), "{e}");
    }
}

#[test]
fn node_files_do_not_grant_node_commands_at_load() {
    let rt = runtime();
    let digest: Digest = MISBEHAVE.digest.parse().unwrap();
    let files = Grants::none()
        .with(Capability::NodeFiles)
        .with(Capability::Kv)
        .with(Capability::Http);
    let err = rt.load_bytes(&digest, MISBEHAVE.bytes, PluginKind::Adaptor, &files).unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::NotGranted {
                capability: Capability::NodeCommands,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("`node-commands`"), "{err}");
}
