//! Integration tests of the registry: the store on a real directory, and the HTTP service on a
//! real socket driven by the real client.

// An integration test: an unwrap that fails is the test failing, where it failed.
#![allow(clippy::unwrap_used)]

#[cfg(all(feature = "server", feature = "client"))]
mod http;
mod services;
mod store;

use orc_manifest::{Capability, Manifest, PluginKind};

/// The smallest valid component: the preamble of an empty one.
pub const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\x00\x01\x00";

pub fn manifest(name: &str, version: &str, description: &str) -> Manifest {
    Manifest {
        name: name.into(),
        version: version.into(),
        kind: PluginKind::Adaptor,
        world: PluginKind::Adaptor.world(),
        capabilities: [Capability::NodeFiles].into(),
        resource_types: vec!["file".into()],
        description: description.into(),
    }
}

/// A publishable plugin; vary `description` to get other bytes for the same name and version.
pub fn plugin(name: &str, version: &str, description: &str) -> Vec<u8> {
    orc_manifest::embed(EMPTY_COMPONENT, &manifest(name, version, description)).unwrap()
}

/// A component carrying `json` as its manifest section verbatim, bypassing the validation that
/// `embed` does, to play a hostile publisher.
pub fn raw_plugin(json: &str) -> Vec<u8> {
    fn leb128(out: &mut Vec<u8>, mut v: usize) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let mut payload = Vec::new();
    leb128(&mut payload, orc_manifest::MANIFEST_SECTION.len());
    payload.extend_from_slice(orc_manifest::MANIFEST_SECTION.as_bytes());
    payload.extend_from_slice(json.as_bytes());
    let mut out = EMPTY_COMPONENT.to_vec();
    out.push(0);
    leb128(&mut out, payload.len());
    out.extend_from_slice(&payload);
    out
}

/// The names of the files in `dir`, sorted.
pub fn file_names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}
