//! The one table of who may call which route of `/api/v1`: method and path as the OpenAPI
//! document names them, and the [`Rule`] each needs. A route missing here is refused to
//! everyone (fail closed); a unit test checks that every route of the document has a rule, and
//! the API test `every_route_answers_each_role_as_its_rule_says` tries each with every role.

use std::collections::HashMap;
use std::sync::LazyLock;

use axum::http::Method;

use super::{Role, Rule, ServerRole};

const ADMIN: Rule = Rule::Server(ServerRole::Admin);
const VIEWER: Rule = Rule::Environment(Role::Viewer);
const OPERATOR: Rule = Rule::Environment(Role::Operator);
const OWNER: Rule = Rule::Environment(Role::Owner);

/// `(method, path, rule)`; paths relative to `/api/v1`.
pub const RULES: &[(&str, &str, Rule)] = &[
    ("GET", "/health", Rule::Open),
    ("POST", "/login", Rule::Open),
    ("GET", "/me", Rule::Signed),
    // Environments: listing shows the caller's own; creating and deleting one is the admin's.
    ("GET", "/environments", Rule::Signed),
    ("POST", "/environments", ADMIN),
    ("GET", "/environments/{env}", VIEWER),
    ("PATCH", "/environments/{env}", OWNER),
    ("DELETE", "/environments/{env}", ADMIN),
    ("POST", "/environments/{env}/halt", OPERATOR),
    ("POST", "/environments/{env}/resume", OPERATOR),
    ("GET", "/environments/{env}/members", VIEWER),
    ("PUT", "/environments/{env}/members/{user}", OWNER),
    ("DELETE", "/environments/{env}/members/{user}", OWNER),
    // Intents.
    ("GET", "/environments/{env}/intents", VIEWER),
    ("POST", "/environments/{env}/intents", OWNER),
    ("GET", "/environments/{env}/intents/{version}", VIEWER),
    ("GET", "/environments/{env}/intents/{version}/diff/{other}", VIEWER),
    ("POST", "/environments/{env}/intents/{version}/release", OWNER),
    ("POST", "/environments/{env}/intents/{version}/rollback", OWNER),
    ("PUT", "/environments/{env}/resource-sets/{name}", OWNER),
    // Resources, the action log and events.
    ("GET", "/environments/{env}/resources", VIEWER),
    ("GET", "/environments/{env}/resources/{id}", VIEWER),
    ("GET", "/environments/{env}/resources/{id}/actions", VIEWER),
    ("GET", "/environments/{env}/actions", VIEWER),
    ("GET", "/environments/{env}/events", VIEWER),
    // Deploy, repair, dryrun.
    ("POST", "/environments/{env}/deploy", OPERATOR),
    ("POST", "/environments/{env}/repair", OPERATOR),
    ("POST", "/environments/{env}/dryrun", OPERATOR),
    ("GET", "/environments/{env}/dryruns", VIEWER),
    ("GET", "/environments/{env}/dryruns/{id}", VIEWER),
    ("GET", "/environments/{env}/operations/{id}", VIEWER),
    // Cluster templates (owner) and clusters (operations: operator; shape: owner).
    ("GET", "/environments/{env}/templates", VIEWER),
    ("GET", "/environments/{env}/templates/{name}", VIEWER),
    ("POST", "/environments/{env}/templates/{name}", OWNER),
    ("DELETE", "/environments/{env}/templates/{name}", OWNER),
    ("GET", "/environments/{env}/templates/{name}/versions", VIEWER),
    ("GET", "/environments/{env}/clusters", VIEWER),
    ("POST", "/environments/{env}/clusters", OPERATOR),
    ("GET", "/environments/{env}/clusters/{name}", VIEWER),
    ("DELETE", "/environments/{env}/clusters/{name}", OPERATOR),
    ("POST", "/environments/{env}/clusters/{name}/amend", OPERATOR),
    ("POST", "/environments/{env}/clusters/{name}/reconfigure", OPERATOR),
    ("POST", "/environments/{env}/clusters/{name}/lease", OPERATOR),
    ("POST", "/environments/{env}/clusters/{name}/retry", OPERATOR),
    ("POST", "/environments/{env}/clusters/{name}/services/{service}/{action}", OPERATOR),
    // Nodes: the admin's inventory; an environment's members see the nodes it may use, and its
    // owners make nodes private to it.
    ("GET", "/nodes", ADMIN),
    ("POST", "/nodes", ADMIN),
    ("GET", "/nodes/{node}", ADMIN),
    ("PATCH", "/nodes/{node}", ADMIN),
    ("DELETE", "/nodes/{node}", ADMIN),
    ("POST", "/nodes/{node}/verify", ADMIN),
    ("POST", "/nodes/{node}/accept-host-key", ADMIN),
    ("GET", "/environments/{env}/nodes", VIEWER),
    ("PUT", "/environments/{env}/nodes/{node}", OWNER),
    ("DELETE", "/environments/{env}/nodes/{node}", OWNER),
    // Users (the admin's) and tokens (each user's own; the admin's of everyone).
    ("GET", "/users", ADMIN),
    ("POST", "/users", ADMIN),
    ("GET", "/users/{user}", ADMIN),
    ("PATCH", "/users/{user}", ADMIN),
    ("DELETE", "/users/{user}", ADMIN),
    ("POST", "/users/{user}/tokens", ADMIN),
    ("GET", "/tokens", Rule::Signed),
    ("POST", "/tokens", Rule::Signed),
    ("DELETE", "/tokens/{id}", Rule::Signed),
    ("GET", "/audit", ADMIN),
    // The replica set: the admin's.
    ("GET", "/replicas", ADMIN),
    ("POST", "/replicas/{id}/drain", ADMIN),
    // The service catalog: every signed-in user reads it (publishing is the registry's).
    ("GET", "/services", Rule::Signed),
    ("GET", "/services/{name}", Rule::Signed),
    ("GET", "/services/{name}/{version}", Rule::Signed),
    // Processes: run by operators, like cluster operations.
    ("GET", "/environments/{env}/processes", VIEWER),
    ("POST", "/environments/{env}/processes", OPERATOR),
    ("GET", "/environments/{env}/processes/{name}", VIEWER),
    ("PATCH", "/environments/{env}/processes/{name}", OPERATOR),
    ("DELETE", "/environments/{env}/processes/{name}", OPERATOR),
    ("POST", "/environments/{env}/processes/{name}/move", OPERATOR),
    ("GET", "/environments/{env}/connections", VIEWER),
    ("POST", "/environments/{env}/connections", OPERATOR),
    ("GET", "/environments/{env}/connections/{id}", VIEWER),
    ("DELETE", "/environments/{env}/connections/{id}", OPERATOR),
    ("GET", "/environments/{env}/pending", VIEWER),
];

static BY_ROUTE: LazyLock<HashMap<(&'static str, &'static str), Rule>> =
    LazyLock::new(|| RULES.iter().map(|(method, path, rule)| ((*method, *path), *rule)).collect());

/// The rule of a route (`path` relative to `/api/v1`, as the document names it); `None` for
/// a route without one, which the API refuses.
pub fn rule(method: &Method, path: &str) -> Option<Rule> {
    BY_ROUTE.get(&(method.as_str(), path)).copied()
}

/// What the registry's own API (`/registry`) needs: reading is open (plugins are public,
/// content-addressed bytes), writing needs the `publisher` role.
pub fn registry_rule(method: &Method) -> Rule {
    if matches!(*method, Method::GET | Method::HEAD) {
        Rule::Open
    } else {
        Rule::Server(ServerRole::Publisher)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_each_route_once() {
        assert_eq!(BY_ROUTE.len(), RULES.len(), "a route is listed twice");
    }
}
