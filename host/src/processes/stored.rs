//! A process's row as the store keeps it: its state and its document, read and written
//! (`state_of`, `decode`, `encode`), and what an operation checks of the row before it
//! writes over it: the revision its `If-Match` names, and that its state allows it.

use super::{Operation, ProcessDoc, ProcessState, ServicesError};
use crate::store::{ProcessRecord, StoreError};

/// The state the row names; one it does not name is `failed`.
pub(crate) fn state_of(record: &ProcessRecord) -> ProcessState {
    ProcessState::parse(&record.state).unwrap_or(ProcessState::Failed)
}

/// The row's document for `doc`.
pub(crate) fn encode(doc: &ProcessDoc) -> String {
    serde_json::to_string(doc).expect("a process serialises")
}

/// The row's document decoded (one that does not decode is a corrupt store).
pub(crate) fn decode(record: &ProcessRecord) -> Result<ProcessDoc, ServicesError> {
    serde_json::from_str(&record.document).map_err(|e| {
        StoreError::Corrupt {
            what: format!("process `{}`: {e}", record.name),
        }
        .into()
    })
}

/// Refuses an operation whose `If-Match` names another revision than the process's.
pub(crate) fn check_if_match(name: &str, record: &ProcessRecord, if_match: Option<&str>) -> Result<(), ServicesError> {
    match if_match {
        Some(tag) if !crate::if_match::tag_matches(tag, &record.revision.to_string()) => Err(ServicesError::VersionConflict {
            what: format!("process `{name}`"),
            expected: tag.chars().filter(|c| !c.is_control()).take(40).collect(),
            current: record.revision,
        }),
        _ => Ok(()),
    }
}

/// Refuses `operation` on process `name` unless its `state` allows it ([`ProcessState::allows`]).
pub(crate) fn ensure_allows(name: &str, state: ProcessState, operation: Operation) -> Result<(), ServicesError> {
    if state.allows(operation) {
        Ok(())
    } else {
        Err(ServicesError::InvalidTransition {
            name: name.to_string(),
            state: state.as_str(),
            operation: operation.as_str(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_if_match_must_name_the_current_revision() {
        let record = ProcessRecord {
            name: "p".into(),
            state: "running".into(),
            document: "{}".into(),
            revision: 4,
            created_at: 0,
            updated_at: 0,
        };
        for ok in [None, Some("*"), Some("\"4\""), Some("W/\"4\""), Some("4")] {
            check_if_match("p", &record, ok).unwrap();
        }
        assert!(matches!(
            check_if_match("p", &record, Some("\"3\"")),
            Err(ServicesError::VersionConflict { current: 4, .. })
        ));
    }
}
