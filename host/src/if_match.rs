//! What a request's `If-Match` names, for every layer that refuses a change naming another
//! version than the current one (409 `version_conflict`): [`tag_matches`] compares it with an
//! object's tag, [`expected_revision`] reads the revision it names for objects whose `ETag` is a
//! number. The API reads the header and sets the `ETag` (`api::etag`).

/// Whether an `If-Match` value (`"tag"`, `W/"tag"`, `tag` or `*`) names `current`.
pub fn tag_matches(if_match: &str, current: &str) -> bool {
    if_match.split(',').any(|t| {
        let t = t.trim();
        t == "*" || t.trim_start_matches("W/").trim_matches('"') == current
    })
}

/// The revision an `If-Match` names, for objects whose ETag is a number: `None` without one (or
/// `*`); a value that is no number names a revision nothing has (-1).
pub fn expected_revision(if_match: Option<&str>) -> Option<i64> {
    let tag = if_match?.trim();
    if tag == "*" {
        return None;
    }
    Some(tag.trim_start_matches("W/").trim_matches('"').parse().unwrap_or(-1))
}
