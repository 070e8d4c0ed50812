//! The guest SDK, carried inside `orc-plugin` and written out on demand to
//! `$ORC_HOME/sdk/<version>-<hash>/` (default `~/.orc`), so a scaffolded plugin's path dependency
//! resolves anywhere. The SDK's `Cargo.toml` is rewritten to stand alone: every
//! `workspace = true` is replaced by the workspace's pin.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use toml::{Table, Value};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/sdk_files.rs"));
}

/// `$ORC_HOME`, or `~/.orc`.
pub fn orc_home() -> Result<PathBuf> {
    if let Some(h) = std::env::var_os("ORC_HOME") {
        return Ok(PathBuf::from(h));
    }
    let home = std::env::var_os("HOME").context("neither ORC_HOME nor HOME is set")?;
    Ok(PathBuf::from(home).join(".orc"))
}

/// Writes the SDK (if not there already) and returns the directory of the `orc-sdk` crate.
pub fn ensure_sdk() -> Result<PathBuf> {
    let hash = orc_manifest::Digest::of(
        embedded::FILES
            .iter()
            .flat_map(|(p, c)| [p.as_bytes(), c.as_bytes()])
            .collect::<Vec<_>>()
            .concat()
            .as_slice(),
    );
    let base = orc_home()?
        .join("sdk")
        .join(format!("{}-{}", env!("CARGO_PKG_VERSION"), &hash.hex()[..12]));
    let crate_dir = base.join("sdk/guest");
    if base.join(".complete").exists() {
        return Ok(crate_dir);
    }
    let tmp = base.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let workspace: Table = toml::from_str(file("Cargo.toml")?).context("embedded workspace Cargo.toml")?;
    for (path, content) in embedded::FILES {
        let dest = tmp.join(path);
        let text = match *path {
            "Cargo.toml" => continue,
            "sdk/guest/Cargo.toml" => standalone_manifest(content, &workspace)?,
            _ => content.to_string(),
        };
        std::fs::create_dir_all(dest.parent().expect("file has a parent")).with_context(|| format!("creating {}", dest.display()))?;
        std::fs::write(&dest, text).with_context(|| format!("writing {}", dest.display()))?;
    }
    std::fs::write(tmp.join(".complete"), b"")?;
    match std::fs::rename(&tmp, &base) {
        Ok(()) => {}
        // Another process finished first: theirs is identical.
        Err(_) if base.join(".complete").exists() => {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        Err(e) => return Err(e).with_context(|| format!("moving the SDK into {}", base.display())),
    }
    Ok(crate_dir)
}

fn file(path: &str) -> Result<&'static str> {
    embedded::FILES
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, c)| *c)
        .with_context(|| format!("{path} is not embedded"))
}

/// The SDK's manifest with every `workspace = true` resolved against the workspace's pins.
fn standalone_manifest(sdk: &str, workspace: &Table) -> Result<String> {
    let mut manifest: Table = toml::from_str(sdk).context("embedded sdk/guest/Cargo.toml")?;
    let ws = workspace.get("workspace").and_then(Value::as_table).context("no [workspace]")?;
    let ws_package = ws.get("package").and_then(Value::as_table).cloned().unwrap_or_default();
    let ws_deps = ws.get("dependencies").and_then(Value::as_table).cloned().unwrap_or_default();
    manifest.remove("lints");
    if let Some(Value::Table(package)) = manifest.get_mut("package") {
        for (key, value) in package.iter_mut() {
            if is_inherited(value) {
                *value = ws_package
                    .get(key)
                    .cloned()
                    .with_context(|| format!("workspace has no package.{key}"))?;
            }
        }
        package.insert("publish".into(), Value::Boolean(false));
    }
    for section in ["dependencies", "dev-dependencies", "build-dependencies"] {
        let Some(Value::Table(deps)) = manifest.get_mut(section) else {
            continue;
        };
        for (name, spec) in deps.iter_mut() {
            if !is_inherited(spec) {
                continue;
            }
            let mut resolved = match ws_deps.get(name).with_context(|| format!("workspace pins no `{name}`"))? {
                Value::String(v) => Table::from_iter([("version".to_string(), Value::String(v.clone()))]),
                Value::Table(t) => t.clone(),
                other => bail!("unexpected workspace pin for `{name}`: {other}"),
            };
            if resolved.contains_key("path") {
                bail!("the SDK depends on the workspace crate `{name}`, which cannot be vendored");
            }
            if let Value::Table(local) = spec {
                for (k, v) in local.iter() {
                    match k.as_str() {
                        "workspace" => {}
                        "features" => {
                            let mut all = resolved.get("features").and_then(Value::as_array).cloned().unwrap_or_default();
                            all.extend(v.as_array().cloned().unwrap_or_default());
                            resolved.insert("features".into(), Value::Array(all));
                        }
                        _ => {
                            resolved.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            *spec = Value::Table(resolved);
        }
    }
    Ok(format!(
        "# Written by orc-plugin from the orc-sdk sources it carries. Do not edit.\n{}",
        toml::to_string(&manifest)?
    ))
}

fn is_inherited(v: &Value) -> bool {
    v.as_table().and_then(|t| t.get("workspace")).and_then(Value::as_bool) == Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_manifest_stands_alone() {
        let workspace: Table = toml::from_str(file("Cargo.toml").unwrap()).unwrap();
        let text = standalone_manifest(file("sdk/guest/Cargo.toml").unwrap(), &workspace).unwrap();
        assert!(!text.contains("workspace"), "{text}");
        let parsed: Table = toml::from_str(&text).unwrap();
        let wit_bindgen = &parsed["dependencies"]["wit-bindgen"];
        assert_eq!(wit_bindgen["version"].as_str(), Some("=0.63.0"), "{text}");
        assert_eq!(parsed["package"]["edition"].as_str(), Some("2024"));
    }
}
