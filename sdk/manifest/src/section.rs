//! The manifest travels inside the component as a top-level custom section, so the component's
//! digest covers it and a plugin is one self-describing file.

use wasmparser::{Encoding, Parser, Payload};

use crate::{Manifest, ManifestError};

/// The name of the custom section holding the manifest JSON.
pub const MANIFEST_SECTION: &str = "orc:manifest";

/// Returns `component` with `manifest` appended as a custom section, replacing none: the caller
/// embeds into a freshly built component (see [`extract`] for the one-section rule).
pub fn embed(component: &[u8], manifest: &Manifest) -> Result<Vec<u8>, ManifestError> {
    manifest.validate()?;
    if extract(component)?.is_some() {
        return Err(ManifestError::Duplicate(2));
    }
    let data = manifest.to_json();
    let mut payload = Vec::with_capacity(MANIFEST_SECTION.len() + data.len() + 5);
    leb128(&mut payload, MANIFEST_SECTION.len());
    payload.extend_from_slice(MANIFEST_SECTION.as_bytes());
    payload.extend_from_slice(data.as_bytes());
    let mut out = Vec::with_capacity(component.len() + payload.len() + 6);
    out.extend_from_slice(component);
    out.push(0); // custom section id
    leb128(&mut out, payload.len());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Reads the manifest from a component's top-level custom section; `None` when it has none.
/// Fails when the bytes are not a component or the manifest is invalid.
pub fn extract(component: &[u8]) -> Result<Option<Manifest>, ManifestError> {
    let mut depth = 0usize;
    let mut found: Vec<&[u8]> = Vec::new();
    for payload in Parser::new(0).parse_all(component) {
        match payload.map_err(ManifestError::NotWasm)? {
            Payload::Version { encoding, .. } => {
                if depth == 0 && encoding != Encoding::Component {
                    return Err(ManifestError::Invalid(
                        "a core module, not a component: build for wasm32-wasip2".into(),
                    ));
                }
                depth += 1;
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::CustomSection(s) if depth == 1 && s.name() == MANIFEST_SECTION => found.push(s.data()),
            _ => {}
        }
    }
    match found.as_slice() {
        [] => Ok(None),
        [one] => Manifest::from_json(one).map(Some),
        many => Err(ManifestError::Duplicate(many.len())),
    }
}

fn leb128(out: &mut Vec<u8>, mut value: usize) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}
