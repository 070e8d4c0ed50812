//! The report of a dryrun: for every resource of a version, the changes a deploy would make, "no
//! change", or why it could not be checked. Built from the executor's dryrun reports
//! ([`crate::scheduler::dryrun`]); stored as JSON with the dryrun and served as is.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::executor::{ActionReport, Outcome};

/// What a dryrun found for one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    /// Already in its desired state.
    NoChange,
    /// A deploy would make these changes.
    WouldChange,
    /// It could not be read or compared; `reason` says why.
    Unchecked,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResourceFinding {
    pub resource: String,
    pub finding: Finding,
    /// What would change: `{field, current, desired}` per field.
    #[schema(value_type = Vec<Object>)]
    pub changes: Vec<Value>,
    /// Why it could not be checked (`{code, message}`), for `unchecked`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<crate::scheduler::ErrorInfo>,
    /// What the adaptor logged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DryrunSummary {
    pub no_change: usize,
    pub would_change: usize,
    pub unchecked: usize,
}

/// The whole report, in intent order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DryrunResult {
    pub version: i64,
    pub summary: DryrunSummary,
    pub resources: Vec<ResourceFinding>,
}

impl ResourceFinding {
    /// What an executor's dryrun report says, taken over without copying.
    pub fn of(report: ActionReport) -> ResourceFinding {
        let finding = match report.outcome {
            Outcome::Unchanged => Finding::NoChange,
            Outcome::WouldChange | Outcome::Changed => Finding::WouldChange,
            Outcome::Failed | Outcome::Unavailable | Outcome::Skipped => Finding::Unchecked,
        };
        let reason = (finding == Finding::Unchecked).then(|| match report.error {
            Some(e) => crate::scheduler::ErrorInfo {
                code: e.code,
                message: e.message,
            },
            None => crate::scheduler::ErrorInfo {
                code: "unchecked".into(),
                message: format!("the adaptor reported `{:?}` without an error", report.outcome),
            },
        });
        ResourceFinding {
            finding,
            changes: report
                .changes
                .iter()
                .map(|c| serde_json::to_value(c).expect("a change serialises"))
                .collect(),
            reason,
            messages: report.messages,
            resource: report.resource,
        }
    }
}

impl DryrunResult {
    /// The report of `version` from its findings, in intent order.
    pub fn from_findings(version: i64, resources: Vec<ResourceFinding>) -> DryrunResult {
        let mut summary = DryrunSummary::default();
        for r in &resources {
            match r.finding {
                Finding::NoChange => summary.no_change += 1,
                Finding::WouldChange => summary.would_change += 1,
                Finding::Unchecked => summary.unchecked += 1,
            }
        }
        DryrunResult {
            version,
            summary,
            resources,
        }
    }
}
