//! A plugin crate on disk and how it becomes an artifact: `cargo build --target wasm32-wasip2`,
//! then the manifest (from `[package.metadata.orc]`) embedded into the component.
//!
//! Used by `orc-plugin build` and by the build script that compiles the first-party plugins and
//! test fixtures, so both produce byte-identical artifacts from the same sources.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;

use crate::{Capability, Digest, Manifest, ManifestError, PluginKind, embed};

/// The Wasm target plugins are built for; it emits components directly.
pub const TARGET: &str = "wasm32-wasip2";

#[derive(Debug, thiserror::Error)]
pub enum ProjectError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid Cargo.toml: {message}")]
    CargoToml { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Metadata { path: PathBuf, message: String },
    #[error("cannot run cargo")]
    Spawn(#[source] std::io::Error),
    #[error("cargo build failed{hint}:\n{diagnostics}")]
    Build { diagnostics: String, hint: String },
    #[error("cargo built no .wasm for package `{0}`: is it a `cdylib`?")]
    NoArtifact(String),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

/// A plugin crate: its directory, Cargo package name and the manifest it declares.
#[derive(Debug, Clone)]
pub struct PluginProject {
    pub dir: PathBuf,
    pub package: String,
    pub manifest: Manifest,
}

#[derive(Deserialize)]
struct CargoToml {
    package: Option<Package>,
}

#[derive(Deserialize)]
struct Package {
    name: String,
    version: Option<toml::Value>,
    description: Option<toml::Value>,
    metadata: Option<PackageMetadata>,
}

#[derive(Deserialize)]
struct PackageMetadata {
    orc: Option<OrcMetadata>,
}

/// `[package.metadata.orc]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct OrcMetadata {
    kind: String,
    name: Option<String>,
    #[serde(default)]
    capabilities: Vec<String>,
    #[serde(default)]
    resource_types: Vec<String>,
    description: Option<String>,
}

impl PluginProject {
    /// Reads `dir/Cargo.toml`. The plugin's name defaults to the package name, its version and
    /// description to the package's; `[package.metadata.orc]` gives the kind and capabilities.
    pub fn load(dir: &Path) -> Result<PluginProject, ProjectError> {
        let path = dir.join("Cargo.toml");
        let text = std::fs::read_to_string(&path).map_err(|source| ProjectError::Read {
            path: path.clone(),
            source,
        })?;
        let parsed: CargoToml = toml::from_str(&text).map_err(|e| ProjectError::CargoToml {
            path: path.clone(),
            message: e.message().to_string(),
        })?;
        let meta_err = |message: String| ProjectError::Metadata {
            path: path.clone(),
            message,
        };
        let package = parsed
            .package
            .ok_or_else(|| meta_err("no [package]: point at a plugin crate, not a workspace".into()))?;
        let orc = package
            .metadata
            .and_then(|m| m.orc)
            .ok_or_else(|| meta_err("no [package.metadata.orc] table: this is not an orc plugin crate".into()))?;
        let version = match package.version {
            Some(toml::Value::String(v)) => v,
            Some(v) if is_inherited(&v) => workspace_package_field(dir, "version").ok_or_else(|| {
                meta_err("package.version is inherited, but no enclosing workspace sets [workspace.package] version".into())
            })?,
            Some(_) => return Err(meta_err("package.version must be a string".into())),
            None => "0.0.0".into(),
        };
        let description = orc
            .description
            .or(match package.description {
                Some(toml::Value::String(d)) => Some(d),
                _ => None,
            })
            .unwrap_or_default();
        let kind: PluginKind = orc.kind.parse().map_err(|e: ManifestError| meta_err(e.to_string()))?;
        let mut capabilities = BTreeSet::new();
        for c in &orc.capabilities {
            capabilities.extend(Capability::parse_requested(c).map_err(|e| meta_err(e.to_string()))?);
        }
        let manifest = Manifest {
            name: orc.name.unwrap_or_else(|| package.name.clone()),
            version,
            kind,
            world: kind.world(),
            capabilities,
            resource_types: orc.resource_types,
            description,
        };
        manifest.validate().map_err(|e| meta_err(e.to_string()))?;
        Ok(PluginProject {
            dir: dir.to_path_buf(),
            package: package.name,
            manifest,
        })
    }

    /// The `cargo build` command for this crate. `profile` is `release` for `orc-plugin build` and
    /// `plugin` inside this repository; `target_dir` overrides Cargo's.
    pub fn build_command(&self, cargo: &Path, profile: &str, target_dir: Option<&Path>) -> Command {
        let mut cmd = Command::new(cargo);
        cmd.arg("build").arg("--manifest-path").arg(self.dir.join("Cargo.toml")).args([
            "--target",
            TARGET,
            "--profile",
            profile,
            "--message-format=json-render-diagnostics",
            "-p",
            &self.package,
        ]);
        if let Some(dir) = target_dir {
            cmd.arg("--target-dir").arg(dir);
        }
        // A build script's environment describes the outer build (its flags, wrappers and target
        // dir); none of it applies to the guest build.
        for var in [
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_TARGET_DIR",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "CARGO_BUILD_TARGET",
        ] {
            cmd.env_remove(var);
        }
        cmd
    }

    /// Builds the crate and returns the component with its manifest embedded. `progress` sees the
    /// name of every crate Cargo finishes, for progress display.
    pub fn build(
        &self,
        cargo: &Path,
        profile: &str,
        target_dir: Option<&Path>,
        mut progress: impl FnMut(&str),
    ) -> Result<BuiltPlugin, ProjectError> {
        let mut child = self
            .build_command(cargo, profile, target_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(ProjectError::Spawn)?;
        let stderr = child.stderr.take().expect("piped");
        let stderr_reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = BufReader::new(stderr).read_to_string(&mut text);
            text
        });
        let mut wasm: Option<PathBuf> = None;
        let mut diagnostics = String::new();
        for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
            let line = line.map_err(ProjectError::Spawn)?;
            let Ok(msg) = serde_json::from_str::<CargoMessage>(&line) else {
                continue;
            };
            match msg.reason.as_str() {
                "compiler-artifact" => {
                    let name = msg.target.as_ref().map(|t| t.name.as_str()).unwrap_or("?");
                    progress(name);
                    if msg.package_id.as_deref().is_some_and(|id| package_id_names(id, &self.package))
                        && let Some(f) = msg.filenames.iter().find(|f| f.ends_with(".wasm"))
                    {
                        wasm = Some(PathBuf::from(f));
                    }
                }
                "compiler-message" => {
                    if let Some(rendered) = msg.message.as_ref().and_then(|m| m.rendered.as_deref()) {
                        diagnostics.push_str(rendered);
                    }
                }
                _ => {}
            }
        }
        let status = child.wait().map_err(ProjectError::Spawn)?;
        let stderr_text = stderr_reader.join().unwrap_or_default();
        if !status.success() {
            diagnostics.push_str(&stderr_text);
            let hint = if diagnostics.contains("target may not be installed") || diagnostics.contains("can't find crate for `core`") {
                format!(" (the {TARGET} target is missing: run `rustup target add {TARGET}`)")
            } else {
                String::new()
            };
            return Err(ProjectError::Build { diagnostics, hint });
        }
        let artifact = wasm.ok_or_else(|| ProjectError::NoArtifact(self.package.clone()))?;
        let raw = std::fs::read(&artifact).map_err(|source| ProjectError::Read {
            path: artifact.clone(),
            source,
        })?;
        let bytes = embed(&raw, &self.manifest)?;
        Ok(BuiltPlugin {
            digest: Digest::of(&bytes),
            manifest: self.manifest.clone(),
            bytes,
            cargo_artifact: artifact,
        })
    }
}

fn is_inherited(v: &toml::Value) -> bool {
    v.as_table().and_then(|t| t.get("workspace")).and_then(toml::Value::as_bool) == Some(true)
}

/// `[workspace.package] <field>` of the nearest enclosing workspace, for `field.workspace = true`.
fn workspace_package_field(dir: &Path, field: &str) -> Option<String> {
    let dir = dir.canonicalize().ok()?;
    dir.ancestors().skip(1).find_map(|d| {
        let text = std::fs::read_to_string(d.join("Cargo.toml")).ok()?;
        let table: toml::Table = toml::from_str(&text).ok()?;
        let ws = table.get("workspace")?.as_table()?;
        Some(ws.get("package")?.as_table()?.get(field)?.as_str()?.to_string())
    })
}

/// A built plugin: the component bytes (manifest embedded) and their digest.
#[derive(Debug, Clone)]
pub struct BuiltPlugin {
    pub manifest: Manifest,
    pub bytes: Vec<u8>,
    pub digest: Digest,
    /// The component as Cargo wrote it, before the manifest was embedded.
    pub cargo_artifact: PathBuf,
}

impl BuiltPlugin {
    /// The file name the artifact is written under: `<name>-<version>.wasm`.
    pub fn file_name(&self) -> String {
        format!("{}-{}.wasm", self.manifest.name, self.manifest.version)
    }

    /// Writes `<name>-<version>.wasm` and `<name>-<version>.manifest.json` into `dir`; returns the
    /// component's path.
    pub fn write_to(&self, dir: &Path) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(self.file_name());
        write_if_changed(&path, &self.bytes)?;
        let manifest_path = dir.join(format!("{}-{}.manifest.json", self.manifest.name, self.manifest.version));
        write_if_changed(&manifest_path, self.manifest.to_json().as_bytes())?;
        Ok(path)
    }
}

/// Leaves an identical file untouched so its mtime does not trigger rebuilds downstream.
fn write_if_changed(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(tmp, path)
}

#[derive(Deserialize)]
struct CargoMessage {
    reason: String,
    package_id: Option<String>,
    target: Option<CargoTarget>,
    #[serde(default)]
    filenames: Vec<String>,
    message: Option<CargoDiagnostic>,
}

#[derive(Deserialize)]
struct CargoTarget {
    name: String,
}

#[derive(Deserialize)]
struct CargoDiagnostic {
    rendered: Option<String>,
}

/// Whether a Cargo package id (`path+file:///…/file#orc-plugin-file@0.1.0` or the older
/// `name version (source)` form) names `package`.
fn package_id_names(id: &str, package: &str) -> bool {
    if let Some((_, frag)) = id.rsplit_once('#') {
        let name = frag.split('@').next().unwrap_or(frag);
        // `…/file#0.1.0` means the package is named like the directory.
        if name.chars().next().is_some_and(|c| c.is_ascii_digit()) {
            let path = id.rsplit_once('#').map(|(p, _)| p).unwrap_or(id);
            return path.rsplit('/').next() == Some(package);
        }
        return name == package;
    }
    id.split(' ').next() == Some(package)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_ids_in_both_forms() {
        assert!(package_id_names(
            "path+file:///w/plugins/file#orc-plugin-file@0.1.0",
            "orc-plugin-file"
        ));
        assert!(package_id_names("path+file:///w/plugins/hello#0.1.0", "hello"));
        assert!(!package_id_names("path+file:///w/plugins/hello#0.1.0", "other"));
        assert!(package_id_names("hello 0.1.0 (path+file:///w/hello)", "hello"));
    }

    #[test]
    fn reads_plugin_metadata_and_names_bad_keys() {
        let dir = std::env::temp_dir().join(format!("orc-manifest-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |s: &str| std::fs::write(dir.join("Cargo.toml"), s).unwrap();
        write(
            "[package]\nname = \"motd\"\nversion = \"1.2.3\"\ndescription = \"d\"\n[package.metadata.orc]\nkind = \"adaptor\"\ncapabilities = [\"node\"]\nresource-types = [\"motd\"]\n",
        );
        let p = PluginProject::load(&dir).unwrap();
        assert_eq!(p.manifest.name, "motd");
        assert_eq!(p.manifest.version, "1.2.3");
        assert_eq!(p.manifest.world, "orc:plugin/adaptor@0.1.0");
        // `node` is both node capabilities (manifests written before the split).
        assert!(p.manifest.capabilities.contains(&Capability::NodeFiles));
        assert!(p.manifest.capabilities.contains(&Capability::NodeCommands));

        write("[package]\nname = \"motd\"\nversion = \"1.2.3\"\n[package.metadata.orc]\nkind = \"adaptor\"\ncapabilites = [\"node\"]\n");
        let err = PluginProject::load(&dir).unwrap_err().to_string();
        assert!(err.contains("capabilites"), "{err}");

        write("[package]\nname = \"motd\"\nversion = \"1.2.3\"\n[package.metadata.orc]\nkind = \"solver\"\ncapabilities = [\"node\"]\n");
        let err = PluginProject::load(&dir).unwrap_err().to_string();
        assert!(err.contains("may not request capability `node-files`"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
