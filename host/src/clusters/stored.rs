//! A cluster's row and its template's as the store keeps them: their documents decoded (one that
//! does not decode is a corrupt store), and what an operation checks of the row before it
//! changes the cluster: the revision its `If-Match` names, and no other operation under way.

use orc_cluster::Template;

use super::{ClusterDoc, ClusterError, ClusterStatus};
use crate::error::EnvError;
use crate::store::{ClusterRecord, StoreError, TemplateRecord};

pub(crate) fn stored_template(record: &TemplateRecord) -> Result<Template, ClusterError> {
    serde_json::from_str(&record.document).map_err(|e| {
        ClusterError::Env(EnvError::Store(StoreError::Corrupt {
            what: format!("template `{}` version {}: {e}", record.name, record.version),
        }))
    })
}

pub(crate) fn stored_doc(record: &ClusterRecord) -> Result<ClusterDoc, ClusterError> {
    serde_json::from_str(&record.document).map_err(|e| {
        ClusterError::Env(EnvError::Store(StoreError::Corrupt {
            what: format!("cluster `{}`: {e}", record.name),
        }))
    })
}

/// Refuses an operation whose `If-Match` names another revision than the cluster's.
pub(crate) fn check_if_match(record: &ClusterRecord, if_match: Option<&str>) -> Result<(), ClusterError> {
    match crate::if_match::expected_revision(if_match) {
        Some(expected) if expected != record.revision => Err(ClusterError::Env(EnvError::VersionConflict(format!(
            "cluster `{}` is at revision {}, not {expected}",
            record.name, record.revision
        )))),
        _ => Ok(()),
    }
}

/// Refuses an operation on a cluster that is in another one (see [`ClusterStatus::busy`]).
pub(crate) fn ensure_idle(name: &str, record: &ClusterRecord) -> Result<(), ClusterError> {
    match ClusterStatus::parse(&record.status) {
        Some(s) if s.busy() => Err(ClusterError::Busy {
            name: name.to_string(),
            status: s.as_str(),
        }),
        _ => Ok(()),
    }
}
