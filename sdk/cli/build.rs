//! Embeds the guest SDK's sources, the WIT files and the workspace's dependency pins into
//! `orc-plugin`, so `orc-plugin new` can give a plugin crate a working SDK anywhere, without this
//! repository and before orc-sdk is on a registry.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let cli = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = cli
        .parent()
        .and_then(Path::parent)
        .expect("sdk/cli sits two levels below the root")
        .to_path_buf();
    let mut files = Vec::new();
    collect(&root.join("sdk/guest/src"), &mut files);
    collect(&root.join("wit"), &mut files);
    files.push(root.join("sdk/guest/Cargo.toml"));
    files.push(root.join("Cargo.toml"));
    files.sort();
    let mut code = String::from("/// (path relative to the repository root, content)\npub const FILES: &[(&str, &str)] = &[\n");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let rel = f.strip_prefix(&root).expect("under root").to_string_lossy().replace('\\', "/");
        writeln!(code, "    ({rel:?}, include_str!({:?})),", f.display().to_string()).expect("write");
    }
    code.push_str("];\n");
    for dir in ["sdk/guest/src", "wit"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("sdk_files.rs"), code).expect("write sdk_files.rs");
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs" || x == "wit") {
            out.push(p);
        }
    }
}
