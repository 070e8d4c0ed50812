//! A released intent version as the scheduler runs it: the intent, one loaded adaptor per
//! resource, each resource's desired hash, and the dependency edges in the direction actions
//! must follow.

use std::sync::Arc;

use orc_manifest::Digest;
use orc_runtime::Plugin;

use crate::intent::{Edges, Intent, ResourceSpec};

/// A released intent version with its adaptors loaded (one per resource, by index).
#[derive(Debug)]
pub struct Version {
    pub number: u64,
    pub intent: Intent,
    pub plugins: Vec<Arc<Plugin>>,
    hashes: Vec<Digest>,
    /// `waits_for.of(i)`: what must be deployed before `i` runs ([`Intent::waits_for`]).
    pub(super) waits_for: Edges,
    /// The reverse of `waits_for`.
    pub(super) blocks: Edges,
}

impl Version {
    pub fn new(number: u64, intent: Intent, plugins: Vec<Arc<Plugin>>) -> Version {
        assert_eq!(intent.resources.len(), plugins.len(), "one plugin per resource");
        let hashes = intent
            .resources
            .iter()
            .zip(&plugins)
            .map(|(r, p)| desired_hash(r, &p.digest))
            .collect();
        let waits_for = intent.waits_for();
        let blocks = waits_for.reversed();
        Version {
            number,
            intent,
            plugins,
            hashes,
            waits_for,
            blocks,
        }
    }

    pub fn desired_hash(&self, index: usize) -> Digest {
        self.hashes[index]
    }

    /// What must be deployed before resource `index` runs (indices into this version).
    pub fn waits_for(&self, index: usize) -> &[usize] {
        self.waits_for.of(index)
    }

    /// What waits for resource `index` to be deployed before it runs: its dependents.
    pub fn dependents(&self, index: usize) -> &[usize] {
        self.blocks.of(index)
    }
}

/// The hash of what a resource should be: its adaptor, attributes and purge mark. JSON objects
/// serialise with sorted keys, so equal desired states hash equally.
pub fn desired_hash(spec: &ResourceSpec, adaptor: &Digest) -> Digest {
    // Exactly the text of `{"adaptor": …, "attributes": …, "purged": …}` serialised as a JSON
    // value (keys in order, no whitespace), hashed in pieces without building it.
    let adaptor = adaptor.to_string();
    let purged: &[u8] = if spec.purged { b"true}" } else { b"false}" };
    Digest::of_parts([
        br#"{"adaptor":""#.as_slice(),
        adaptor.as_bytes(),
        br#"","attributes":"#,
        spec.attributes.as_json().as_bytes(),
        br#","purged":"#,
        purged,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intent::{Attributes, PluginRef, ResourceId};

    /// The hash is that of the JSON value `{"adaptor", "attributes", "purged"}` as serde_json
    /// writes it: stored hashes stay valid across releases of the host (a change here would
    /// redeploy every resource).
    #[test]
    fn the_desired_hash_is_that_of_the_canonical_json() {
        let adaptor = Digest::of(b"adaptor");
        for purged in [false, true] {
            let attributes = serde_json::json!({"path": "/tmp/a \"b\"", "mode": 420, "nested": {"z": [1, 2], "a": null}});
            let spec = ResourceSpec {
                id: "file[local,/tmp/a]".parse::<ResourceId>().unwrap(),
                adaptor: PluginRef::Digest(adaptor),
                attributes: Attributes::new(&attributes),
                requires: Vec::new(),
                purged,
                set: None,
                sensitive: None,
            };
            let value = serde_json::json!({"adaptor": adaptor.to_string(), "attributes": attributes, "purged": purged});
            assert_eq!(desired_hash(&spec, &adaptor), Digest::of(value.to_string().as_bytes()));
        }
    }
}
