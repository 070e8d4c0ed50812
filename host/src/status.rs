//! Where a resource stands, as the scheduler moves it: the status the store keeps and the API
//! shows, and the error kept with a failure. Vocabulary below both the scheduler and the store,
//! so that neither imports the other for it.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::named::named_enum;

named_enum!(
    /// Where a resource stands: `available` → `deploying` → `deployed` | `failed` | `skipped` |
    /// `unavailable`.
    ResourceStatus("resource status") {
        /// Waiting to be deployed (new, changed, or recovered after a crash).
        Available => "available",
        /// An action is in flight. Never left behind: see `Store::recover_deploying`.
        Deploying => "deploying",
        Deployed => "deployed",
        Failed => "failed",
        /// A resource it requires did not succeed.
        Skipped => "skipped",
        /// Its node cannot be reached.
        Unavailable => "unavailable",
    }
);

/// A failure as the log, the state and a dryrun's report keep it: a stable code and a message
/// naming the culprit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorInfo {
    pub code: String,
    pub message: String,
}
