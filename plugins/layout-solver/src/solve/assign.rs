//! From the search's answer (chosen nodes, the units each may host, one unit each from the
//! matching) to the units each node hosts:
//!
//! 1. each node hosts its matched unit (so no node is empty and no cap is exceeded);
//! 2. the existing placements it may keep, while their unit is below its cap;
//! 3. units still short of their `min` go to the nodes that allow them, in name order;
//! 4. fill: every unit goes to the nodes that allow it, in name order, up to its cap;
//! 5. saturation: any unit a node meets the needs of, that conflicts with nothing it hosts and
//!    is below its cap is added too — so no (node, unit) pair can be added to the result, which
//!    is what makes solving again with the result as the existing layout return it unchanged.

use super::problem::{Problem, Units, bits, unit};
use super::search::Found;

/// Per node, the units it hosts (0 for nodes outside the cluster).
pub(crate) fn build(p: &Problem, found: &Found, prefer: &[Units]) -> Vec<Units> {
    let chosen: Vec<usize> = (0..p.nodes.len()).filter(|&n| found.config[n] != 0).collect();
    let mut hosts: Vec<Units> = vec![0; p.nodes.len()];
    let mut count: Vec<usize> = (0..p.units.len()).map(|u| found.matching.load(u)).collect();
    for &n in &chosen {
        if let Some(u) = found.matching.primary(n) {
            hosts[n] = unit(u);
        }
    }
    for &n in &chosen {
        for u in bits(prefer[n] & found.config[n] & !hosts[n]) {
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
            if found.config[n] & !hosts[n] & unit(u) != 0 {
                add(&mut hosts, &mut count, n, u);
            }
        }
    }
    for (u, info) in p.units.iter().enumerate() {
        for &n in &chosen {
            if count[u] >= info.cap {
                break;
            }
            if found.config[n] & !hosts[n] & unit(u) != 0 {
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
