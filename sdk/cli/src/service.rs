//! `orc-plugin publish-service`: publish a service version to a registry's catalog from a TOML or
//! JSON file. An automator named `name@version` is pinned to its digest in that registry first,
//! so the published document always names its automator by digest; the document is checked here
//! as the registry will check it, so a mistake is named before anything is sent.

use std::path::Path;

use anyhow::{Context, Result, bail};
use orc_registry::Registry;
use serde_json::Value;

pub fn publish(file: &Path, registry: &str, token: Option<&str>, json: bool) -> Result<()> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut doc: Value = if file.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", file.display()))?
    } else {
        let value: toml::Value = toml::from_str(&text).with_context(|| format!("{} is not valid TOML", file.display()))?;
        serde_json::to_value(value)?
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let published = runtime.block_on(async {
        let registry = Registry::open(registry)
            .with_context(|| format!("opening registry {registry}"))?
            .with_token(token);
        pin_automator(&registry, &mut doc).await?;
        let bytes = serde_json::to_vec_pretty(&doc)?;
        let parsed = orc_registry::parse_service(&bytes).with_context(|| format!("{} is not a publishable service", file.display()))?;
        orc_registry::services::check_schemas(&parsed).with_context(|| format!("{} is not a publishable service", file.display()))?;
        registry
            .publish_service(bytes)
            .await
            .with_context(|| format!("publishing {} to {registry}", parsed.reference()))
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
        println!("{verb} service {} to {registry}", e.reference());
        println!("{}", e.digest);
    }
    Ok(())
}

/// `automator = "name@version"` becomes the digest that version has in `registry`.
async fn pin_automator(registry: &Registry, doc: &mut Value) -> Result<()> {
    let Some(reference) = doc.get("automator").and_then(Value::as_str).map(str::to_string) else {
        bail!("automator: the service names no automator (a `sha256:` digest or `name@version`)");
    };
    if reference.starts_with("sha256:") {
        return Ok(());
    }
    let Some((name, version)) = reference.split_once('@') else {
        bail!("automator: `{reference}` is neither a `sha256:` digest nor `name@version`");
    };
    let entry = registry
        .resolve(name, version)
        .await
        .with_context(|| format!("automator: resolving `{reference}` in {registry}"))?;
    doc["automator"] = Value::String(entry.digest.to_string());
    Ok(())
}
