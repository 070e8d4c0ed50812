//! `orc-plugin build`: compile the crate for wasm32-wasip2, embed the manifest, check with the
//! host's own runtime that the component implements its kind's world and imports only what its
//! manifest requests, then write it out and print its digest.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use orc_manifest::project::{BuiltPlugin, PluginProject};
use orc_runtime::{Grants, Runtime, RuntimeConfig};

pub struct Built {
    pub plugin: BuiltPlugin,
    pub path: PathBuf,
}

pub fn run(dir: Option<PathBuf>, out: Option<PathBuf>, profile: &str, json: bool) -> Result<Built> {
    let dir = dir.unwrap_or_else(|| PathBuf::from("."));
    let built = build(&dir, out.as_deref(), profile)?;
    let m = &built.plugin.manifest;
    if json {
        let value = serde_json::json!({
            "path": built.path,
            "digest": built.plugin.digest.to_string(),
            "size": built.plugin.bytes.len(),
            "manifest": m,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        println!(
            "built {} {} ({}, {} bytes)",
            m.kind,
            m.reference(),
            built.path.display(),
            built.plugin.bytes.len()
        );
        println!("{}", built.plugin.digest);
    }
    Ok(built)
}

/// Builds and checks the plugin crate in `dir`; writes to `out` (default `DIR/target/orc`).
pub fn build(dir: &Path, out: Option<&Path>, profile: &str) -> Result<Built> {
    let project = PluginProject::load(dir)?;
    let bar = ProgressBar::new_spinner();
    bar.set_style(ProgressStyle::with_template("{spinner} {elapsed:>3} {msg}").expect("valid template"));
    bar.enable_steady_tick(Duration::from_millis(120));
    bar.set_message(format!("compiling {} for wasm32-wasip2", project.manifest.reference()));
    let started = Instant::now();
    let mut count = 0usize;
    // Cargo's own variable, as `cargo build` honours it: where the crates are compiled.
    let target_dir = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from);
    let result = project.build(Path::new("cargo"), profile, target_dir.as_deref(), |krate| {
        count += 1;
        bar.set_message(format!("compiled {count} crates, last {krate}"));
    });
    bar.finish_and_clear();
    let plugin = result.with_context(|| format!("building {}", dir.display()))?;
    tracing::info!(secs = started.elapsed().as_secs_f64(), "compiled");

    check(&plugin)?;
    let out = out.map(Path::to_path_buf).unwrap_or_else(|| dir.join("target").join("orc"));
    let path = plugin.write_to(&out).with_context(|| format!("writing into {}", out.display()))?;
    Ok(Built { plugin, path })
}

/// Loads the component in the host's runtime with every capability granted (what is checked here
/// is the component against its own manifest; environments grant at submission): this refuses a
/// component that does not export its kind's interface, or that imports a capability its manifest
/// does not request, with the same message the host would give.
pub fn check(plugin: &BuiltPlugin) -> Result<()> {
    let runtime = Runtime::new(RuntimeConfig {
        pooling: false,
        ..RuntimeConfig::default()
    })
    .context("starting the Wasm runtime")?;
    runtime
        .load_bytes(&plugin.digest, &plugin.bytes, plugin.manifest.kind, &Grants::all())
        .with_context(|| format!("{} does not pass the host's checks", plugin.manifest.reference()))?;
    Ok(())
}
