//! The answers every operation of the OpenAPI document may give by its shape alone, added in one
//! place so that no handler can forget one: 401 on every operation that needs a token, 400 on
//! every one with parameters or a body (they are decoded by the extractors of `extract`), 413
//! and 415 on every one with a body. An answer a handler documents itself is kept as written.
//!
//! No operation answers 403: every token is an admin token. 414 `uri_too_long` and 431
//! `headers_too_large` can answer any request (`serve`); the document's description says so
//! rather than every operation.

use utoipa::openapi::path::{Operation, ParameterIn, PathItem};
use utoipa::openapi::security::SecurityRequirement;
use utoipa::openapi::{Content, OpenApi, Ref, RefOr, ResponseBuilder};

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

/// Adds the answers of [the module](self) to every operation of `doc`.
pub fn add_common_answers(doc: &mut OpenApi) {
    for item in doc.paths.paths.values_mut() {
        operations(item).for_each(add_to);
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
