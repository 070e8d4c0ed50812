//! The first-party plugins and the test fixtures, compiled from source for wasm32-wasip2 by this
//! crate's build script and embedded here, so `orc-host` can offer the first-party plugins
//! without any extra command and tests can load fixtures by digest.

/// One built plugin.
#[derive(Debug, Clone, Copy)]
pub struct Artifact {
    pub name: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// `sha256:<hex>` of `bytes`.
    pub digest: &'static str,
    /// Where the build wrote the component.
    pub path: &'static str,
    pub bytes: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/artifacts.rs"));

/// Finds a first-party plugin or fixture by name.
pub fn by_name(name: &str) -> Option<&'static Artifact> {
    FIRST_PARTY.iter().chain(FIXTURES).find(|a| a.name == name)
}
