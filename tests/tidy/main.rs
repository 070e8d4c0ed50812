//! The tidy tests: rules of this repository that no compiler checks, run over its sources and
//! its resolved dependency graph. A failure lists every offending file and line. The rules
//! themselves are in `checks`; `can_fail` shows that each one fails on a tree that breaks it.

mod can_fail;
mod checks;

use std::path::PathBuf;

use checks::{Finding, report};

/// Crates that must depend on no HTTP server and no SQL (see [`SERVER_CRATES`]): the Wasm
/// runtime and the node transports. Extend it as crates of that side appear (`orc-node`).
const WITHOUT_SERVER_DEPENDENCIES: &[&str] = &["orc-runtime", "orc-node", "orc-ssh"];

/// The HTTP server and the SQL toolkit, with their parts (`axum-core`, `sqlx-postgres`, …).
const SERVER_CRATES: &[&str] = &["axum", "sqlx"];

/// Crates that must not depend on the Wasm runtime: the node seam and its transports, which the
/// runtime binds to the WIT `node` interface and not the other way round.
const WITHOUT_WASM: &[&str] = &["orc-node", "orc-ssh"];

/// The Wasm engine, with its parts (`wasmtime-environ`, `wasmtime-wasi`, …).
const WASM_CRATES: &[&str] = &["wasmtime"];

/// The one place production code may use sqlx.
const SQL_HOME: &[&str] = &["host/src/store/"];

/// The one place production code may run `apt-get`: the SDK's apt command, which every plugin
/// uses so that apt runs on a node take turns.
const APT_HOME: &[&str] = &["sdk/guest/src/node/apt.rs"];

/// The store's files that may name the API's schema trait: its typed ids, which are values
/// the API shows as they are. Its rows are turned into the API's own views (`host/src/api/views.rs`).
const SCHEMA_IN_STORE: &[&str] = &["host/src/store/ids.rs"];

/// The host's domain modules and shared vocabulary: what the application layer (`host/src/app/`)
/// orchestrates, so none of them may import it (the application calls them, never the other way).
const BELOW_THE_APPLICATION: &[&str] = &[
    "host/src/access/",
    "host/src/clusters/",
    "host/src/intent/",
    "host/src/nodes/",
    "host/src/policy/",
    "host/src/scheduler/",
    "host/src/processes/",
    "host/src/store/",
    "host/src/error.rs",
    "host/src/executor.rs",
    "host/src/if_match.rs",
    "host/src/json.rs",
    "host/src/named.rs",
    "host/src/status.rs",
];

/// What the store, at the bottom, may not import: every layer above it.
const ABOVE_THE_STORE: &[&str] = &["crate::scheduler", "crate::executor", "crate::api", "crate::console", "crate::app"];

fn root() -> PathBuf {
    orc_tests::repo_root()
}

fn assert_none(rule: &str, findings: Vec<Finding>) {
    assert!(findings.is_empty(), "{rule}; {} offending:\n{}", findings.len(), report(&findings));
}

#[test]
fn every_rust_file_opens_with_a_doc_header() {
    let findings = checks::files_without_header(&root()).expect("read the repository's sources");
    assert_none("every .rs file opens with a `//!` line saying what it is for", findings);
}

/// Test harnesses are not production sources and may use sqlx (`orc_tests::pg` and
/// `host/examples/api-bench.rs` create and drop PostgreSQL databases, the store's tests look at
/// rows), as may `#[cfg(test)]` modules.
#[test]
fn sqlx_is_used_only_in_the_store() {
    let findings = checks::mentions_outside(&root(), "sqlx", SQL_HOME).expect("read the repository's sources");
    assert_none("production code reaches the database only through host/src/store", findings);
}

#[test]
fn the_stores_rows_are_not_the_apis_views() {
    let findings = checks::mentions_within(&root(), "ToSchema", "host/src/store/", SCHEMA_IN_STORE).expect("read the repository's sources");
    assert_none(
        "the API serves its own views (host/src/api/views.rs), never the store's rows",
        findings,
    );
}

#[test]
fn apt_get_runs_only_through_the_sdks_apt_command() {
    let findings = checks::mentions_outside(&root(), "apt-get", APT_HOME).expect("read the repository's sources");
    assert_none(
        "plugins build apt-get runs with orc_sdk::node::apt::get, never their own (say `apt` in messages)",
        findings,
    );
}

#[test]
fn the_domain_modules_do_not_import_the_application_layer() {
    let mut findings = Vec::new();
    for within in BELOW_THE_APPLICATION {
        findings.extend(checks::mentions_within(&root(), "crate::app", within, &[]).expect("read the repository's sources"));
    }
    assert_none(
        "the application layer calls the domain modules, never the other way (shared vocabulary goes one level down)",
        findings,
    );
}

#[test]
fn the_store_imports_no_layer_above_it_and_the_api_not_the_console() {
    let mut findings = Vec::new();
    for above in ABOVE_THE_STORE {
        findings.extend(checks::mentions_within(&root(), above, "host/src/store/", &[]).expect("read the repository's sources"));
    }
    findings.extend(checks::mentions_within(&root(), "crate::console", "host/src/api/", &[]).expect("read the repository's sources"));
    assert_none(
        "the store is the bottom layer; the API and the console sit side by side (the server merges them)",
        findings,
    );
}

#[test]
fn every_fixture_is_used_by_a_test() {
    let constants: Vec<String> = orc_plugin_artifacts::FIXTURES
        .iter()
        .map(|a| a.name.to_ascii_uppercase().replace('-', "_"))
        .collect();
    let constants: Vec<&str> = constants.iter().map(String::as_str).collect();
    let findings = checks::untested_fixtures(&root(), &constants).expect("read the repository's sources");
    assert_none(
        "every fixture is loaded by a test, by its constant (`orc_plugin_artifacts::MISBEHAVE`)",
        findings,
    );
}

#[test]
fn crates_without_documentation_tests_have_no_example_to_run() {
    let findings = checks::examples_no_test_runs(&root()).expect("read the repository's files");
    assert_none(
        "a crate with `doctest = false` shows no Rust example in its docs (turn its documentation tests on)",
        findings,
    );
}

#[test]
fn nothing_in_the_repository_speaks_of_how_it_is_developed() {
    let findings = checks::development_talk(&root()).expect("read the repository's files");
    assert_none(
        "docs, comments, tests and scripts speak of the product, not of how it is being made",
        findings,
    );
}

#[test]
fn the_runtime_and_the_node_transports_depend_on_no_http_server_or_sql() {
    assert_no_dependency(WITHOUT_SERVER_DEPENDENCIES, SERVER_CRATES);
}

#[test]
fn the_node_seam_and_its_transports_depend_on_no_wasm_engine() {
    assert_no_dependency(WITHOUT_WASM, WASM_CRATES);
}

/// Each of `crates` depends on none of `forbidden` (see [`checks::forbidden_dependencies`]).
fn assert_no_dependency(crates: &[&str], forbidden: &[&str]) {
    let cargo = PathBuf::from(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    let mut findings = Vec::new();
    for krate in crates {
        findings.extend(checks::forbidden_dependencies(&cargo, &root(), krate, forbidden).unwrap_or_else(|e| panic!("{e}")));
    }
    assert_none(
        &format!("{} depend on none of {}", crates.join(", "), forbidden.join(", ")),
        findings,
    );
}
