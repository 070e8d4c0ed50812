//! The console's processes and connections: a graph (a column per node, a box per process, an
//! arrow per connection from its `from` end to its `to` end, labelled with the interface and its
//! agreed version), and the same as tables — processes with their state and
//! task progress, connections, and the changes each process has not taken yet — through the same
//! `App` calls and rules as `GET …/processes` and `…/connections`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, Method};
use maud::{Markup, html};

use super::extract::Path;
use super::pages::{layout, path_segment, time};
use super::session::{Sessions, SignedIn};
use super::{AppState, PageError, allow, authorize, refused};
use crate::processes::connections::ConnectionView;
use crate::processes::view::ProcessView;

pub async fn processes(
    State(app): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Result<Markup, PageError> {
    let signed_in = authorize(&app, &sessions, &headers, Method::GET, "/environments/{env}/processes", Some(&key)).await?;
    allow(&signed_in.principal, Method::GET, "/environments/{env}/connections", Some(&key))?;
    let env = app.get(&key).await.map_err(refused)?;
    let list = app.processes(&key, None).await.map_err(refused)?;
    let connections = app.connections(&key).await.map_err(refused)?;
    Ok(page(&signed_in, &env.name, &list, &connections))
}

/// Where the graph puts each process: a column per node (in name order), the node's processes
/// below each other.
struct Placed<'a> {
    columns: Vec<&'a str>,
    at: BTreeMap<&'a str, (f64, f64)>,
    rows: usize,
}

const BOX_W: f64 = 190.0;
const BOX_H: f64 = 52.0;
const GAP_X: f64 = 90.0;
const GAP_Y: f64 = 34.0;
const TOP: f64 = 34.0;

fn place(processes: &[ProcessView]) -> Placed<'_> {
    let mut by_node: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for p in processes {
        by_node.entry(p.node.as_str()).or_default().push(p.name.as_str());
    }
    let mut at = BTreeMap::new();
    let mut rows = 0;
    for (col, names) in by_node.values().enumerate() {
        rows = rows.max(names.len());
        for (row, name) in names.iter().enumerate() {
            let x = 10.0 + col as f64 * (BOX_W + GAP_X);
            let y = TOP + row as f64 * (BOX_H + GAP_Y);
            at.insert(*name, (x, y));
        }
    }
    Placed {
        columns: by_node.keys().copied().collect(),
        at,
        rows,
    }
}

/// The fill of a process's box; its state is written in it too.
fn fill(p: &ProcessView) -> &'static str {
    match p.state.as_str() {
        "running" => "#e8f5e9",
        "failed" => "#fdecee",
        _ => "#e3f2fd",
    }
}

fn graph(processes: &[ProcessView], connections: &[ConnectionView]) -> Markup {
    let placed = place(processes);
    let width = 20.0 + placed.columns.len().max(1) as f64 * (BOX_W + GAP_X);
    let height = TOP + placed.rows.max(1) as f64 * (BOX_H + GAP_Y);
    let summary = format!(
        "{} processes on {} nodes, {} connections",
        processes.len(),
        placed.columns.len(),
        connections.len()
    );
    html! {
        svg id="graph" role="img" aria-label=(summary) width="100%" style=(format!("max-width:{width:.0}px")) viewBox=(format!("0 0 {width:.0} {height:.0}"))
            xmlns="http://www.w3.org/2000/svg" font-family="system-ui, sans-serif" {
            defs {
                marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse" {
                    path d="M 0 0 L 10 5 L 0 10 z" fill="#0b5cad" {}
                }
            }
            @for (col, node) in placed.columns.iter().enumerate() {
                text x=(format!("{:.1}", 10.0 + col as f64 * (BOX_W + GAP_X))) y="18" font-size="13" font-weight="bold" fill="#55606b" {
                    "node " (node)
                }
            }
            // Connections first, under the boxes: from the box's edge facing the other.
            @for c in connections {
                @if let (Some(&(fx, fy)), Some(&(tx, ty))) = (placed.at.get(c.from.process.as_str()), placed.at.get(c.to.process.as_str())) {
                    @let (x1, y1, x2, y2) = ends((fx, fy), (tx, ty));
                    g.connection data-from=(c.from.process) data-to=(c.to.process) {
                        title { (c.from.process) "." (c.from.interface) " → " (c.to.process) "." (c.to.interface) " (version " (c.version) ")" }
                        line x1=(format!("{x1:.1}")) y1=(format!("{y1:.1}")) x2=(format!("{x2:.1}")) y2=(format!("{y2:.1}"))
                            stroke="#0b5cad" stroke-width="2" marker-end="url(#arrow)" {}
                        text x=(format!("{:.1}", (x1 + x2) / 2.0)) y=(format!("{:.1}", (y1 + y2) / 2.0 - 5.0)) font-size="11" text-anchor="middle" fill="#0b5cad" {
                            (c.to.interface) " " (c.version)
                        }
                    }
                }
            }
            @for p in processes {
                @if let Some(&(x, y)) = placed.at.get(p.name.as_str()) {
                    g.process data-process=(p.name) {
                        title { (p.name) ": " (p.service) " on " (p.node) ", " (p.state.as_str()) }
                        rect x=(format!("{x:.1}")) y=(format!("{y:.1}")) width=(BOX_W) height=(BOX_H) rx="6" fill=(fill(p)) stroke="#55606b" {}
                        text x=(format!("{:.1}", x + 8.0)) y=(format!("{:.1}", y + 20.0)) font-size="13" font-weight="bold" fill="#1d232a" { (p.name) }
                        text x=(format!("{:.1}", x + 8.0)) y=(format!("{:.1}", y + 40.0)) font-size="11" fill="#1d232a" { (p.service) " · " (p.state.as_str()) }
                    }
                }
            }
        }
    }
}

/// Where a connection's line starts and ends: the middles of the facing sides of the two boxes
/// (their top and bottom when they are in one column).
fn ends(from: (f64, f64), to: (f64, f64)) -> (f64, f64, f64, f64) {
    let (fx, fy) = from;
    let (tx, ty) = to;
    if (fx - tx).abs() < 1.0 {
        let (y1, y2) = if fy < ty { (fy + BOX_H, ty) } else { (fy, ty + BOX_H) };
        (fx + BOX_W / 2.0, y1, tx + BOX_W / 2.0, y2)
    } else if fx < tx {
        (fx + BOX_W, fy + BOX_H / 2.0, tx, ty + BOX_H / 2.0)
    } else {
        (fx, fy + BOX_H / 2.0, tx + BOX_W, ty + BOX_H / 2.0)
    }
}

fn progress(p: &ProcessView) -> String {
    p.progress.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", ")
}

fn page(signed_in: &SignedIn, env: &str, processes: &[ProcessView], connections: &[ConnectionView]) -> Markup {
    let base = format!("/environments/{}", path_segment(env));
    let busy = processes.iter().any(|p| !matches!(p.state.as_str(), "running" | "failed"));
    layout(
        &format!("Processes of {env}"),
        Some(signed_in),
        html! {
            @if busy { div data-live="" data-poll="1000" {} } @else { div data-live=(format!("{base}/live")) {} }
            p { a href=(base) { "← " (env) } }
            h1 { "Processes of " (env) }
            div data-part="processes" {
                @if processes.is_empty() {
                    p { "No process yet: create one with " code { "POST /api/v1/environments/" (env) "/processes" } "." }
                } @else {
                    (graph(processes, connections))
                    h2 { "Processes" }
                    table id="processes" {
                        thead { tr { th { "Process" } th { "Service" } th { "Node" } th { "State" } th { "Tasks" } th { "Not taken yet" } th { "Failure" } } }
                        tbody {
                            @for p in processes {
                                tr data-process=(p.name) {
                                    td { (p.name) }
                                    td { (p.service) }
                                    td { (p.node) }
                                    td.state { (p.state.as_str()) }
                                    td { (progress(p)) }
                                    td.pending {
                                        @if p.pending.is_empty() { "nothing" }
                                        @for (i, c) in p.pending.iter().enumerate() {
                                            @if i > 0 { br; }
                                            code { (c.step) } " " (c.status) " since " (time(c.since))
                                            @if let Some(e) = &c.last_error { ": " (e) }
                                        }
                                    }
                                    td { @if let Some(f) = &p.failure { code { (f.code) } ": " (f.message) } }
                                }
                            }
                        }
                    }
                    h2 { "Connections" }
                    @if connections.is_empty() {
                        p { "No connection." }
                    } @else {
                        table id="connections" {
                            thead { tr { th { "From" } th { "To" } th { "Version" } th { "Made by" } th { "Made" } } }
                            tbody {
                                @for c in connections {
                                    tr data-connection=(c.id) {
                                        td { (c.from.process) "." (c.from.interface) }
                                        td { (c.to.process) "." (c.to.interface) }
                                        td { (c.version) }
                                        td { @if let Some(a) = &c.created_by { (a) } @else { "the host" } }
                                        td { (time(c.created_at)) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_runs_between_the_facing_sides_of_its_boxes() {
        // Side by side: from the right edge of the left box to the left edge of the right one.
        assert_eq!(ends((10.0, 34.0), (290.0, 34.0)), (200.0, 60.0, 290.0, 60.0));
        assert_eq!(ends((290.0, 34.0), (10.0, 34.0)), (290.0, 60.0, 200.0, 60.0));
        // One column: bottom to top.
        assert_eq!(ends((10.0, 34.0), (10.0, 120.0)), (105.0, 86.0, 105.0, 120.0));
        assert_eq!(ends((10.0, 120.0), (10.0, 34.0)), (105.0, 120.0, 105.0, 86.0));
    }
}
