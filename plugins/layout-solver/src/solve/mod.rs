//! The layout algorithm: template + size + nodes + existing layout → a valid layout, or the
//! constraint that cannot be met.
//!
//! 1. [`problem`]: services joined by `together` groups become units, `apart` groups conflicts
//!    between units, needs a set of eligible units per node; requests that plainly cannot be met
//!    are refused here, naming the culprit ([`Problem::precheck`]).
//! 2. [`existing`]: the existing layout, cleaned of what can no longer stay, and which of its
//!    nodes the cluster keeps.
//! 3. [`search`]: a complete depth-first search (bounded by a step budget) for the nodes and,
//!    on each, the units it may host, trying the existing layout first.
//! 4. [`assign`]: the units each chosen node hosts — its existing ones, then up to every
//!    service's `min`, then up to its `count.max` (fill).
//! 5. The result is checked with [`orc_cluster::check_layout`] before it is returned.
//!
//! When the search proves no layout exists, [`diagnose`] names the constraint: the first
//! `apart` group, then `min`, then `max` whose relaxation alone would let a layout exist, else
//! the size.

mod assign;
mod existing;
mod matching;
mod problem;
mod search;

use orc_cluster::{Layout, NodeInfo, Template, check_layout};

use self::problem::{Problem, Units, bits, nodes};
use self::search::{Search, Stop};

/// Search steps allowed for one request (each a decision or a step back). Valid layouts of
/// realistic templates are found in about `size` steps; the budget only bounds proofs that no
/// layout exists.
const BUDGET: u64 = 500_000;

/// Search steps allowed for each relaxed problem [`diagnose`] tries.
const DIAGNOSE_BUDGET: u64 = 50_000;

/// Why no layout was returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No layout meets `constraint` (named by its path in the template, or `size`).
    NoLayout { constraint: String, message: String },
    /// The request is malformed (e.g. a node listed twice).
    Invalid(String),
    /// The solver could not answer (search budget exhausted, or an internal error).
    Failed(String),
}

impl Failure {
    pub(crate) fn no_layout(constraint: impl Into<String>, message: impl Into<String>) -> Failure {
        Failure::NoLayout {
            constraint: constraint.into(),
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Failure {
        Failure::Invalid(message.into())
    }
}

/// Solves one request. `template` must be valid ([`Template::validate`]) and restricted to the
/// cluster's services ([`Template::select`]).
pub fn solve(template: &Template, size: u32, nodes: &[NodeInfo], existing: &Layout) -> Result<Layout, Failure> {
    let p = Problem::new(template, size, nodes)?;
    p.precheck()?;
    let kept = existing::keep(&p, existing);
    let found = match Search::new(&p, &kept.prefer, kept.kept.clone(), &kept.dropped, BUDGET).run() {
        Ok(found) => found,
        Err(Stop::Exhausted) => return Err(diagnose(&p)),
        Err(Stop::Incomplete) => {
            return Err(Failure::Failed(format!(
                "the template's apart groups allow more than {} combinations of services on one node; the search tried that many and found no layout, which proves nothing",
                problem::MAX_CONFIGS
            )));
        }
        Err(Stop::GaveUp { steps }) => {
            return Err(Failure::Failed(format!(
                "the search for a layout of {} among {} gave up after {steps} steps without finding one or proving there is none",
                problem::nodes(size as usize),
                nodes.len()
            )));
        }
    };
    let hosts = assign::build(&p, &found, &kept.prefer);
    let layout: Layout = p
        .nodes
        .iter()
        .zip(&hosts)
        .filter(|(_, units)| **units != 0)
        .map(|(node, &units)| {
            let services: Vec<&String> = bits(units).flat_map(|u| p.units[u].services.iter()).collect();
            (node.name.clone(), services.into_iter().cloned())
        })
        .collect();
    check_layout(template, size, nodes, &layout).map_err(|v| Failure::Failed(format!("internal error: the layout found breaks {v}")))?;
    Ok(layout)
}

/// Names the constraint of an infeasible problem: the first whose relaxation alone makes a
/// layout exist — an `apart` group, then the size (a larger cluster would do), then a
/// service's `min`, then its `max` — else the size.
fn diagnose(p: &Problem) -> Failure {
    let size = p.size;
    let feasible = |q: &Problem| {
        let none: Vec<Units> = vec![0; q.nodes.len()];
        Search::new(q, &none, Vec::new(), &[], DIAGNOSE_BUDGET).run().is_ok()
    };
    for (k, &(gi, group)) in p.apart.iter().enumerate() {
        let mut q = p.clone();
        let mut apart = p.apart.clone();
        apart.remove(k);
        q.set_apart(apart);
        if feasible(&q) {
            let names: Vec<String> = bits(group).map(|u| p.describe(u)).collect();
            return Failure::no_layout(
                format!("constraints.apart[{gi}]"),
                format!(
                    "no layout of {} keeps {} on separate nodes while meeting every other constraint",
                    nodes(size),
                    names.join(", ")
                ),
            );
        }
    }
    let usable = p.nodes.iter().filter(|n| n.eligible != 0).count();
    if let Some(larger) = (size + 1..=usable.min(size + p.units.len())).find(|&s| feasible(&p.with_size(s))) {
        return Failure::no_layout(
            "size",
            format!(
                "no layout of {} meets the services' needs, counts and apart groups together; they call for at least {}",
                nodes(size),
                nodes(larger)
            ),
        );
    }
    for (u, info) in p.units.iter().enumerate() {
        if info.min == 0 {
            continue;
        }
        let mut q = p.clone();
        q.units[u].min = 0;
        if feasible(&q) {
            return Failure::no_layout(
                format!("services.{}.count", info.min_service),
                format!(
                    "no layout of {} runs `{}` on at least {} while meeting every other constraint",
                    nodes(size),
                    info.min_service,
                    nodes(info.min)
                ),
            );
        }
    }
    for (u, info) in p.units.iter().enumerate() {
        if info.cap >= size {
            continue;
        }
        let mut q = p.clone();
        q.units[u].cap = size;
        if feasible(&q) {
            return Failure::no_layout(
                format!("services.{}.count", info.cap_service),
                format!(
                    "no layout of {} runs `{}` on at most {} while every node hosts a service and every other constraint is met",
                    nodes(size),
                    info.cap_service,
                    nodes(info.cap)
                ),
            );
        }
    }
    Failure::no_layout(
        "size",
        format!(
            "no layout of {} among the {} available meets every constraint",
            nodes(size),
            p.nodes.len()
        ),
    )
}

#[cfg(test)]
mod tests;
