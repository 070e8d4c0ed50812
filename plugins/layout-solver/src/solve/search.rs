//! The search: which nodes the cluster uses and, on each, which units it *may* host (a maximal
//! set of its eligible units with no two in one `apart` group — its "configuration").
//!
//! Configurations only ever grow the options (a subset of one is just as valid), so the search
//! never considers smaller ones. Given a configuration per chosen node, a layout exists exactly
//! when every unit is allowed on at least `min` chosen nodes and the chosen nodes can each be
//! matched to one allowed unit without any unit exceeding its cap ([`Matching`]); the layout
//! itself is then built by [`super::assign`].
//!
//! It is a depth-first search with one decision per step — take the most promising undecided
//! node with one of its configurations, or leave it out — and three pruning rules checked after
//! every decision:
//! - enough undecided nodes remain to reach the size;
//! - each unit can still reach its `min` with the nodes left (at most the free slots);
//! - the units of each clique of `apart` conflicts still short of their `min` fit, one per
//!   node, on the free slots and on the undecided nodes that can host them.
//!
//! The matching is kept up to date as nodes are taken (an augmenting path per node), so a node
//! that would leave some chosen node without a unit is refused at once.
//!
//! Existing nodes (kept by [`super::existing`]) are decided first, each trying the
//! configurations that contain its current units first, so an existing layout that is still
//! valid is found on the first path, and otherwise the search gives up existing placements
//! from the least important node back. Other nodes are grouped by their eligible units: nodes of
//! a group are interchangeable, so when one of them cannot be part of any layout with the
//! decisions so far, none of them can, and the whole group is left out at once — this is what
//! keeps a search over 1,000 nodes short even when it must backtrack.
//!
//! The next node is the one whose best configuration scores highest: first the number of units
//! still short of their `min` it would host, then whether it was in the existing layout, then
//! the number of units still below their cap, then the configuration's size; ties go to the
//! node first in name order, then to the lower configuration mask.

use std::collections::BTreeMap;

use super::matching::Matching;
use super::problem::{MAX_CONFIGS, Problem, Units, bits, unit};

/// Why the search found no layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Every possibility was tried: no layout exists.
    Exhausted,
    /// The step budget ran out first.
    GaveUp { steps: u64 },
    /// Every possibility considered was tried, but some nodes had more configurations than
    /// [`MAX_CONFIGS`] and not all were considered.
    Incomplete,
}

/// The nodes chosen, each with its configuration, and the matching that proves every one can
/// host a unit.
#[derive(Debug)]
pub(crate) struct Found {
    /// Per node, its configuration (0 when not chosen).
    pub config: Vec<Units>,
    pub matching: Matching,
}

/// Interchangeable undecided nodes: same eligible units, same standing.
#[derive(Debug)]
struct Group {
    eligible: Units,
    /// In the existing layout but not kept (a shrink): preferred over fresh nodes.
    existing: bool,
    /// Its nodes in name order; `head` is the first undecided.
    nodes: Vec<usize>,
    head: usize,
}

#[derive(Debug, Clone, Copy)]
enum Source {
    Kept,
    Group(usize),
}

#[derive(Debug)]
struct Frame {
    node: usize,
    source: Source,
    configs: Vec<Units>,
    next: usize,
    /// A configuration is applied (the node is chosen).
    applied: bool,
    /// The node was left out; for a group, the group's head before the rest was left out too.
    excluded: Option<usize>,
}

/// The search state. See the module documentation.
pub(crate) struct Search<'a> {
    p: &'a Problem,
    /// Per node, the units it hosts in the (cleaned) existing layout.
    prefer: &'a [Units],
    /// Kept existing nodes, most important first; `kept_next` is the first undecided.
    kept: Vec<usize>,
    kept_next: usize,
    groups: Vec<Group>,
    configs: BTreeMap<Units, Vec<Units>>,
    config: Vec<Units>,
    matching: Matching,
    /// Per unit, on how many chosen nodes it is allowed.
    allowed: Vec<usize>,
    /// Per unit, how many undecided nodes are eligible for it.
    avail: Vec<usize>,
    avail_total: usize,
    budget: u64,
    /// Some configurations were left out: an exhausted search then proves nothing.
    inconclusive: bool,
}

impl<'a> Search<'a> {
    /// A search over `p`'s nodes: `kept` (decided first, in this order), then the others, with
    /// `existing` marking the nodes of the existing layout that were not kept.
    pub fn new(p: &'a Problem, prefer: &'a [Units], kept: Vec<usize>, existing: &[bool], budget: u64) -> Search<'a> {
        let mut avail = vec![0; p.units.len()];
        let mut avail_total = 0;
        let mut is_kept = vec![false; p.nodes.len()];
        for &n in &kept {
            is_kept[n] = true;
        }
        let mut by_key: BTreeMap<(bool, Units), usize> = BTreeMap::new();
        let mut groups: Vec<Group> = Vec::new();
        for (n, node) in p.nodes.iter().enumerate() {
            if node.eligible == 0 {
                continue;
            }
            avail_total += 1;
            for u in bits(node.eligible) {
                avail[u] += 1;
            }
            if is_kept[n] {
                continue;
            }
            let key = (existing.get(n).copied().unwrap_or(false), node.eligible);
            let g = *by_key.entry(key).or_insert_with(|| {
                groups.push(Group {
                    eligible: node.eligible,
                    existing: key.0,
                    nodes: Vec::new(),
                    head: 0,
                });
                groups.len() - 1
            });
            groups[g].nodes.push(n);
        }
        let kept: Vec<usize> = kept.into_iter().filter(|&n| p.nodes[n].eligible != 0).collect();
        let mut configs = BTreeMap::new();
        for eligible in kept.iter().map(|&n| p.nodes[n].eligible).chain(groups.iter().map(|g| g.eligible)) {
            configs.entry(eligible).or_insert_with(|| p.maximal_configs(eligible));
        }
        // Configurations left out make a failed search inconclusive.
        let inconclusive = configs.values().any(|c| c.len() >= MAX_CONFIGS);
        Search {
            p,
            prefer,
            kept,
            kept_next: 0,
            groups,
            configs,
            config: vec![0; p.nodes.len()],
            matching: Matching::new(p.units.iter().map(|u| u.cap).collect(), p.nodes.len()),
            allowed: vec![0; p.units.len()],
            avail,
            avail_total,
            budget,
            inconclusive,
        }
    }

    /// Runs the search to the first layout.
    pub fn run(mut self) -> Result<Found, Stop> {
        let mut stack: Vec<Frame> = Vec::new();
        let mut steps: u64 = 0;
        let mut descend = true;
        loop {
            if descend && self.feasible() {
                if self.matching.members().len() == self.p.size {
                    return Ok(Found {
                        config: self.config,
                        matching: self.matching,
                    });
                }
                if let Some(frame) = self.select() {
                    stack.push(frame);
                }
            }
            // Advance the top frame: next configuration, else leave the node out, else pop.
            steps += 1;
            if steps > self.budget {
                return Err(Stop::GaveUp { steps: self.budget });
            }
            let Some(top) = stack.last_mut() else {
                return Err(if self.inconclusive { Stop::Incomplete } else { Stop::Exhausted });
            };
            if top.applied {
                top.applied = false;
                unapply(&mut self.matching, &mut self.config, &mut self.allowed, top.node);
            }
            descend = false;
            if top.excluded.is_none() {
                while top.next < top.configs.len() {
                    let c = top.configs[top.next];
                    top.next += 1;
                    if self.matching.add(top.node, c, &[self.prefer[top.node]]) {
                        self.config[top.node] = c;
                        for u in bits(c) {
                            self.allowed[u] += 1;
                        }
                        top.applied = true;
                        descend = true;
                        break;
                    }
                }
                if descend {
                    continue;
                }
                // Leave it out; for a group, leave out its other undecided nodes too.
                top.excluded = Some(match top.source {
                    Source::Kept => 0,
                    Source::Group(g) => {
                        let group = &mut self.groups[g];
                        let head = group.head;
                        let rest = group.nodes.len() - head;
                        group.head = group.nodes.len();
                        for u in bits(group.eligible) {
                            self.avail[u] -= rest;
                        }
                        self.avail_total -= rest;
                        head
                    }
                });
                descend = true;
                continue;
            }
            // Every option of this node is spent: undo taking it and backtrack.
            let frame = stack.pop().expect("the top frame exists");
            let eligible = self.p.nodes[frame.node].eligible;
            match frame.source {
                Source::Kept => self.kept_next -= 1,
                Source::Group(g) => {
                    let group = &mut self.groups[g];
                    let head = frame.excluded.unwrap_or(group.head);
                    let rest = group.nodes.len() - head;
                    group.head = head - 1;
                    for u in bits(group.eligible) {
                        self.avail[u] += rest;
                    }
                    self.avail_total += rest;
                }
            }
            for u in bits(eligible) {
                self.avail[u] += 1;
            }
            self.avail_total += 1;
        }
    }

    /// The pruning rules of the module documentation.
    fn feasible(&self) -> bool {
        let slots = self.p.size - self.matching.members().len();
        if self.avail_total < slots {
            return false;
        }
        for (u, unit) in self.p.units.iter().enumerate() {
            if self.allowed[u] + self.avail[u].min(slots) < unit.min {
                return false;
            }
        }
        for clique in &self.p.cliques {
            let short: usize = bits(clique.units)
                .map(|u| self.p.units[u].min.saturating_sub(self.allowed[u]))
                .sum();
            if short > slots || (short > 0 && short > self.undecided_for(clique.units)) {
                return false;
            }
        }
        true
    }

    /// How many undecided nodes are eligible for any of `units`.
    fn undecided_for(&self, units: Units) -> usize {
        let kept = self.kept[self.kept_next..]
            .iter()
            .filter(|&&n| self.p.nodes[n].eligible & units != 0)
            .count();
        let grouped: usize = self
            .groups
            .iter()
            .filter(|g| g.eligible & units != 0)
            .map(|g| g.nodes.len() - g.head)
            .sum();
        kept + grouped
    }

    /// Units still short of their `min`, and units still below their cap.
    fn wants(&self) -> (Units, Units) {
        let mut short = 0;
        let mut room = 0;
        for (u, info) in self.p.units.iter().enumerate() {
            if self.allowed[u] < info.min {
                short |= unit(u);
            }
            if self.allowed[u] < info.cap {
                room |= unit(u);
            }
        }
        (short, room)
    }

    /// The configurations of nodes with `eligible` (computed up front for every node).
    fn configs_of(&self, eligible: Units) -> &[Units] {
        self.configs.get(&eligible).map(Vec::as_slice).unwrap_or_default()
    }

    /// Takes the next node to decide and orders its configurations, best first.
    fn select(&mut self) -> Option<Frame> {
        let (short, room) = self.wants();
        let score = |c: Units, existing: bool| ((c & short).count_ones(), existing, (c & room).count_ones(), c.count_ones());
        if self.kept_next < self.kept.len() {
            let n = self.kept[self.kept_next];
            self.kept_next += 1;
            let prefer = self.prefer[n];
            let mut configs = self.configs_of(self.p.nodes[n].eligible).to_vec();
            // Configurations keeping all its current units first, then most of them.
            configs.sort_by_key(|&c| {
                let (a, b, d, e) = score(c, true);
                std::cmp::Reverse(((c & prefer) == prefer, (c & prefer).count_ones(), a, b, d, e, std::cmp::Reverse(c)))
            });
            self.take(n);
            return Some(Frame {
                node: n,
                source: Source::Kept,
                configs,
                next: 0,
                applied: false,
                excluded: None,
            });
        }
        let mut best: Option<(usize, (u32, bool, u32, u32))> = None;
        for g in 0..self.groups.len() {
            let group = &self.groups[g];
            if group.head >= group.nodes.len() {
                continue;
            }
            let (eligible, existing, node) = (group.eligible, group.existing, group.nodes[group.head]);
            let top = self
                .configs_of(eligible)
                .iter()
                .map(|&c| score(c, existing))
                .max()
                .unwrap_or_default();
            let better = match best {
                None => true,
                Some((bg, bs)) => top > bs || (top == bs && node < self.groups[bg].nodes[self.groups[bg].head]),
            };
            if better {
                best = Some((g, top));
            }
        }
        let (g, _) = best?;
        let group = &mut self.groups[g];
        let (n, existing) = (group.nodes[group.head], group.existing);
        group.head += 1;
        let mut configs = self.configs_of(self.p.nodes[n].eligible).to_vec();
        configs.sort_by_key(|&c| std::cmp::Reverse((score(c, existing), std::cmp::Reverse(c))));
        self.take(n);
        Some(Frame {
            node: n,
            source: Source::Group(g),
            configs,
            next: 0,
            applied: false,
            excluded: None,
        })
    }

    /// Node `n` is no longer undecided.
    fn take(&mut self, n: usize) {
        for u in bits(self.p.nodes[n].eligible) {
            self.avail[u] -= 1;
        }
        self.avail_total -= 1;
    }
}

fn unapply(matching: &mut Matching, config: &mut [Units], allowed: &mut [usize], node: usize) {
    matching.remove_last();
    for u in bits(config[node]) {
        allowed[u] -= 1;
    }
    config[node] = 0;
}
