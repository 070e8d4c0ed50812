//! `orc-plugin publish`: put a component into a registry (a URL or a directory) and point its
//! `name@version` at its digest. Publishing the same bytes again is a no-op.

use std::path::PathBuf;

use anyhow::{Context, Result};
use orc_registry::Registry;

pub fn run(path: Option<PathBuf>, registry: &str, token: Option<&str>, json: bool) -> Result<()> {
    let path = path.unwrap_or_else(|| PathBuf::from("."));
    let bytes = if path.is_dir() {
        let built = crate::build::build(&path, None, "release")?;
        built.plugin.bytes
    } else {
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let digest = orc_manifest::Digest::of(&bytes);
        let manifest = orc_manifest::extract(&bytes)
            .with_context(|| format!("{} is not a valid plugin", path.display()))?
            .with_context(|| format!("{} carries no manifest: build it with `orc-plugin build`", path.display()))?;
        crate::build::check(&orc_manifest::project::BuiltPlugin {
            manifest,
            bytes: bytes.clone(),
            digest,
            cargo_artifact: path.clone(),
        })?;
        bytes
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let published = runtime.block_on(async {
        let registry = Registry::open(registry)
            .with_context(|| format!("opening registry {registry}"))?
            .with_token(token);
        registry.publish(bytes).await.with_context(|| format!("publishing to {registry}"))
    })?;
    let e = &published.entry;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "created": published.created, "entry": e }))?
        );
    } else {
        let verb = if published.created {
            "published"
        } else {
            "already published (no change)"
        };
        println!("{verb} {}@{} to {registry}", e.name, e.version);
        println!("{}", e.digest);
    }
    Ok(())
}
