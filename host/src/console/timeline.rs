//! The console's deploy timeline: the actions of the released version (its deploy, and any
//! repair since) over time, as a picture: one bar per action from its start to its end, its
//! outcome told by the bar's pattern and its label, not by colour alone. Read through the same
//! `App` call and rule as `GET /environments/{env}/actions`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Extension;
use axum::extract::State;

use super::extract::Path;
use axum::http::{HeaderMap, Method};
use maud::{Markup, html};

use super::pages::{layout, path_segment, time};
use super::session::Sessions;
use super::{AppState, PageError, authorize, refused};
use crate::store::{ActionFilter, LoggedAction};

/// The most actions drawn.
const MOST: u32 = 300;
/// The drawing's width in user units; the label column is left of it.
const WIDTH: f64 = 900.0;
const LABEL: f64 = 260.0;

pub async fn timeline(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Result<Markup, PageError> {
    let signed_in = authorize(&app, &sessions, &headers, Method::GET, "/environments/{env}/actions", Some(&key)).await?;
    let env = app.get(&key).await.map_err(refused)?;
    let mut actions = match env.released_version {
        Some(version) => {
            let filter = ActionFilter {
                version: Some(version),
                limit: MOST,
                ..ActionFilter::default()
            };
            app.actions(&env, &filter).await.map_err(refused)?.items
        }
        None => Vec::new(),
    };
    actions.sort_by_key(|a| (a.action.started_at, a.seq));
    let base = format!("/environments/{}", path_segment(&env.name));
    Ok(layout(
        &format!("{} timeline", env.name),
        Some(&signed_in),
        html! {
            div data-live=(format!("{base}/live")) {}
            p { a href=(base) { "← " (env.name) } }
            h1 { "Timeline of " (env.name) }
            div data-part="timeline" {
                @match env.released_version {
                    None => p { "Nothing released yet." },
                    Some(version) => {
                        p { "The actions of version " (version) " (its deploy, and repairs since), the latest " (MOST) " at most." }
                        (picture(&actions))
                    }
                }
            }
        },
    ))
}

/// How an outcome is drawn: its fill and whether the bar is hatched.
fn style(outcome: &str) -> (&'static str, bool) {
    match outcome {
        "changed" => ("#1565c0", false),
        "unchanged" => ("#2e7d32", false),
        "failed" | "unavailable" => ("#c62828", true),
        _ => ("#6d6d6d", true),
    }
}

fn picture(actions: &[LoggedAction]) -> Markup {
    if actions.is_empty() {
        return html! { p { "No action yet." } };
    }
    let start = actions.iter().map(|a| a.action.started_at).min().unwrap_or(0);
    let end = actions.iter().map(|a| a.action.finished_at).max().unwrap_or(start).max(start + 1);
    let span = (end - start) as f64;
    let row = (600.0 / actions.len() as f64).clamp(4.0, 18.0);
    let height = row * actions.len() as f64 + 30.0;
    let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
    for a in actions {
        *outcomes.entry(a.action.outcome.as_str()).or_default() += 1;
    }
    let summary = format!(
        "{} actions over {} ms: {}",
        actions.len(),
        end - start,
        outcomes.iter().map(|(o, n)| format!("{n} {o}")).collect::<Vec<_>>().join(", ")
    );
    html! {
        p id="timeline-summary" { (summary) " (from " (time(start)) ")." }
        p.counts {
            "Key: " @for (outcome, _) in &outcomes {
                @let (fill, hatched) = style(outcome);
                span style=(format!("display:inline-block;width:1.2em;height:.8em;background:{fill};margin:0 .3em 0 .8em")) {}
                (outcome) @if hatched { " (hatched)" }
            }
        }
        svg id="timeline" role="img" aria-label=(summary) width="100%" viewBox=(format!("0 0 {} {height:.0}", LABEL + WIDTH))
            xmlns="http://www.w3.org/2000/svg" {
            defs {
                pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)" {
                    line x1="0" y1="0" x2="0" y2="6" stroke="#fff" stroke-width="2" {}
                }
            }
            // The time axis: start, middle, end.
            @for (i, label) in [(0.0, "0 ms".to_string()), (0.5, format!("{:.0} ms", span / 2.0)), (1.0, format!("{span:.0} ms"))] {
                text x=(format!("{:.1}", LABEL + i * (WIDTH - 60.0))) y="12" font-size="11" fill="#55606b" { (label) }
            }
            @for (i, a) in actions.iter().enumerate() {
                @let (fill, hatched) = style(&a.action.outcome);
                @let x = LABEL + (a.action.started_at - start) as f64 / span * (WIDTH - 60.0);
                @let w = (((a.action.finished_at - a.action.started_at) as f64 / span) * (WIDTH - 60.0)).max(1.5);
                @let y = 20.0 + i as f64 * row;
                g {
                    title { (a.action.resource_id) ": " (a.action.kind.as_str()) ", " (a.action.outcome) ", "
                        (a.action.finished_at - a.action.started_at) " ms" }
                    @if row >= 10.0 {
                        text x=(format!("{:.1}", LABEL - 6.0)) y=(format!("{:.1}", y + row * 0.75)) font-size="10" text-anchor="end" fill="#1d232a" {
                            (short(&a.action.resource_id))
                        }
                    }
                    rect x=(format!("{x:.1}")) y=(format!("{y:.1}")) width=(format!("{w:.1}")) height=(format!("{:.1}", (row - 1.0).max(1.0))) fill=(fill) {}
                    @if hatched {
                        rect x=(format!("{x:.1}")) y=(format!("{y:.1}")) width=(format!("{w:.1}")) height=(format!("{:.1}", (row - 1.0).max(1.0))) fill="url(#hatch)" {}
                    }
                }
            }
        }
    }
}

/// A resource id short enough for the label column.
fn short(id: &str) -> String {
    if id.chars().count() <= 42 {
        id.to_string()
    } else {
        let tail: String = id.chars().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect();
        format!("…{tail}")
    }
}
