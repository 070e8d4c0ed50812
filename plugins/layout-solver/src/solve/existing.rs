//! What of the existing layout the solver tries to keep.
//!
//! The existing layout may predate a change of template, of the cluster's services, of the
//! nodes or of the size, so it is cleaned first: nodes no longer offered and services no longer
//! in the cluster are forgotten; on each node a unit is kept when any of its services is there
//! and the node meets the unit's needs (a service newly joined to a `together` group is added
//! beside its partners); units in one `apart` group are reduced to the first; when the cluster
//! shrinks, the most important nodes are kept — those hosting a unit that would otherwise fall
//! below its `min`, then those hosting the most services, then by name — and a unit on more
//! kept nodes than its cap stays on the nodes where it is alone (so they keep a service), then
//! by name.

use orc_cluster::Layout;

use super::problem::{Problem, Units, bits, unit};

/// The existing layout as the search should try to keep it.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    /// Per node, the units it hosts in the cleaned existing layout (0 for other nodes).
    pub prefer: Vec<Units>,
    /// The existing nodes the cluster keeps, most important first.
    pub kept: Vec<usize>,
    /// Per node, whether it is in the existing layout but not kept (the cluster shrinks).
    pub dropped: Vec<bool>,
}

/// Cleans `existing` for problem `p`. See the module documentation.
pub(crate) fn keep(p: &Problem, existing: &Layout) -> Kept {
    let n = p.nodes.len();
    let mut prefer: Vec<Units> = vec![0; n];
    let mut services_here: Vec<usize> = vec![0; n];
    let mut present = vec![false; n];
    for (name, services) in &existing.0 {
        let Ok(i) = p.nodes.binary_search_by(|node| node.name.as_str().cmp(name)) else {
            continue;
        };
        if p.nodes[i].eligible == 0 {
            continue;
        }
        present[i] = true;
        let mut units: Units = 0;
        for s in services {
            if let Some(&u) = p.unit_of.get(s) {
                units |= unit(u);
                services_here[i] += 1;
            }
        }
        let mut clean: Units = 0;
        for u in bits(units & p.nodes[i].eligible) {
            if p.conflicts[u] & clean == 0 {
                clean |= unit(u);
            }
        }
        prefer[i] = clean;
    }

    let mut order: Vec<usize> = (0..n).filter(|&i| present[i]).collect();
    let holders: Vec<usize> = (0..p.units.len())
        .map(|u| order.iter().filter(|&&i| prefer[i] & unit(u) != 0).count())
        .collect();
    let critical = |i: usize| bits(prefer[i]).any(|u| p.units[u].min > 0 && holders[u] <= p.units[u].min);
    order.sort_by_key(|&i| (std::cmp::Reverse((critical(i), services_here[i])), i));
    let mut dropped = vec![false; n];
    if order.len() > p.size {
        for &i in &order[p.size..] {
            dropped[i] = true;
        }
        order.truncate(p.size);
    }

    // A unit over its cap stays where it is alone, then on the first nodes by name.
    for (u, info) in p.units.iter().enumerate() {
        let mut holding: Vec<usize> = order.iter().copied().filter(|&i| prefer[i] & unit(u) != 0).collect();
        if holding.len() <= info.cap {
            continue;
        }
        holding.sort_by_key(|&i| (prefer[i] != unit(u), i));
        for &i in &holding[info.cap..] {
            prefer[i] &= !unit(u);
        }
    }
    Kept {
        prefer,
        kept: order,
        dropped,
    }
}
