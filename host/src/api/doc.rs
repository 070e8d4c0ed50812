//! The answers every operation of the OpenAPI document may give by its shape alone, added in one
//! place so that no handler can forget one: 401 on every operation that needs a token, 400 on
//! every one with parameters or a body (they are decoded by the extractors of `extract`), 413
//! and 415 on every one with a body. An answer a handler documents itself is kept as written.
//!
//! Each operation's description ends with the role it needs, and each that needs a role
//! answers 403 `forbidden` — both from the one table of rules (`access::rules`). 414 `uri_too_long` and 431
//! `headers_too_large` can answer any request (`serve`); the document's description says so
//! rather than every operation.
//!
//! It also links each operation that creates something (an environment, a version, a node, …)
//! to the operations that name it in their path (OpenAPI links: which field of the answer is
//! which path parameter), so that a client — and schemathesis's stateful phase — can follow them.

use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{Operation, ParameterIn, PathItem};
use utoipa::openapi::security::SecurityRequirement;
use utoipa::openapi::{Content, OpenApi, Ref, RefOr, ResponseBuilder};

use crate::access::Rule;

/// What a creating operation's answer names: (its operation id, its status, the path segment
/// that names the created thing in other operations' paths, the parameters it sets — each a
/// parameter's name and the runtime expression of its value).
type Producer = (&'static str, &'static str, &'static str, &'static [(&'static str, &'static str)]);

const PRODUCERS: &[Producer] = &[
    (
        "create_environment",
        "201",
        "/environments/{env}",
        &[("env", "$response.body#/name")],
    ),
    (
        "submit_intent",
        "201",
        "/intents/{version}",
        &[("env", "$request.path.env"), ("version", "$response.body#/version")],
    ),
    (
        "deploy",
        "202",
        "/operations/{id}",
        &[("env", "$request.path.env"), ("id", "$response.body#/id")],
    ),
    (
        "repair",
        "202",
        "/operations/{id}",
        &[("env", "$request.path.env"), ("id", "$response.body#/id")],
    ),
    (
        "start_dryrun",
        "202",
        "/dryruns/{id}",
        &[("env", "$request.path.env"), ("id", "$response.body#/id")],
    ),
    (
        "submit_template",
        "201",
        "/templates/{name}",
        &[("env", "$request.path.env"), ("name", "$response.body#/name")],
    ),
    (
        "create_cluster",
        "202",
        "/clusters/{name}",
        &[("env", "$request.path.env"), ("name", "$response.body#/name")],
    ),
    ("register_node", "201", "/nodes/{node}", &[("node", "$response.body#/name")]),
    ("create_token", "201", "/tokens/{id}", &[("id", "$response.body#/id")]),
    ("create_user", "201", "/users/{user}", &[("user", "$response.body#/name")]),
];

fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.patch,
        &mut item.head,
        &mut item.options,
        &mut item.trace,
    ]
    .into_iter()
    .flatten()
}

/// Adds the answers and links of [the module](self) to every operation of `doc`.
pub fn add_common_answers(doc: &mut OpenApi) {
    for item in doc.paths.paths.values_mut() {
        operations(item).for_each(add_to);
    }
    add_links(doc);
}

/// Links each producer's answer to every operation whose path names what it created.
fn add_links(doc: &mut OpenApi) {
    let mut consumers: Vec<(String, String)> = Vec::new();
    for (path, item) in doc.paths.paths.iter_mut() {
        for operation in operations(item) {
            if let Some(id) = &operation.operation_id {
                consumers.push((path.clone(), id.clone()));
            }
        }
    }
    for item in doc.paths.paths.values_mut() {
        for operation in operations(item) {
            let Some((_, status, segment, parameters)) = PRODUCERS.iter().find(|(id, ..)| operation.operation_id.as_deref() == Some(id))
            else {
                continue;
            };
            let Some(RefOr::T(response)) = operation.responses.responses.get_mut(*status) else {
                continue;
            };
            for (path, consumer) in &consumers {
                if !path.contains(segment) || Some(consumer) == operation.operation_id.as_ref() {
                    continue;
                }
                let link = parameters
                    .iter()
                    .filter(|(name, _)| path.contains(&format!("{{{name}}}")))
                    .fold(LinkBuilder::new().operation_id(consumer), |link, (name, value)| {
                        link.parameter(*name, *value)
                    });
                response.links.insert(consumer.clone(), RefOr::T(link.build()));
            }
        }
    }
}

/// Says in each operation's description which role it needs, and adds 403 where one is needed.
pub fn add_rules(doc: &mut OpenApi) {
    use axum::http::Method;
    for (path, item) in doc.paths.paths.iter_mut() {
        let methods = [
            (Method::GET, &mut item.get),
            (Method::PUT, &mut item.put),
            (Method::POST, &mut item.post),
            (Method::DELETE, &mut item.delete),
            (Method::PATCH, &mut item.patch),
        ];
        for (method, operation) in methods {
            let Some(operation) = operation else { continue };
            let Some(rule) = crate::access::rules::rule(&method, path) else {
                continue;
            };
            let needs = format!("Needs {}.", rule.describe());
            operation.description = Some(match operation.description.take() {
                Some(d) if !d.is_empty() => format!("{d}\n\n{needs}"),
                _ => needs,
            });
            if matches!(rule, Rule::Server(_) | Rule::Environment(_)) {
                add(
                    operation,
                    "403",
                    "The token does not carry the role this needs; the message names it (`forbidden`)",
                );
            }
        }
    }
}

fn add_to(operation: &mut Operation) {
    let open = operation
        .security
        .as_ref()
        .is_some_and(|requirements| requirements.iter().any(|r| *r == SecurityRequirement::default()));
    let parameters: Vec<ParameterIn> = operation
        .parameters
        .iter()
        .flatten()
        .filter_map(|p| match p {
            RefOr::T(p) => Some(p.parameter_in.clone()),
            RefOr::Ref(_) => None,
        })
        .collect();
    let body = operation.request_body.is_some();

    let mut bad_input = Vec::new();
    if parameters.contains(&ParameterIn::Path) {
        bad_input.push("`invalid_path` (a path parameter)");
    }
    if parameters.contains(&ParameterIn::Query) {
        bad_input.push("`invalid_query` (an unknown query parameter, or a value outside its type or range)");
    }
    if body {
        bad_input.push("`invalid_json` (the body: malformed, or not of its schema)");
    }
    if !bad_input.is_empty() {
        add(
            operation,
            "400",
            &format!("Bad input, named in the message: {}", bad_input.join(", ")),
        );
    }
    if !open {
        add(operation, "401", "No bearer token, or not one of this host's (`unauthorized`)");
    }
    if body {
        add(
            operation,
            "413",
            "The body is larger than the host's `max_body_bytes` (`too_large`)",
        );
        add(
            operation,
            "415",
            "The body is not JSON by its `Content-Type` (`unsupported_media_type`)",
        );
    }
}

/// Adds `status` with the error body, unless the operation documents it already.
fn add(operation: &mut Operation, status: &str, description: &str) {
    operation.responses.responses.entry(status.to_string()).or_insert_with(|| {
        RefOr::T(
            ResponseBuilder::new()
                .description(description)
                .content("application/json", Content::new(Some(Ref::from_schema_name("ErrorBody"))))
                .build(),
        )
    });
}
