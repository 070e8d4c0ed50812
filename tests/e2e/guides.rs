//! Every command block of the guides runs as written. For each guide (`README.md`, `docs/*.md`
//! but the figures of `docs/benchmarks.md`), its ```` ```sh ```` blocks run in order, as one
//! `bash -euo pipefail` script — a reader following the guide from the top — in a directory
//! that looks like a checkout (the repository's entries linked, `target/debug` the binaries
//! these tests were built with, a `target` of its own otherwise), against a real
//! `orc-host serve` and, when the guide names one, a real sshd node. Every `# → ` line of a
//! block is what the block must print, in that order (`…`: anything).
//!
//! What the reader does by hand, the test does, and only that:
//! - a `cargo run -p orc-host -- serve …` line is the server this test started (on a free port,
//!   in a directory of its own, holding the secret `billing-api` of the operator guide's
//!   `[secrets]` example);
//! - `cargo run -p NAME --` runs the binary `NAME` and `cargo build -p NAME` has nothing to do
//!   (the binaries are built, with the features the tests resolved);
//! - an assignment of a value the reader fills in — `ORC` (the server's URL), `TOKEN` (the
//!   admin token its first start printed), `NODE_ADDRESS`, `NODE_PORT`, `NODE_USER`, `NODE_KEY`
//!   (a node and the private key orc signs in with) — gets the test's value;
//! - plugin crates compile in the end-to-end tests' shared target directory
//!   (`CARGO_TARGET_DIR`), where their dependencies are compiled already;
//! - a `curl -N` (an event stream, which never ends by itself) is read for three seconds;
//! - every `curl` fails on an HTTP error (`--fail-with-body`) unless its line prints the status
//!   itself (`-w`, `-i`).
//!
//! A block marked `<!-- walkthrough:… -->` is run by the services walkthrough
//! (`host/tests/it/clusters/walkthrough.rs`), which checks what it did on its nodes; a block
//! marked `<!-- not run: … -->` says why no test can run it here (installing a package as a
//! system service; the test command itself).

// Test support: a failed unwrap is the test failing, where it failed.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use orc_tests::guide::{Block, missing_output, sh_blocks};
use orc_tests::server::Served;
use orc_tests::sshd::Sshd;
use orc_tests::{bin, repo_root};

/// The values a reader fills in, which the test gives.
const FILLED_IN: &[&str] = &["ORC", "TOKEN", "NODE_ADDRESS", "NODE_PORT", "NODE_USER", "NODE_KEY"];

/// The server's configuration: the operator guide's example secret, bound where it says.
const CONFIG: &str = r#"[secrets]
billing-api = { env = "ORC_SECRET_BILLING", origins = ["https://billing.example.com"] }
"#;

/// How long a whole guide may run.
const GUIDE_TIMEOUT: Duration = Duration::from_secs(600);

/// What marks a block printed, in the script's output.
const SEPARATOR: &str = "::guide-block::";

/// One test per guide, so that they run side by side.
macro_rules! guides {
    ($($test:ident: $guide:literal,)*) => {
        /// The guides, in the order a newcomer reads them.
        const GUIDES: &[&str] = &[$($guide),*];
        $(
            #[test]
            fn $test() {
                eprintln!("{}", run_guide($guide));
            }
        )*
    };
}

guides! {
    the_readme_runs_as_written: "README.md",
    the_operator_guide_runs_as_written: "docs/operator.md",
    the_api_guide_runs_as_written: "docs/api.md",
    the_clusters_and_services_guide_runs_as_written: "docs/clusters-and-services.md",
    the_plugin_guide_runs_as_written: "docs/plugins.md",
}

#[test]
fn every_guide_is_listed_and_every_block_has_a_runner() {
    let root = repo_root();
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| format!("docs/{}", e.unwrap().file_name().to_string_lossy()))
        .filter(|p| p.ends_with(".md") && p != "docs/benchmarks.md")
        .collect();
    docs.push("README.md".into());
    for doc in &docs {
        assert!(
            GUIDES.contains(&doc.as_str()),
            "{doc} has command blocks no test runs: add it to GUIDES"
        );
    }
    let walkthrough = std::fs::read_to_string(root.join("host/tests/it/clusters/walkthrough.rs")).unwrap();
    for guide in GUIDES {
        for block in sh_blocks(&read(guide)) {
            match block.marker.as_deref() {
                Some(m) if m.starts_with("walkthrough:") => assert!(
                    walkthrough.contains(&format!("\"{m}\"")),
                    "{guide}:{}: `{m}` marks a block the walkthrough test does not run",
                    block.line
                ),
                Some(m) if m.starts_with("not run:") => {
                    assert!(m.len() > "not run:".len() + 10, "{guide}:{}: a block not run says why", block.line)
                }
                _ => {}
            }
        }
    }
}

fn read(guide: &str) -> String {
    std::fs::read_to_string(repo_root().join(guide)).unwrap_or_else(|e| panic!("{guide}: {e}"))
}

/// Whether this test runs `block` (rather than the walkthrough, or nobody).
fn runs(block: &Block) -> bool {
    block
        .marker
        .as_deref()
        .is_none_or(|m| !m.starts_with("walkthrough:") && !m.starts_with("not run:"))
}

/// Runs the blocks of `guide`; a line saying what ran.
fn run_guide(guide: &str) -> String {
    let text = read(guide);
    let blocks: Vec<Block> = sh_blocks(&text).into_iter().filter(runs).collect();
    if blocks.is_empty() {
        return format!("{guide}: no block to run");
    }
    let started = Instant::now();
    let scratch = checkout();
    let server = Served::start(CONFIG, &[("ORC_SECRET_BILLING", "Bearer guide")]);
    let mut env = vec![
        ("ORC".to_string(), server.url()),
        ("TOKEN".to_string(), server.token.clone()),
        ("ORC_HOME".to_string(), scratch.path().join("orc-home").display().to_string()),
        ("CARGO_TARGET_DIR".to_string(), orc_tests::guest_target_dir().display().to_string()),
        (
            "PATH".to_string(),
            format!("{}:{}", bin_dir().display(), std::env::var("PATH").unwrap_or_default()),
        ),
    ];
    let _node = text.contains("$NODE_").then(|| {
        let sshd = Sshd::start();
        let key = scratch.path().join("node-key");
        std::fs::write(&key, &sshd.client_key).unwrap();
        env.extend([
            ("NODE_ADDRESS".to_string(), sshd.address.clone()),
            ("NODE_PORT".to_string(), sshd.port.to_string()),
            ("NODE_USER".to_string(), "root".to_string()),
            ("NODE_KEY".to_string(), key.display().to_string()),
        ]);
        sshd
    });

    // Every `curl` fails on an HTTP error unless the line prints the status itself.
    let mut script = String::from(
        "curl() { case \" $* \" in *' -w '*|*' -i '*) command curl \"$@\" ;; *) command curl --fail-with-body \"$@\" ;; esac; }\n",
    );
    for block in &blocks {
        script.push_str(&format!("echo '{SEPARATOR}'\n"));
        for line in block.body.lines() {
            script.push_str(&rewrite(line));
            script.push('\n');
        }
    }
    let mut bash = Command::new("timeout");
    bash.arg(GUIDE_TIMEOUT.as_secs().to_string())
        .args(["bash", "-euo", "pipefail", "-c", &script])
        .current_dir(scratch.path())
        .envs(env);
    let out = bash.output().expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Before the first separator: nothing. Then one part per block, up to where it stopped.
    let printed: Vec<&str> = stdout.split(&format!("{SEPARATOR}\n")).skip(1).collect();
    let last = blocks.get(printed.len().saturating_sub(1)).map_or(0, |b| b.line);
    assert!(
        out.status.success(),
        "{guide}: the block at line {last} failed ({}):\n--- it printed\n{}\n--- stderr\n{stderr}",
        out.status,
        printed.last().unwrap_or(&""),
    );
    eprintln!("--- {guide} printed:\n{stdout}");
    for (block, printed) in blocks.iter().zip(&printed) {
        if let Some(expected) = missing_output(&block.body, printed) {
            panic!(
                "{guide}: the block at line {} never printed `{expected}` (in order); it printed:\n{printed}\n--- stderr\n{stderr}",
                block.line
            );
        }
    }
    format!("{guide}: {} blocks ran in {:.1?}", blocks.len(), started.elapsed())
}

/// The directory the binaries are in (`target/<profile>`).
fn bin_dir() -> PathBuf {
    bin("orc-host").parent().unwrap().to_path_buf()
}

/// A directory that looks like a checkout: every entry of the repository linked but `target`,
/// whose `debug` is the binaries' directory.
fn checkout() -> tempfile::TempDir {
    let root = repo_root();
    let scratch = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&root).unwrap() {
        let name = entry.unwrap().file_name();
        if name != "target" && name != ".git" {
            std::os::unix::fs::symlink(root.join(&name), scratch.path().join(&name)).unwrap();
        }
    }
    std::fs::create_dir(scratch.path().join("target")).unwrap();
    std::os::unix::fs::symlink(bin_dir(), scratch.path().join("target/debug")).unwrap();
    scratch
}

/// One line of a guide's block as the test runs it (see the module's header).
fn rewrite(line: &str) -> String {
    let trimmed = line.trim_start();
    if trimmed.starts_with("cargo run -p orc-host -- serve") {
        return ": the server this test started".into();
    }
    let mut line = line.to_string();
    while let Some(at) = line.find("cargo run -p ") {
        let rest = &line[at + "cargo run -p ".len()..];
        let name: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
        let after = rest[name.len()..].trim_start();
        let after = after.strip_prefix("--").map_or(after, str::trim_start);
        line = format!("{}{name} {after}", &line[..at]);
    }
    while let Some(at) = line.find("cargo build -p ") {
        let rest = &line[at + "cargo build -p ".len()..];
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        line = format!("{}:{}", &line[..at], &rest[end..]);
    }
    if let Some(assigned) = assignments(&line) {
        return assigned;
    }
    let trimmed = line.trim_start();
    if trimmed.starts_with("curl ") && trimmed.contains(" -N ") {
        let (command, comment) = trimmed.split_once(" #").unwrap_or((trimmed, ""));
        let comment = if comment.is_empty() {
            String::new()
        } else {
            format!("  #{comment}")
        };
        return format!("{{ timeout 3 {} || [ $? = 124 ]; }}{comment}", command.trim_end());
    }
    line
}

/// A line of assignments only (`A=1 B="x y"   # …`) with the values the reader fills in
/// replaced by the test's; `None` for any other line.
fn assignments(line: &str) -> Option<String> {
    let code = line.find(" #").map_or(line, |at| &line[..at]);
    let comment = &line[code.trim_end().len()..];
    let code = code.trim_end();
    let mut out = Vec::new();
    let mut rest = code.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let eq = rest.find('=')?;
        let name = &rest[..eq];
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') {
            return None;
        }
        let value = &rest[eq + 1..];
        let end = match value.chars().next() {
            Some(q @ ('"' | '\'')) => value[1..].find(q).map(|e| e + 2)?,
            _ => value.find(char::is_whitespace).unwrap_or(value.len()),
        };
        let assigned = if FILLED_IN.contains(&name) {
            format!("{name}=\"${name}\"")
        } else {
            format!("{name}={}", &value[..end])
        };
        out.push(assigned);
        rest = value[end..].trim_start();
    }
    Some(format!("{}{comment}", out.join(" ")))
}

#[test]
fn what_the_reader_fills_in_is_what_the_test_gives() {
    assert_eq!(rewrite(r#"TOKEN=orc_…   # paste it"#), r#"TOKEN="$TOKEN"   # paste it"#);
    assert_eq!(
        rewrite(r#"ORC=http://127.0.0.1:8420 AUTH="Authorization: Bearer $TOKEN""#),
        r#"ORC="$ORC" AUTH="Authorization: Bearer $TOKEN""#
    );
    assert_eq!(rewrite("echo A=1"), "echo A=1");
    assert_eq!(
        rewrite("cargo build -p orc-plugin && PATH=$PWD/target/debug:$PATH"),
        ": && PATH=$PWD/target/debug:$PATH"
    );
    assert_eq!(
        rewrite("rustup target add wasm32-wasip2 && cargo run -p orc-host -- deploy x.json"),
        "rustup target add wasm32-wasip2 && orc-host deploy x.json"
    );
    assert_eq!(
        rewrite(r#"curl -s -N -H "$AUTH" $ORC/api/v1/environments/dev/events   # in another terminal"#),
        r#"{ timeout 3 curl -s -N -H "$AUTH" $ORC/api/v1/environments/dev/events || [ $? = 124 ]; }  # in another terminal"#
    );
    assert_eq!(
        rewrite("cargo run -p orc-host -- serve --listen 127.0.0.1:8420 &"),
        ": the server this test started"
    );
}
