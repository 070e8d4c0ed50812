//! Which unit each chosen node hosts *first*: a bipartite b-matching of nodes to units, a unit
//! taking at most its capacity of nodes. Every node of a layout hosts at least one unit while no
//! unit exceeds its `count.max` exactly when such a matching covers every chosen node, so the
//! search keeps one up to date, node by node, with augmenting paths.

use super::problem::{Units, bits, unit};

/// No unit.
const NONE: u8 = u8::MAX;

/// A matching of nodes to units under per-unit capacities.
#[derive(Debug, Clone)]
pub(crate) struct Matching {
    cap: Vec<usize>,
    load: Vec<usize>,
    /// Per node, its unit (`NONE` when unmatched).
    primary: Vec<u8>,
    /// Per node, the units it may take.
    allowed: Vec<Units>,
    /// Matched nodes, in the order they were added.
    members: Vec<usize>,
    /// The units reachable from the last node that could not be matched: all full, and a Hall
    /// witness of why.
    failure: Units,
}

impl Matching {
    pub fn new(cap: Vec<usize>, nodes: usize) -> Matching {
        Matching {
            load: vec![0; cap.len()],
            cap,
            primary: vec![NONE; nodes],
            allowed: vec![0; nodes],
            members: Vec::new(),
            failure: 0,
        }
    }

    /// The matched nodes, in the order they were added.
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// The unit node `n` is matched to.
    pub fn primary(&self, n: usize) -> Option<usize> {
        let p = self.primary[n];
        (p != NONE).then_some(p as usize)
    }

    /// How many nodes unit `u` is matched to.
    pub fn load(&self, u: usize) -> usize {
        self.load[u]
    }

    /// The units reachable from the last node that could not be matched (a Hall witness).
    pub fn last_failure(&self) -> Units {
        self.failure
    }

    /// Matches node `x` to one of `allowed`, moving earlier nodes to other units of theirs if
    /// need be. Prefers a free unit of `prefer[0]`, then of `prefer[1]`, …, then the free unit
    /// with the most room. Returns false (and changes nothing) when no augmenting path exists.
    pub fn add(&mut self, x: usize, allowed: Units, prefer: &[Units]) -> bool {
        let free: Units = bits(allowed)
            .filter(|&u| self.load[u] < self.cap[u])
            .fold(0, |acc, u| acc | unit(u));
        if free != 0 {
            let pick = prefer.iter().map(|&p| free & p).find(|&p| p != 0).unwrap_or(free);
            let u = bits(pick)
                .max_by_key(|&u| (self.cap[u] - self.load[u], std::cmp::Reverse(u)))
                .unwrap_or(0);
            self.assign(x, allowed, u);
            return true;
        }
        // Breadth-first over units: (unit, the node that would move onto it, parent entry).
        let mut visited = allowed;
        let mut queue: Vec<(usize, usize, usize)> = bits(allowed).map(|u| (u, x, usize::MAX)).collect();
        let mut i = 0;
        while i < queue.len() {
            let (u, _, _) = queue[i];
            for k in 0..self.members.len() {
                let y = self.members[k];
                if self.primary[y] as usize != u {
                    continue;
                }
                for w in bits(self.allowed[y] & !visited) {
                    visited |= unit(w);
                    queue.push((w, y, i));
                    if self.load[w] < self.cap[w] {
                        // Shift every node along the path one unit over.
                        self.load[w] += 1;
                        let mut j = queue.len() - 1;
                        loop {
                            let (to, node, parent) = queue[j];
                            self.primary[node] = to as u8;
                            if parent == usize::MAX {
                                break;
                            }
                            j = parent;
                        }
                        self.allowed[x] = allowed;
                        self.members.push(x);
                        return true;
                    }
                }
            }
            i += 1;
        }
        self.failure = visited;
        false
    }

    fn assign(&mut self, x: usize, allowed: Units, u: usize) {
        self.load[u] += 1;
        self.primary[x] = u as u8;
        self.allowed[x] = allowed;
        self.members.push(x);
    }

    /// Unmatches the node added last.
    pub fn remove_last(&mut self) {
        if let Some(x) = self.members.pop() {
            if let Some(u) = self.primary(x) {
                self.load[u] -= 1;
            }
            self.primary[x] = NONE;
            self.allowed[x] = 0;
        }
    }

    /// Matches nodes from `candidates` (node, allowed units) until `want` are matched; returns
    /// how many are. A node that cannot be matched never can be later (no augmenting path now
    /// means none after further augmentations), nor can another with the same units, so those
    /// are skipped.
    pub fn fill(&mut self, candidates: impl Iterator<Item = (usize, Units)>, want: usize) -> usize {
        let mut failed: Vec<Units> = Vec::new();
        for (n, allowed) in candidates {
            if self.members.len() >= want {
                break;
            }
            if allowed == 0 || failed.contains(&allowed) {
                continue;
            }
            if !self.add(n, allowed, &[]) {
                failed.push(allowed);
            }
        }
        self.members.len()
    }
}
