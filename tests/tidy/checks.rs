//! The checker behind the tidy tests: rules over a repository tree that no compiler checks, each
//! answering every offending file and line. Pure functions of a root directory, so that the
//! `can_fail` tests run them on small trees made to break each rule.

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One thing a rule finds wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The file, relative to the root the rule ran on.
    pub path: PathBuf,
    /// The line, from 1; 0 when the finding is about the file as a whole.
    pub line: usize,
    pub what: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            0 => write!(f, "{}: {}", self.path.display(), self.what),
            line => write!(f, "{}:{line}: {}", self.path.display(), self.what),
        }
    }
}

/// Findings one per line, for a failing test's message.
pub fn report(findings: &[Finding]) -> String {
    findings.iter().map(|f| format!("  {f}\n")).collect()
}

/// Every `.rs` file under `root`, relative to it and sorted. Build output is not source: every
/// directory whose name starts with `target` (`target/`, `target-bench/`, …) is skipped, and so
/// are hidden ones (`.git`). Generated code lives only there (wit-bindgen's, the artifacts'
/// `OUT_DIR`).
pub fn rust_files(root: &Path) -> io::Result<Vec<PathBuf>> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
        for entry in std::fs::read_dir(root.join(dir))? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let path = dir.join(&*name);
            let kind = entry.file_type()?;
            if kind.is_dir() {
                if !name.starts_with("target") && !name.starts_with('.') {
                    walk(root, &path, out)?;
                }
            } else if kind.is_file() && name.ends_with(".rs") {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(root, Path::new(""), &mut out)?;
    out.sort();
    Ok(out)
}

/// Rule: every Rust file opens with a `//!` line saying what it is for.
pub fn files_without_header(root: &Path) -> io::Result<Vec<Finding>> {
    let mut findings = Vec::new();
    for path in rust_files(root)? {
        let text = std::fs::read_to_string(root.join(&path))?;
        let first = text.lines().next().unwrap_or_default();
        if !first.starts_with("//!") {
            findings.push(Finding {
                path,
                line: 1,
                what: format!("the file does not open with a `//!` header: {first:?}"),
            });
        }
    }
    Ok(findings)
}

/// The kinds of text file the repository speaks in: sources, docs, configuration, scripts.
const TEXT_EXTENSIONS: &[&str] = &["rs", "md", "toml", "sql", "sh", "py", "yml", "wit", "json"];

/// Every text file under `root` (see [`TEXT_EXTENSIONS`], and every file under `.ci/`),
/// relative to it and sorted; build output and hidden folders but `.ci` are skipped.
pub fn text_files(root: &Path) -> io::Result<Vec<PathBuf>> {
    fn walk(root: &Path, dir: &Path, in_ci: bool, out: &mut Vec<PathBuf>) -> io::Result<()> {
        for entry in std::fs::read_dir(root.join(dir))? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let path = dir.join(&*name);
            let kind = entry.file_type()?;
            if kind.is_dir() {
                let ci = dir.as_os_str().is_empty() && name == ".ci";
                if ci || (!name.starts_with("target") && !name.starts_with('.')) {
                    walk(root, &path, in_ci || ci, out)?;
                }
            } else if kind.is_file() && (in_ci || TEXT_EXTENSIONS.iter().any(|e| name.ends_with(&format!(".{e}")))) {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(root, Path::new(""), false, &mut out)?;
    out.sort();
    Ok(out)
}

/// What a line says of how the product is being developed, if anything: a round of work named
/// by its number or as the current one, or the person reviewing it. The repository speaks of the
/// product only.
pub fn development_talk_in(line: &str) -> Option<&'static str> {
    let lower = line.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    for (at, _) in lower.match_indices("stop") {
        let word_start = at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'-');
        // Singular only: a process that "…s 2 s after" something is not a round of work.
        let rest = &lower[at + 4..];
        let numbered = rest.strip_prefix(' ').is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()));
        if word_start && numbered {
            return Some("a numbered round of work");
        }
    }
    // Spelled with an escape, so that this file does not say the words itself.
    if ["this s\x74op", "last s\x74op", "previous s\x74op"]
        .iter()
        .any(|p| lower.contains(p))
    {
        return Some("the current round of work");
    }
    if lower.contains("re\x76iewer") {
        return Some("the person reviewing it");
    }
    None
}

/// Files [`development_talk`] leaves alone: the rule's own (it names what it forbids), and the
/// migrations, which are immutable once released (the store checks each applied migration's
/// checksum, comments included, so an edit would refuse every existing database).
pub const DEVELOPMENT_TALK_EXEMPT: &[&str] = &["tests/tidy/", "host/migrations/"];

/// Rule: no text file speaks of how the product is being developed ([`development_talk_in`]).
pub fn development_talk(root: &Path) -> io::Result<Vec<Finding>> {
    let mut findings = Vec::new();
    for path in text_files(root)? {
        if DEVELOPMENT_TALK_EXEMPT.iter().any(|e| path.starts_with(e)) {
            continue;
        }
        // A file that is not UTF-8 text is not prose.
        let Ok(text) = std::fs::read_to_string(root.join(&path)) else {
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            if let Some(what) = development_talk_in(line) {
                findings.push(Finding {
                    path: path.clone(),
                    line: i + 1,
                    what: format!("speaks of {what}: {:?}", line.trim()),
                });
            }
        }
    }
    Ok(findings)
}

/// Rule: every fixture (a plugin that misbehaves on purpose, by the constant
/// `orc-plugin-artifacts` generates for it) is used by some test: a file under a `tests` folder
/// naming the constant as a word. A fixture no test loads is a promise no test keeps.
pub fn untested_fixtures(root: &Path, constants: &[&str]) -> io::Result<Vec<Finding>> {
    let mut texts = Vec::new();
    for path in rust_files(root)? {
        if path.iter().any(|p| p == "tests") && !path.starts_with("tests/tidy") {
            texts.push(std::fs::read_to_string(root.join(&path))?);
        }
    }
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let used = |constant: &str| {
        texts.iter().any(|text| {
            text.match_indices(constant).any(|(at, _)| {
                let before = text.as_bytes().get(at.wrapping_sub(1)).copied().filter(|_| at > 0);
                let after = text.as_bytes().get(at + constant.len()).copied();
                !before.is_some_and(is_word) && !after.is_some_and(is_word)
            })
        })
    };
    Ok(constants
        .iter()
        .filter(|c| !used(c))
        .map(|c| Finding {
            path: PathBuf::from("plugins/artifacts"),
            line: 0,
            what: format!("fixture `{c}` is used by no test"),
        })
        .collect())
}

/// Rule: a crate whose `Cargo.toml` turns its documentation tests off (`doctest = false`) has
/// no example in its docs that would be one: every fence opened in a `///` or `//!` comment
/// names a language other than Rust (```` ```text ````, ```` ```toml ````). An example written
/// later would otherwise never run.
pub fn examples_no_test_runs(root: &Path) -> io::Result<Vec<Finding>> {
    let mut crates = Vec::new();
    for path in text_files(root)? {
        if path.file_name().is_some_and(|n| n == "Cargo.toml") {
            let text = std::fs::read_to_string(root.join(&path))?;
            if text
                .lines()
                .any(|l| l.split('#').next().unwrap_or("").replace(' ', "") == "doctest=false")
            {
                crates.push(path.parent().map(Path::to_path_buf).unwrap_or_default());
            }
        }
    }
    let mut findings = Vec::new();
    for path in rust_files(root)? {
        if !crates.iter().any(|c| path.starts_with(c.join("src"))) {
            continue;
        }
        let text = std::fs::read_to_string(root.join(&path))?;
        let mut open = false;
        for (i, line) in text.lines().enumerate() {
            let doc = line.trim_start();
            let Some(doc) = doc.strip_prefix("///").or_else(|| doc.strip_prefix("//!")) else {
                continue;
            };
            let Some(info) = doc.trim_start().strip_prefix("```") else {
                continue;
            };
            if !open && (info.trim().is_empty() || info.trim().starts_with("rust")) {
                findings.push(Finding {
                    path: path.clone(),
                    line: i + 1,
                    what: "a Rust example in a crate whose documentation tests are off (`doctest = false`)".into(),
                });
            }
            open = !open;
        }
    }
    Ok(findings)
}

/// The folders that hold production crates.
pub const PRODUCTION_ROOTS: &[&str] = &["host", "plugins", "sdk", "registry"];

/// Whether a file is production source: under one of [`PRODUCTION_ROOTS`] and not a test
/// harness — not in a `tests`, `examples` or `benches` folder (integration tests, benchmark
/// commands and their support modules) and not a `tests.rs` (a `#[cfg(test)] mod tests;`).
/// `#[cfg(test)]` items inside production files are left out by [`code_lines`].
pub fn is_production(path: &Path) -> bool {
    let mut parts = path.iter().map(|p| p.to_string_lossy());
    let Some(top) = parts.next() else { return false };
    PRODUCTION_ROOTS.contains(&top.as_ref())
        && !path
            .iter()
            .any(|p| matches!(p.to_str(), Some("tests" | "examples" | "benches" | "tests.rs")))
}

/// The lines of a Rust file that are code: not comments (lines starting with `//`, docs
/// included) and not inside a `#[cfg(test)]` item. The end of an item is found by rustfmt's
/// layout (`cargo fmt --check` holds in CI): the `}` at the indentation the item starts at.
pub fn code_lines(text: &str) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("#[cfg(test)]") {
            // The item: on this line, or the next that is neither an attribute nor a comment.
            let mut j = i;
            if rest.trim().is_empty() {
                j += 1;
                while lines
                    .get(j)
                    .is_some_and(|l| l.trim_start().starts_with("#[") || l.trim_start().starts_with("//"))
                {
                    j += 1;
                }
            }
            // An item whole on its line ends it (`mod tests;`, `fn f() {}`); a block ends at
            // its indentation's `}`.
            if let Some(item) = lines.get(j)
                && !item.trim_end().ends_with([';', '}'])
            {
                let indent = &item[..item.len() - item.trim_start().len()];
                let close = format!("{indent}}}");
                while lines.get(j).is_some_and(|l| !l.trim_end().starts_with(&close)) {
                    j += 1;
                }
            }
            i = j + 1;
            continue;
        }
        if !trimmed.starts_with("//") {
            out.push((i + 1, line));
        }
        i += 1;
    }
    out
}

/// Rule: `needle` appears in production code (see [`is_production`] and [`code_lines`]) only in
/// files under one of the `allowed` paths (a folder ending in `/`, or a file).
pub fn mentions_outside(root: &Path, needle: &str, allowed: &[&str]) -> io::Result<Vec<Finding>> {
    let scope = |path: &str| !allowed.iter().any(|a| path.starts_with(a));
    mentions(root, needle, scope, &format!("outside {}", allowed.join(", ")))
}

/// Rule: `needle` appears in no production file under the folder `within` but the `allowed`
/// ones (the inverse of [`mentions_outside`]: a folder kept free of something).
pub fn mentions_within(root: &Path, needle: &str, within: &str, allowed: &[&str]) -> io::Result<Vec<Finding>> {
    let scope = |path: &str| path.starts_with(within) && !allowed.contains(&path);
    mentions(root, needle, scope, &format!("in {within}"))
}

/// Every line of production code, in a file whose path `scope` accepts, that contains `needle`.
fn mentions(root: &Path, needle: &str, scope: impl Fn(&str) -> bool, place: &str) -> io::Result<Vec<Finding>> {
    let mut findings = Vec::new();
    for path in rust_files(root)? {
        let shown = path.to_string_lossy();
        if !is_production(&path) || !scope(&shown) {
            continue;
        }
        let text = std::fs::read_to_string(root.join(&path))?;
        for (line, code) in code_lines(&text) {
            if code.contains(needle) {
                findings.push(Finding {
                    path: path.clone(),
                    line,
                    what: format!("`{needle}` {place}: {}", code.trim()),
                });
            }
        }
    }
    Ok(findings)
}

/// Rule: the crate `krate` of the workspace at `workspace` depends, through normal and build
/// dependencies, on no crate named in `forbidden` nor any of its parts (`axum` forbids
/// `axum-core` too). Features are resolved as when `krate` is built alone (`cargo tree -p`),
/// so a forbidden crate behind a feature counts only when something `krate` uses enables it.
/// Dev-dependencies (test harnesses) are not checked. The finding names the crate's manifest,
/// the line declaring the first step towards the forbidden crate, and the whole path.
pub fn forbidden_dependencies(cargo: &Path, workspace: &Path, krate: &str, forbidden: &[&str]) -> Result<Vec<Finding>, String> {
    let args = [
        "tree",
        "--locked",
        "--offline",
        "--package",
        krate,
        "--edges",
        "normal,build",
        "--prefix",
        "depth",
        "--format",
        "{p}",
    ];
    let out = Command::new(cargo)
        .current_dir(workspace)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cargo.display()))?;
    if !out.status.success() {
        return Err(format!(
            "`cargo {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let tree = String::from_utf8_lossy(&out.stdout);
    let mut manifest = PathBuf::from("Cargo.toml");
    let mut chain: Vec<&str> = Vec::new();
    let mut seen = BTreeSet::new();
    let mut findings = Vec::new();
    for line in tree.lines() {
        let digits = line.chars().take_while(char::is_ascii_digit).count();
        let Ok(depth) = line[..digits].parse::<usize>() else { continue };
        let package = line[digits..].trim_end_matches(" (*)");
        let name = package.split_whitespace().next().unwrap_or_default();
        chain.truncate(depth);
        chain.push(name);
        if depth == 0 {
            if let Some((_, dir)) = package.split_once(" (") {
                let dir = Path::new(dir.trim_end_matches(')'));
                manifest = dir.strip_prefix(workspace).unwrap_or(dir).join("Cargo.toml");
            }
            continue;
        }
        let is_forbidden = forbidden
            .iter()
            .any(|f| name == *f || name.strip_prefix(f).is_some_and(|rest| rest.starts_with('-')));
        if is_forbidden && seen.insert(name.to_string()) {
            findings.push(Finding {
                line: declaration_line(&workspace.join(&manifest), chain[1]),
                path: manifest.clone(),
                // `name version`, without the source cargo adds for path packages.
                what: format!(
                    "{krate} depends on {} ({})",
                    package.split(" (").next().unwrap_or(package),
                    chain.join(" → ")
                ),
            });
        }
    }
    Ok(findings)
}

/// The line of `manifest` that declares the dependency `name` (`name = …`, `name.workspace = …`,
/// `[dependencies.name]`), 0 when none does (a renamed dependency).
fn declaration_line(manifest: &Path, name: &str) -> usize {
    let text = std::fs::read_to_string(manifest).unwrap_or_default();
    text.lines()
        .position(|l| {
            let l = l.trim_start().trim_start_matches('[');
            let l = l
                .strip_prefix("dependencies.")
                .or(l.strip_prefix("build-dependencies."))
                .unwrap_or(l);
            l.strip_prefix(name).is_some_and(|rest| rest.starts_with([' ', '=', '.', ']']))
        })
        .map_or(0, |i| i + 1)
}
