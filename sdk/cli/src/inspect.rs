//! `orc-plugin inspect`: what a component is — digest, manifest, world, imports and exports.

use std::path::Path;

use anyhow::{Context, Result};
use orc_manifest::Digest;
use orc_runtime::{Runtime, RuntimeConfig};

pub fn run(file: &Path, json: bool) -> Result<()> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let digest = Digest::of(&bytes);
    let manifest = orc_manifest::extract(&bytes).with_context(|| format!("{} is not a valid plugin", file.display()))?;
    let runtime = Runtime::new(RuntimeConfig {
        pooling: false,
        ..RuntimeConfig::default()
    })
    .context("starting the Wasm runtime")?;
    let component = runtime.compile(&digest, &bytes)?;
    let (imports, exports) = orc_runtime::interfaces(&runtime, &component);
    if json {
        let value = serde_json::json!({
            "digest": digest.to_string(),
            "size": bytes.len(),
            "manifest": manifest,
            "world": manifest.as_ref().map(|m| m.world.clone()),
            "imports": imports,
            "exports": exports,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    println!("digest:  {digest}");
    println!("size:    {} bytes", bytes.len());
    match &manifest {
        Some(m) => {
            println!("plugin:  {} ({})", m.reference(), m.kind);
            println!("world:   {}", m.world);
            let caps: Vec<&str> = m.capabilities.iter().map(|c| c.as_str()).collect();
            println!(
                "capabilities requested: {}",
                if caps.is_empty() { "none".to_string() } else { caps.join(", ") }
            );
            if !m.resource_types.is_empty() {
                println!("resource types: {}", m.resource_types.join(", "));
            }
            if !m.description.is_empty() {
                println!("description: {}", m.description);
            }
        }
        None => println!("manifest: none (not built with `orc-plugin build`; the host will refuse it)"),
    }
    println!("imports:");
    for i in &imports {
        println!("  {i}");
    }
    println!("exports:");
    for e in &exports {
        println!("  {e}");
    }
    Ok(())
}
