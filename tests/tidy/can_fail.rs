//! Each tidy rule run on a small tree made to break it: it finds exactly the offending files and
//! lines, and leaves alone what it allows (build output, comments, test code, harnesses).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::checks::{self, Finding};

fn write(root: &Path, path: &str, text: &str) {
    let path = root.join(path);
    std::fs::create_dir_all(path.parent().expect("a file in a folder")).expect("create the folder");
    std::fs::write(&path, text).expect("write the file");
}

fn found(findings: &[Finding]) -> Vec<(String, usize)> {
    findings.iter().map(|f| (f.path.display().to_string(), f.line)).collect()
}

fn cargo() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

#[test]
fn a_file_without_a_header_is_found_and_build_output_is_not_source() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path();
    write(root, "host/src/lib.rs", "//! The host.\nmod a;\n");
    write(root, "host/src/a.rs", "// A plain comment is no header.\npub fn a() {}\n");
    write(root, "plugins/x/src/lib.rs", "\n//! A blank line first.\n");
    write(root, "target/debug/build/out/bindings.rs", "pub fn generated() {}\n");
    write(root, "target-bench/x.rs", "pub fn generated() {}\n");
    write(root, ".git/hooks/x.rs", "\n");

    let findings = checks::files_without_header(root).expect("read the tree");
    assert_eq!(
        found(&findings),
        [("host/src/a.rs".to_string(), 1), ("plugins/x/src/lib.rs".to_string(), 1)]
    );
    assert_eq!(
        findings[0].to_string(),
        "host/src/a.rs:1: the file does not open with a `//!` header: \"// A plain comment is no header.\""
    );
}

#[test]
fn a_use_outside_its_home_is_found_by_file_and_line() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path();
    write(root, "host/src/store/db.rs", "//! The store.\nuse sqlx::SqlitePool;\n");
    write(
        root,
        "host/src/api/nodes.rs",
        "//! Handlers.\n/// Never sqlx here.\n// sqlx neither.\nfn f() {\n    let q = sqlx::query(\"SELECT 1\");\n}\n",
    );
    write(
        root,
        "host/src/app.rs",
        "//! App.\n#[cfg(test)]\nmod tests {\n    use sqlx::Row;\n\n    fn g() {\n        sqlx::query(\"\");\n    }\n}\n\npub fn after() { sqlx::query(\"\"); }\n",
    );
    write(root, "host/src/scheduler/mod.rs", "//! S.\n#[cfg(test)]\nmod tests;\n");
    write(root, "host/src/scheduler/tests.rs", "//! Its tests.\nuse sqlx::Row;\n");
    write(root, "host/tests/it/store/cases.rs", "//! Harness.\nuse sqlx::PgConnection;\n");
    write(root, "host/examples/bench.rs", "//! Bench.\nuse sqlx::PgConnection;\n");
    write(root, "tests/e2e/main.rs", "//! E2e.\nuse sqlx::PgConnection;\n");

    let findings = checks::mentions_outside(root, "sqlx", &["host/src/store/"]).expect("read the tree");
    assert_eq!(
        found(&findings),
        [("host/src/api/nodes.rs".to_string(), 5), ("host/src/app.rs".to_string(), 11)]
    );
    assert_eq!(
        findings[0].to_string(),
        "host/src/api/nodes.rs:5: `sqlx` outside host/src/store/: let q = sqlx::query(\"SELECT 1\");"
    );
}

#[test]
fn a_store_row_served_as_an_api_view_is_found() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path();
    write(root, "host/src/store/ids.rs", "//! Ids.\n#[derive(ToSchema)]\npub struct Id;\n");
    write(
        root,
        "host/src/store/model.rs",
        "//! Rows.\n#[derive(Serialize, ToSchema)]\npub struct Row;\n",
    );
    write(root, "host/src/api/views.rs", "//! Views.\n#[derive(ToSchema)]\npub struct View;\n");

    let findings = checks::mentions_within(root, "ToSchema", "host/src/store/", &["host/src/store/ids.rs"]).expect("read the tree");
    assert_eq!(found(&findings), [("host/src/store/model.rs".to_string(), 2)]);
    assert_eq!(
        findings[0].to_string(),
        "host/src/store/model.rs:2: `ToSchema` in host/src/store/: #[derive(Serialize, ToSchema)]"
    );
}

#[test]
fn a_plugin_running_apt_get_itself_is_found() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path();
    write(
        root,
        "sdk/guest/src/node/apt.rs",
        "//! Apt.\npub fn get() -> Command { Command::new(\"flock\").args([\"apt-get\"]) }\n",
    );
    write(
        root,
        "plugins/redis/src/lib.rs",
        "//! Redis; installs with `apt-get` through the SDK.\nfn install() {\n    node::run(&Command::new(\"apt-get\").args([\"install\", \"redis-server\"]));\n}\n",
    );
    write(
        root,
        "plugins/shell/src/lib.rs",
        "//! Shell.\nconst SCRIPT: &str = \"set -e; DEBIAN_FRONTEND=noninteractive apt-get -y install jq\";\n",
    );
    write(
        root,
        "host/src/x.rs",
        "//! X.\n#[cfg(test)] mod t { fn f() { run(\"apt-get\"); } }\n",
    );

    let findings = checks::mentions_outside(root, "apt-get", &["sdk/guest/src/node/apt.rs"]).expect("read the tree");
    assert_eq!(
        found(&findings),
        [
            ("plugins/redis/src/lib.rs".to_string(), 3),
            ("plugins/shell/src/lib.rs".to_string(), 2)
        ]
    );
}

/// A workspace of path crates standing in for the real ones (no registry needed): `orc-ssh`
/// reaches `sqlx-core` directly, `orc-runtime` reaches `axum` through `middle` only when it
/// enables `middle`'s `server` feature.
fn workspace(root: &Path, runtime_enables_server: bool) {
    let package =
        |name: &str, deps: &str| format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[dependencies]\n{deps}");
    write(
        root,
        "Cargo.toml",
        "[workspace]\nresolver = \"3\"\nmembers = [\"runtime\", \"ssh\", \"middle\", \"axum\", \"sqlx-core\", \"tools\"]\n",
    );
    let runtime_deps = if runtime_enables_server {
        "middle = { path = \"../middle\", features = [\"server\"] }\n"
    } else {
        "middle = { path = \"../middle\" }\n"
    };
    write(root, "runtime/Cargo.toml", &package("orc-runtime", runtime_deps));
    write(
        root,
        "ssh/Cargo.toml",
        &package(
            "orc-ssh",
            "orc-runtime = { path = \"../runtime\" }\nsqlx-core = { path = \"../sqlx-core\" }\n\n[dev-dependencies]\naxum = { path = \"../axum\" }\n",
        ),
    );
    write(
        root,
        "middle/Cargo.toml",
        &package(
            "middle",
            "axum = { path = \"../axum\", optional = true }\n\n[features]\nserver = [\"dep:axum\"]\n",
        ),
    );
    write(root, "axum/Cargo.toml", &package("axum", ""));
    write(root, "sqlx-core/Cargo.toml", &package("sqlx-core", ""));
    // Enables `server` for the workspace as a whole: must not count against orc-runtime.
    write(
        root,
        "tools/Cargo.toml",
        &package("tools", "middle = { path = \"../middle\", features = [\"server\"] }\n"),
    );
    for krate in ["runtime", "ssh", "middle", "axum", "sqlx-core", "tools"] {
        write(root, &format!("{krate}/src/lib.rs"), "//! A stand-in.\n");
    }
    let status = Command::new(cargo())
        .current_dir(root)
        .args(["generate-lockfile", "--offline", "--quiet"])
        .status()
        .expect("run cargo generate-lockfile");
    assert!(status.success(), "cargo generate-lockfile failed in {}", root.display());
}

#[test]
fn a_forbidden_dependency_is_found_directly_or_behind_a_feature() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path();
    let forbidden = &["axum", "sqlx"];

    workspace(root, false);
    let runtime = checks::forbidden_dependencies(&cargo(), root, "orc-runtime", forbidden).expect("cargo tree");
    assert_eq!(runtime, [], "the feature `tools` enables is not orc-runtime's");
    let ssh = checks::forbidden_dependencies(&cargo(), root, "orc-ssh", forbidden).expect("cargo tree");
    assert_eq!(found(&ssh), [("ssh/Cargo.toml".to_string(), 8)], "{ssh:?}");
    assert_eq!(
        ssh[0].to_string(),
        "ssh/Cargo.toml:8: orc-ssh depends on sqlx-core v0.1.0 (orc-ssh → sqlx-core)"
    );

    workspace(root, true);
    let runtime = checks::forbidden_dependencies(&cargo(), root, "orc-runtime", forbidden).expect("cargo tree");
    assert_eq!(found(&runtime), [("runtime/Cargo.toml".to_string(), 7)], "{runtime:?}");
    assert!(runtime[0].what.ends_with("(orc-runtime → middle → axum)"), "{}", runtime[0]);
    let ssh = checks::forbidden_dependencies(&cargo(), root, "orc-ssh", forbidden).expect("cargo tree");
    assert_eq!(ssh.len(), 2, "through orc-runtime now too: {ssh:?}");
}

#[test]
fn talk_of_how_the_product_is_made_is_found_in_every_kind_of_file() {
    // The words are spelled with an escape here, so that this file does not say them itself.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path();
    write(
        root,
        "README.md",
        "# orc\n\n### S\x74op 30: faster\nServices stop, start and restart.\n",
    );
    write(root, "docs/guide.md", "A process s\x74ops 2 s after\nthe non-s\x74op 4 lanes\n");
    write(
        root,
        "host/src/a.rs",
        "//! A.\n// As the re\x76iewer asked.\nfn stop(n: u8) {}\nfn f() { stop(3); }\n",
    );
    write(root, ".ci/run", "#!/bin/sh\n# added this s\x74op\n");
    write(root, "target/debug/notes.md", "s\x74op 5\n");
    write(root, ".git/COMMIT_EDITMSG", "s\x74op 5\n");
    write(root, "host/migrations/sqlite/0001_init.sql", "-- made in s\x74op 5\n");
    let findings = checks::development_talk(root).expect("read the tree");
    assert_eq!(
        found(&findings),
        [
            (".ci/run".to_string(), 2),
            ("README.md".to_string(), 3),
            ("host/src/a.rs".to_string(), 2),
        ]
    );
}

#[test]
fn a_fixture_no_test_names_is_found() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path();
    write(
        root,
        "host/tests/it/a.rs",
        "//! A.\nuse orc_plugin_artifacts::MISBEHAVE;\n// WRONG_WORLDS is another word.\n",
    );
    write(root, "host/src/lib.rs", "//! Not a test.\nconst X: &str = \"GREEDY_SOLVER\";\n");
    let findings = checks::untested_fixtures(root, &["MISBEHAVE", "WRONG_WORLD", "GREEDY_SOLVER"]).expect("read the tree");
    let named: Vec<String> = findings.iter().map(|f| f.what.clone()).collect();
    assert_eq!(
        named,
        [
            "fixture `WRONG_WORLD` is used by no test",
            "fixture `GREEDY_SOLVER` is used by no test"
        ]
    );
}

#[test]
fn a_rust_example_where_documentation_tests_are_off_is_found() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path();
    write(root, "a/Cargo.toml", "[package]\nname = \"a\"\n\n[lib]\ndoctest = false\n");
    write(
        root,
        "a/src/lib.rs",
        "//! A.\n//!\n//! ```text\n//! a diagram\n//! ```\n\n/// ```\n/// f();\n/// ```\npub fn f() {}\n",
    );
    write(root, "b/Cargo.toml", "[package]\nname = \"b\"\n");
    write(root, "b/src/lib.rs", "//! B.\n//!\n//! ```\n//! b();\n//! ```\n");
    let findings = checks::examples_no_test_runs(root).expect("read the tree");
    assert_eq!(found(&findings), [("a/src/lib.rs".to_string(), 7)]);
}
