//! From the search's answer (chosen nodes, the units each may host) to the units each node
//! hosts:
//!
//! 1. the *ideal* placement: each node's existing units (while below their cap), then every
//!    unit on the first nodes by name that allow it, up to its cap — what fill would give if no
//!    node could end up empty;
//! 2. one unit per node from a matching that prefers the node's existing units, then its ideal
//!    ones (so no node is empty and no cap is exceeded, while departing from the ideal as
//!    little as it can);
//! 3. the existing placements each node may keep, while their unit is below its cap;
//! 4. units still short of their `min` go to the nodes that allow them, in name order;
//! 5. fill: every unit goes to the nodes that allow it, in name order, up to its cap;
//! 6. saturation: any unit a node meets the needs of, that conflicts with nothing it hosts and
//!    is below its cap is added too — so no (node, unit) pair can be added to the result, which
//!    is what makes solving again with the result as the existing layout return it unchanged.

use super::matching::Matching;
use super::problem::{Problem, Units, bits, unit};
use super::search::Found;

/// Per node, the units it hosts (0 for nodes outside the cluster).
pub(crate) fn build(p: &Problem, found: &Found, prefer: &[Units]) -> Vec<Units> {
    let config = &found.config;
    let chosen: Vec<usize> = (0..p.nodes.len()).filter(|&n| config[n] != 0).collect();

    let mut ideal: Vec<Units> = vec![0; p.nodes.len()];
    let mut count: Vec<usize> = vec![0; p.units.len()];
    for &n in &chosen {
        for u in bits(prefer[n] & config[n]) {
            if count[u] < p.units[u].cap {
                add(&mut ideal, &mut count, n, u);
            }
        }
    }
    for (u, info) in p.units.iter().enumerate() {
        for &n in &chosen {
            if count[u] >= info.cap {
                break;
            }
            if config[n] & !ideal[n] & unit(u) != 0 {
                add(&mut ideal, &mut count, n, u);
            }
        }
    }

    let mut matching = Matching::new(p.units.iter().map(|u| u.cap).collect(), p.nodes.len());
    let rematched = chosen.iter().all(|&n| matching.add(n, config[n], &[prefer[n], ideal[n]]));
    // The search's matching proves a full one exists, so this never falls back; if it did, the
    // search's own matching is just as valid.
    let matching = if rematched { &matching } else { &found.matching };

    let mut hosts: Vec<Units> = vec![0; p.nodes.len()];
    let mut count: Vec<usize> = (0..p.units.len()).map(|u| matching.load(u)).collect();
    for &n in &chosen {
        if let Some(u) = matching.primary(n) {
            hosts[n] = unit(u);
        }
    }
    for &n in &chosen {
        for u in bits(prefer[n] & config[n] & !hosts[n]) {
            if count[u] < p.units[u].cap {
                add(&mut hosts, &mut count, n, u);
            }
        }
    }
    for (u, info) in p.units.iter().enumerate() {
        for &n in &chosen {
            if count[u] >= info.min {
                break;
            }
            if config[n] & !hosts[n] & unit(u) != 0 {
                add(&mut hosts, &mut count, n, u);
            }
        }
    }
    for (u, info) in p.units.iter().enumerate() {
        for &n in &chosen {
            if count[u] >= info.cap {
                break;
            }
            if config[n] & !hosts[n] & unit(u) != 0 {
                add(&mut hosts, &mut count, n, u);
            }
        }
    }
    for &n in &chosen {
        for u in bits(p.nodes[n].eligible & !hosts[n]) {
            if count[u] < p.units[u].cap && p.conflicts[u] & hosts[n] == 0 {
                add(&mut hosts, &mut count, n, u);
            }
        }
    }
    hosts
}

fn add(hosts: &mut [Units], count: &mut [usize], n: usize, u: usize) {
    hosts[n] |= unit(u);
    count[u] += 1;
}
