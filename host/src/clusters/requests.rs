//! What an operator asks of clusters: the bodies of `POST …/clusters` and of a cluster's
//! operations (`amend`, `reconfigure`, a service's `stop`, `start` or `restart`), their defaults
//! and bounds, and the checks of what they carry that need nothing but the template
//! (`lease_ms`, `check_overrides`).

use std::collections::BTreeMap;

use orc_cluster::Template;
use serde::Deserialize;
use serde_json::Value;

use super::ClusterError;
use crate::store::Millis;

/// How many times a task may fail before its operation fails (a create is rolled back).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// The longest lease a cluster may be given: ten years, in seconds.
pub const MAX_LEASE_S: u64 = 10 * 365 * 86_400;

/// A lease of `lease_s` seconds in milliseconds; a lease of no time or beyond [`MAX_LEASE_S`]
/// is refused, naming the field.
pub(crate) fn lease_ms(lease_s: u64) -> Result<Millis, ClusterError> {
    if !(1..=MAX_LEASE_S).contains(&lease_s) {
        return Err(ClusterError::Invalid(format!(
            "lease_s: {lease_s} is out of range: a lease lasts from 1 to {MAX_LEASE_S} seconds (ten years)"
        )));
    }
    Ok(lease_s as i64 * 1000)
}

/// `POST …/clusters`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    pub name: String,
    /// The template's name.
    pub template: String,
    /// A version of the template; the latest when absent.
    #[serde(default)]
    pub template_version: Option<i64>,
    /// Number of nodes; the template's default when absent.
    #[serde(default)]
    pub size: Option<u32>,
    /// The services to run; the template's default when absent.
    #[serde(default)]
    pub services: Option<Vec<String>>,
    /// Per service, changes to the template's configuration (a JSON merge patch).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub config: BTreeMap<String, Value>,
    /// The nodes the cluster may use; every node the environment may use when empty.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// The cluster is deleted this many seconds after creation unless its lease is extended
    /// (1 to 315360000, ten years).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 315_360_000)]
    pub lease_s: Option<u64>,
    /// A task failing this many times fails the create, which is rolled back (default 3).
    #[serde(default)]
    pub max_attempts: Option<u32>,
    /// Only show the layout and the plan; create nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `POST …/clusters/{name}/amend`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AmendRequest {
    /// The new number of nodes.
    #[serde(default)]
    pub size: Option<u32>,
    /// Services of the template to add.
    #[serde(default)]
    pub add_services: Vec<String>,
    /// Replaces the nodes the cluster may use.
    #[serde(default)]
    pub nodes: Option<Vec<String>>,
    #[serde(default)]
    pub preview: bool,
}

/// `POST …/clusters/{name}/reconfigure`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconfigureRequest {
    /// Per service, a JSON merge patch of the cluster's configuration overrides.
    #[schema(value_type = Object)]
    pub config: BTreeMap<String, Value>,
    #[serde(default)]
    pub preview: bool,
}

/// `POST …/clusters/{name}/services/{service}/{action}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ServiceAction {
    Stop,
    Start,
    Restart,
}

/// Overrides must name the cluster's services and be objects.
pub(crate) fn check_overrides(template: &Template, config: &BTreeMap<String, Value>) -> Result<(), ClusterError> {
    for (service, patch) in config {
        if !template.services.contains_key(service) {
            return Err(ClusterError::Invalid(format!(
                "config: `{service}` is not one of the cluster's services"
            )));
        }
        if !patch.is_object() {
            return Err(ClusterError::Invalid(format!("config.{service}: must be a JSON object")));
        }
    }
    Ok(())
}
