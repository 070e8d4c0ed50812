//! Builds the first-party plugins and the test fixtures for wasm32-wasip2, the same way
//! `orc-plugin build` does (manifest embedded, so digests match), and generates a constant per
//! plugin. Guests build in their own target directory with the `plugin` profile, one cargo
//! invocation per plugin so the guest SDK's per-kind features never unify.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use orc_manifest::project::PluginProject;

/// (constant name, crate directory relative to the repository root, is a test fixture)
const PLUGINS: &[(&str, &str, bool)] = &[
    ("FILE", "plugins/file", false),
    ("DIRECTORY", "plugins/directory", false),
    ("BENCH_MEMORY", "plugins/bench-memory", false),
    ("SYMLINK", "plugins/symlink", false),
    ("COMMAND", "plugins/command", false),
    ("PROCESS", "plugins/process", false),
    ("PACKAGE", "plugins/package", false),
    ("HTTP_OBJECT", "plugins/http-object", false),
    ("LAYOUT_SOLVER", "plugins/layout-solver", false),
    ("SHELL", "plugins/shell", false),
    ("REDIS", "plugins/redis", false),
    ("MISBEHAVE", "plugins/fixtures/misbehave", true),
    ("WRONG_WORLD", "plugins/fixtures/wrong-world", true),
    ("GREEDY_SOLVER", "plugins/fixtures/greedy-solver", true),
];

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest_dir
        .parent()
        .and_then(Path::parent)
        .expect("plugins/artifacts sits two levels below the root")
        .to_path_buf();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("plugins");
    let cargo = PathBuf::from(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));

    for watched in ["sdk/guest", "wit", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }

    let mut code = String::new();
    let mut first_party = Vec::new();
    let mut fixtures = Vec::new();
    for (constant, dir, fixture) in PLUGINS {
        let dir = root.join(dir);
        println!("cargo:rerun-if-changed={}", dir.display());
        let project = PluginProject::load(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let built = project
            .build(&cargo, "plugin", Some(&target_dir), |_| {})
            .unwrap_or_else(|e| panic!("building plugin {}: {e}", dir.display()));
        let path = built
            .write_to(&out_dir)
            .unwrap_or_else(|e| panic!("writing {}: {e}", built.file_name()));
        let m = &built.manifest;
        writeln!(
            code,
            "/// `{name}@{version}` ({kind}): {description}\npub const {constant}: Artifact = Artifact {{ name: {name:?}, version: {version:?}, kind: {kind:?}, digest: {digest:?}, path: {path:?}, bytes: include_bytes!({path:?}) }};",
            name = m.name,
            version = m.version,
            kind = m.kind.as_str(),
            description = m.description,
            digest = built.digest.to_string(),
            path = path.display().to_string(),
        )
        .expect("write to string");
        if *fixture {
            fixtures.push(*constant)
        } else {
            first_party.push(*constant)
        }
    }
    writeln!(
        code,
        "/// The plugins that ship with orc.\npub const FIRST_PARTY: &[Artifact] = &[{}];",
        first_party.join(", ")
    )
    .expect("write");
    writeln!(
        code,
        "/// Plugins that misbehave on purpose, for tests.\npub const FIXTURES: &[Artifact] = &[{}];",
        fixtures.join(", ")
    )
    .expect("write");
    std::fs::write(out_dir.join("artifacts.rs"), code).expect("write artifacts.rs");
}
