//! The console's HTML: one layout and one function per page. maud escapes every interpolated
//! value, so nothing a user, a plugin or a device wrote can become markup.

use std::collections::BTreeMap;

use maud::{DOCTYPE, Markup, html};

use super::session::SignedIn;
use crate::api::ApiError;
use crate::app::DesiredResource;
use crate::scheduler::ResourceStatus;
use crate::store::{Environment, LoggedAction, Millis, ResourceState, StateFilter};

/// The stylesheet: plain CSS, focus always visible, statuses told by text as well as colour.
pub const CSS: &str = r#"
:root { --fg: #1d232a; --muted: #55606b; --line: #d5dbe1; --bg: #f7f8fa; --accent: #0b5cad; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; gap: 1.5rem; align-items: center; padding: .6rem 1.2rem; background: #14202e; color: #fff; }
header a { color: #fff; }
header .who { margin-left: auto; }
main { padding: 1.2rem; max-width: 80rem; }
a { color: var(--accent); }
:focus-visible { outline: 3px solid #f0a500; outline-offset: 2px; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: #eef1f4; }
td code, td pre { overflow-wrap: anywhere; white-space: pre-wrap; }
form.inline { display: inline; }
fieldset { border: 1px solid var(--line); background: #fff; margin: 0 0 1rem; padding: .8rem 1rem; }
label { display: block; margin: .3rem 0; }
input, select, button { font: inherit; padding: .25rem .45rem; }
button { cursor: pointer; }
.notice { border-left: 4px solid #2e7d32; background: #e8f5e9; padding: .5rem .8rem; margin: .8rem 0; }
header nav a { margin-right: .8rem; }
.error { border-left: 4px solid #b00020; background: #fdecee; padding: .5rem .8rem; margin: .8rem 0; }
.error code { font-weight: bold; }
.operations { margin: .4rem 0 1rem; }
nav[aria-label="Environment"] { margin: .4rem 0; }
.summary { margin: .6rem 0 1rem; }
form.filters { display: flex; flex-wrap: wrap; gap: .4rem 1rem; align-items: end; margin-bottom: .8rem; }
form.filters label { margin: 0; }
.bar { display: flex; height: .9rem; width: 14rem; border: 1px solid var(--line); background: #fff; }
.bar span { display: block; height: 100%; }
.s-deployed { background: #2e7d32; } .s-available { background: #90a4ae; } .s-deploying { background: #1565c0; }
.s-failed { background: #c62828; } .s-skipped { background: #f9a825; } .s-undefined { background: #6a1b9a; }
.counts { color: var(--muted); font-size: .9em; }
pre { background: #fff; border: 1px solid var(--line); padding: .5rem; overflow: auto; max-height: 24rem; }
.diff-before { background: #fdecee; } .diff-after { background: #e8f5e9; }
.s-done { background: #2e7d32; } .s-pending { background: #cfd8dc; }
table.grid th[scope=row] { white-space: nowrap; }
table.grid td.runs { background: #f1f8f2; }
table.grid td.absent { color: var(--muted); text-align: center; }
table.grid caption { text-align: left; color: var(--muted); }
ul.tasks { list-style: none; margin: .2rem 0 0; padding: 0; font-size: .9em; display: flex; flex-wrap: wrap; gap: .15rem .7rem; }
ul.tasks li { padding-left: .5rem; border-left: 4px solid transparent; background: none; }
ul.tasks li.s-done { border-left-color: #2e7d32; } ul.tasks li.s-failed { border-left-color: #c62828; }
ul.tasks li.s-deploying { border-left-color: #1565c0; } ul.tasks li.s-pending, ul.tasks li.s-available { border-left-color: #90a4ae; }
.cluster-operations fieldset { max-width: 50rem; }
"#;

/// The pages' only script (the content security policy allows no other, and no inline script):
/// a form with `data-confirm` asks before it is sent; a page with `data-live` follows the
/// environment's events and, a moment after a change, fetches itself again and swaps in its
/// `data-part` sections (the filters, the page and the scroll position stay). Without it the
/// pages work, only not live and without the questions.
pub const SCRIPT: &str = r#"
document.addEventListener('submit', function (e) {
  var question = e.target.getAttribute && e.target.getAttribute('data-confirm');
  if (question && !window.confirm(question)) e.preventDefault();
});
(function () {
  var main = document.querySelector('[data-live]');
  if (!main) return;
  var timer = null, poller = null;
  function refresh() {
    fetch(location.href, { credentials: 'same-origin' }).then(function (r) {
      if (!r.ok) return;
      return r.text().then(function (html) {
        var fresh = new DOMParser().parseFromString(html, 'text/html');
        document.querySelectorAll('[data-part]').forEach(function (old) {
          var part = fresh.querySelector('[data-part="' + old.getAttribute('data-part') + '"]');
          if (part) old.replaceWith(part);
        });
        // Finished: the page no longer asks to be polled.
        var still = fresh.querySelector('[data-live]');
        if ((!still || !still.getAttribute('data-poll')) && poller) { clearInterval(poller); poller = null; }
      });
    });
  }
  var every = parseInt(main.getAttribute('data-poll') || '0', 10);
  if (every > 0) poller = setInterval(refresh, every);
  var url = main.getAttribute('data-live');
  if (!url || !window.EventSource) return;
  var events = new EventSource(url);
  events.onopen = function () { document.documentElement.setAttribute('data-live-open', ''); };
  events.addEventListener('changed', function () {
    if (timer) return;
    timer = setTimeout(function () { timer = null; refresh(); }, 300);
  });
})();
"#;

/// A path segment, percent-encoded (an environment's name is plain, but a link never trusts it).
pub fn path_segment(text: &str) -> String {
    url_encode(text)
}

/// Everything but RFC 3986's unreserved characters is percent-encoded.
const RESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

fn url_encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, RESERVED).to_string()
}

fn query(pairs: &BTreeMap<&str, String>) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", url_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

pub(super) fn time(ms: Millis) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| ms.to_string())
}

pub(super) fn layout(title: &str, signed_in: Option<&SignedIn>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · orc" }
                link rel="stylesheet" href="/console.css";
                script src="/console.js" defer {}
            }
            body {
                header {
                    strong { "orc" }
                    @if let Some(s) = signed_in {
                        nav aria-label="Main" {
                            a href="/environments" { "Environments" }
                            @if s.principal.is_admin() { " " a href="/nodes" { "Nodes" } " " a href="/users" { "Users" } }
                            " " a href="/plugins" { "Plugins" }
                            " " a href="/tokens" { "Tokens" }
                        }
                        span.who { "Signed in as " strong { (s.principal.user) } }
                        form.inline method="post" action="/sign-out" {
                            input type="hidden" name="_csrf" value=(s.csrf);
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

pub(super) fn error_box(e: &ApiError) -> Markup {
    html! {
        div.error role="alert" {
            code { (e.code) } ": " (e.message)
        }
    }
}

/// A refusal, as a page.
pub fn error(e: &ApiError) -> Markup {
    layout(
        "Refused",
        None,
        html! {
            h1 { "The request was refused" }
            (error_box(e))
            p { a href="/environments" { "Back to the environments" } }
        },
    )
}

pub fn sign_in(error: Option<&str>) -> Markup {
    layout(
        "Sign in",
        None,
        html! {
            h1 { "Sign in" }
            @if let Some(message) = error {
                div.error role="alert" { code { "unauthorized" } ": " (message) }
            }
            form method="post" action="/sign-in" {
                fieldset {
                    legend { "With a user name and password" }
                    label { "User name " input type="text" name="name" autocomplete="username"; }
                    label { "Password " input type="password" name="password" autocomplete="current-password"; }
                }
                fieldset {
                    legend { "Or with an API token" }
                    label { "Token " input type="password" name="token" id="token" autocomplete="off"; }
                }
                button type="submit" id="sign-in" { "Sign in" }
            }
        },
    )
}

/// A bar of the statuses' shares, with the counts in words beside it.
fn status_bar(counts: &[(ResourceStatus, i64)]) -> Markup {
    let total: i64 = counts.iter().map(|(_, n)| n).sum();
    html! {
        @if total == 0 {
            span.counts { "no resources" }
        } @else {
            div.bar role="img" aria-label=(counts_text(counts)) {
                @for (status, n) in counts {
                    span class=(format!("s-{}", status.as_str())) style=(format!("width:{:.2}%", *n as f64 * 100.0 / total as f64)) title=(format!("{}: {n}", status.as_str())) {}
                }
            }
            span.counts { (counts_text(counts)) }
        }
    }
}

fn counts_text(counts: &[(ResourceStatus, i64)]) -> String {
    counts
        .iter()
        .map(|(s, n)| format!("{} {n}", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn environments(signed_in: &SignedIn, rows: &[(Environment, Vec<(ResourceStatus, i64)>)], error: Option<(&str, &ApiError)>) -> Markup {
    layout(
        "Environments",
        Some(signed_in),
        html! {
            h1 { "Environments" }
            @if rows.is_empty() {
                p { "No environment you may see." }
            } @else {
                table {
                    thead { tr { th { "Name" } th { "Resources" } th { "Halted" } th { "Latest version" } th { "Released version" } } }
                    tbody {
                        @for (env, counts) in rows {
                            tr {
                                td { a href=(format!("/environments/{}", path_segment(&env.name))) { (env.name) } }
                                td { (status_bar(counts)) }
                                td { @if env.halted { "halted" } @else { "no" } }
                                td { (env.latest_version) }
                                td { @if let Some(v) = env.released_version { (v) } @else { "none" } }
                            }
                        }
                    }
                }
            }
            h2 { "Create an environment" }
            @if let Some((_, e)) = error { (error_box(e)) }
            form method="post" action="/environments" {
                input type="hidden" name="_csrf" value=(signed_in.csrf);
                label {
                    "Name (1–63 of a-z 0-9 - _) "
                    input type="text" name="name" id="new-environment" required value=(error.map(|(n, _)| n).unwrap_or_default())
                        aria-invalid=[error.map(|_| "true")];
                }
                button type="submit" id="create-environment" { "Create" }
            }
        },
    )
}

pub fn environment(
    signed_in: &SignedIn,
    env: &Environment,
    counts: &[(ResourceStatus, i64)],
    filter: &StateFilter,
    states: &[ResourceState],
    next: Option<BTreeMap<&str, String>>,
) -> Markup {
    let base = format!("/environments/{}", path_segment(&env.name));
    layout(
        &env.name,
        Some(signed_in),
        html! {
            div data-live=(format!("{base}/live")) {}
            h1 { "Environment " (env.name) }
            div.summary data-part="summary" {
                (status_bar(counts))
                " · latest version " (env.latest_version)
                " · released " @if let Some(v) = env.released_version { (v) } @else { "none" }
                @if env.halted { " · halted" }
            }
            nav aria-label="Environment" {
                a href=(format!("{base}/versions")) id="versions-link" { "Versions" }
                " · "
                a href=(format!("{base}/settings")) id="settings-link" { "Settings" }
                " · "
                a href=(format!("{base}/timeline")) id="timeline-link" { "Timeline" }
                " · "
                a href=(format!("{base}/clusters")) id="clusters-link" { "Clusters" }
                " · "
                a href=(format!("{base}/processes")) id="processes-link" { "Processes" }
                " · "
                a href=(format!("{base}/members")) id="members-link" { "Members" }
            }
            div.operations {
                @for (action, label, what) in [("deploy", "Deploy", "Deploy now: retry what failed or was skipped"), ("repair", "Repair", "Repair now: re-read every resource and restore what drifted"), ("dryrun", "Dryrun", "Dryrun: compare every resource with the latest version, changing nothing")] {
                    form.inline method="post" action=(format!("{base}/{action}")) {
                        input type="hidden" name="_csrf" value=(signed_in.csrf);
                        button type="submit" id=(action) title=(what) { (label) }
                    }
                    " "
                }
            }
            h2 { "Resources" }
            form.filters method="get" action=(base) {
                label {
                    "Status "
                    select name="status" {
                        option value="" { "any" }
                        @for s in ResourceStatus::ALL {
                            option value=(s.as_str()) selected[filter.status == Some(*s)] { (s.as_str()) }
                        }
                    }
                }
                label { "Type " input type="text" name="type" value=(filter.resource_type.clone().unwrap_or_default()); }
                label { "Node " input type="text" name="node" value=(filter.node.clone().unwrap_or_default()); }
                label { "Id contains " input type="text" name="q" value=(filter.text.clone().unwrap_or_default()); }
                button type="submit" { "Filter" }
            }
            div data-part="resources" {
            @if states.is_empty() {
                p { "No resource matches." }
            } @else {
                table id="resources" {
                    thead { tr { th { "Resource" } th { "Status" } th { "Version" } th { "Attempts" } th { "Last error" } } }
                    tbody {
                        @for s in states {
                            tr data-resource=(s.resource_id) {
                                td { a href=(format!("{base}/resource?id={}", url_encode(&s.resource_id))) { (s.resource_id) } }
                                td.status { (s.status.as_str()) }
                                td { (s.version) }
                                td { (s.attempts) }
                                td { @if let Some(e) = &s.last_error { code { (e.code) } ": " (e.message) } }
                            }
                        }
                    }
                }
            }
            @if let Some(next) = next {
                p { a href=(format!("{base}?{}", query(&next))) rel="next" { "Next page" } }
            }
            }
        },
    )
}

pub fn resource(
    signed_in: &SignedIn,
    env: &Environment,
    state: &ResourceState,
    desired: Option<&DesiredResource>,
    actions: &[LoggedAction],
) -> Markup {
    let base = format!("/environments/{}", path_segment(&env.name));
    layout(
        &state.resource_id,
        Some(signed_in),
        html! {
            p { a href=(base) { "← " (env.name) } }
            h1 { "Resource " code { (state.resource_id) } }
            table {
                tbody {
                    tr { th { "Status" } td #status { (state.status.as_str()) } }
                    tr { th { "Version" } td { (state.version) } }
                    tr { th { "Attempts" } td { (state.attempts) } }
                    tr { th { "Last deployed" } td { @if let Some(t) = state.last_deploy_at { (time(t)) } @else { "never" } } }
                    tr { th { "Last error" } td { @if let Some(e) = &state.last_error { code { (e.code) } ": " (e.message) } @else { "none" } } }
                }
            }
            h2 { "Desired" }
            @if let Some(DesiredResource { spec, dependents }) = desired {
                p { "Adaptor " code { (spec.adaptor.to_string()) } @if spec.purged { " · purged" } }
                p #requires { "Requires: " (resource_links(&base, &spec.requires)) }
                p #dependents { "Waited for by: " (resource_links(&base, dependents)) }
                pre { (pretty(&spec.shown_attributes().to_string())) }
            } @else {
                p { "Not in the released version." }
            }
            h2 { "Action log" }
            @if actions.is_empty() {
                p { "No action yet." }
            } @else {
                table id="actions" {
                    thead { tr { th { "Started" } th { "Kind" } th { "Outcome" } th { "Changes" } th { "Error" } } }
                    tbody {
                        @for a in actions {
                            tr {
                                td { (time(a.action.started_at)) }
                                td { (a.action.kind.as_str()) }
                                td.outcome { (a.action.outcome) }
                                td { (changes(&a.action.changes)) }
                                td { @if let Some(e) = &a.action.error { code { (e.code) } ": " (e.message) } }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// Resources as links to their pages, or "nothing".
fn resource_links(base: &str, ids: &[crate::intent::ResourceId]) -> Markup {
    html! {
        @if ids.is_empty() { "nothing" }
        @for (i, r) in ids.iter().enumerate() {
            @if i > 0 { ", " }
            a href=(format!("{base}/resource?id={}", url_encode(&r.to_string()))) { (r.to_string()) }
        }
    }
}

/// An action's changes (JSON text) as before/after rows.
fn changes(json: &str) -> Markup {
    let list: Vec<serde_json::Value> = serde_json::from_str(json).unwrap_or_default();
    changes_of(&list)
}

/// Changes (`{field, current, desired}`) as before/after rows.
pub(super) fn changes_of(list: &[serde_json::Value]) -> Markup {
    html! {
        @if list.is_empty() {
            "none"
        } @else {
            table.changes {
                thead { tr { th { "Field" } th { "Before" } th { "After" } } }
                tbody {
                    @for c in list {
                        tr {
                            td { (c.get("field").and_then(|f| f.as_str()).unwrap_or("?")) }
                            td.diff-before { (shown(c.get("current"))) }
                            td.diff-after { (shown(c.get("desired"))) }
                        }
                    }
                }
            }
        }
    }
}

pub(super) fn shown(value: Option<&serde_json::Value>) -> String {
    match value {
        None | Some(serde_json::Value::Null) => "(none)".into(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

pub(super) fn pretty(json: &str) -> String {
    serde_json::from_str::<serde_json::Value>(json)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| json.to_string())
}
