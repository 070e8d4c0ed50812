//! The placement problem in the solver's own terms: services joined by `together` groups become
//! one *unit* (they share every node), `apart` groups become conflicts between units, and each
//! node gets the set of units whose needs it meets. Also the checks that name the culprit when a
//! request can plainly not be met, before any search.

use std::collections::BTreeMap;

use orc_cluster::{NodeInfo, Template};

use super::Failure;
use super::matching::Matching;

/// A set of units as a bit mask: bit `i` is unit `i`.
pub(crate) type Units = u64;

/// The most units (services after `together` groups are merged) a template may have.
pub(crate) const MAX_UNITS: usize = Units::BITS as usize;

/// The units of a mask, lowest first.
pub(crate) fn bits(mut set: Units) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if set == 0 {
            return None;
        }
        let i = set.trailing_zeros() as usize;
        set &= set - 1;
        Some(i)
    })
}

/// "1 node", "3 nodes".
pub(crate) fn nodes(n: usize) -> String {
    if n == 1 { "1 node".into() } else { format!("{n} nodes") }
}

/// The unit `i` alone.
pub(crate) fn unit(i: usize) -> Units {
    1 << i
}

/// Services that always share their nodes (one `together` component, or a lone service).
#[derive(Debug, Clone)]
pub(crate) struct Unit {
    /// Its services, by name.
    pub services: Vec<String>,
    /// On at least this many nodes (the largest `count.min` of its services).
    pub min: usize,
    /// On at most this many nodes (the smallest `count.max`, at most the cluster size).
    pub cap: usize,
    /// The smallest `count.max` of its services, if any sets one.
    pub max: Option<usize>,
    /// The service whose `count.min` sets `min`, for messages and constraint names.
    pub min_service: String,
    /// The service whose `count.max` sets `cap`.
    pub cap_service: String,
    /// A service of the unit whose needs no node meets, if any.
    pub unmet: Option<String>,
    /// The first `together` group that joins two of its services.
    pub together: Option<usize>,
}

/// Units no two of which may share a node.
#[derive(Debug, Clone)]
pub(crate) struct Clique {
    pub units: Units,
    /// The `apart` groups (positions in the template) inside it, in order: the first names it.
    pub groups: Vec<usize>,
}

/// At most this many configurations are considered per set of eligible units (15 disjoint
/// `apart` pairs make 2^15); past it the search is no longer complete, and says so.
pub(crate) const MAX_CONFIGS: usize = 4096;

/// At most this many cliques are used (each is only a bound; a template with more is odd).
const MAX_CLIQUES: usize = 256;

/// A node as the search sees it.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub name: String,
    /// The units whose needs (every service's) it meets.
    pub eligible: Units,
}

/// Everything the search needs, in indices and bit masks.
#[derive(Debug, Clone)]
pub(crate) struct Problem {
    pub size: usize,
    pub units: Vec<Unit>,
    /// Per unit, the units it must never share a node with.
    pub conflicts: Vec<Units>,
    /// The `apart` groups that join two or more units: (position in the template, units).
    pub apart: Vec<(usize, Units)>,
    /// The maximal sets of pairwise conflicting units: each needs its units' `min`s on distinct
    /// nodes. Every `apart` group is in one, and groups that conflict in a ring (a-b, b-c, c-a)
    /// make larger ones.
    pub cliques: Vec<Clique>,
    /// The nodes, ordered by name.
    pub nodes: Vec<Node>,
    /// Which unit each service belongs to.
    pub unit_of: BTreeMap<String, usize>,
}

impl Problem {
    /// Builds the problem from a validated template. Refuses (as invalid input) node names given
    /// twice and templates with more than [`MAX_UNITS`] units.
    pub fn new(template: &Template, size: u32, nodes: &[NodeInfo]) -> Result<Problem, Failure> {
        let size = size as usize;
        let names: Vec<&String> = template.services.keys().collect();
        let index: BTreeMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();

        // Union-find over services; a component is a unit.
        let mut parent: Vec<usize> = (0..names.len()).collect();
        fn root(parent: &mut [usize], mut i: usize) -> usize {
            while parent[i] != i {
                parent[i] = parent[parent[i]];
                i = parent[i];
            }
            i
        }
        for group in &template.constraints.together {
            let members: Vec<usize> = group.iter().filter_map(|s| index.get(s.as_str()).copied()).collect();
            for w in members.windows(2) {
                let (a, b) = (root(&mut parent, w[0]), root(&mut parent, w[1]));
                if a != b {
                    // The smaller index stays the root, so a unit is numbered by its first service.
                    let (lo, hi) = if a < b { (a, b) } else { (b, a) };
                    parent[hi] = lo;
                }
            }
        }
        let mut unit_by_root: BTreeMap<usize, usize> = BTreeMap::new();
        let mut units: Vec<Unit> = Vec::new();
        let mut unit_of = BTreeMap::new();
        for (i, name) in names.iter().enumerate() {
            let r = root(&mut parent, i);
            let u = *unit_by_root.entry(r).or_insert_with(|| {
                units.push(Unit {
                    services: Vec::new(),
                    min: 0,
                    cap: size,
                    max: None,
                    min_service: (*name).clone(),
                    cap_service: (*name).clone(),
                    unmet: None,
                    together: None,
                });
                units.len() - 1
            });
            let count = template.services[*name].count;
            let unit = &mut units[u];
            unit.services.push((*name).clone());
            let min = count.min() as usize;
            if min > unit.min {
                unit.min = min;
                unit.min_service = (*name).clone();
            }
            if let Some(max) = count.max.map(|m| m as usize)
                && unit.max.is_none_or(|m| max < m)
            {
                unit.max = Some(max);
                unit.cap = max.min(size);
                unit.cap_service = (*name).clone();
            }
            let service = &template.services[*name];
            if unit.unmet.is_none() && !nodes.iter().any(|n| service.needs.met_by(&n.labels, &n.facts)) {
                unit.unmet = Some((*name).clone());
            }
            unit_of.insert((*name).clone(), u);
        }
        for (gi, group) in template.constraints.together.iter().enumerate() {
            let mut members = group.iter().filter_map(|s| unit_of.get(s));
            if let (Some(&u), Some(_)) = (members.next(), members.next()) {
                units[u].together.get_or_insert(gi);
            }
        }
        if units.len() > MAX_UNITS {
            return Err(Failure::invalid(format!(
                "the template places {} independent services (after `together` groups are merged); this solver handles at most {MAX_UNITS}",
                units.len()
            )));
        }

        let apart: Vec<(usize, Units)> = template
            .constraints
            .apart
            .iter()
            .enumerate()
            .map(|(gi, group)| (gi, group.iter().filter_map(|s| unit_of.get(s)).fold(0, |acc, &u| acc | unit(u))))
            .filter(|(_, set)| set.count_ones() >= 2)
            .collect();

        let mut seen = BTreeMap::new();
        for n in nodes {
            if seen.insert(n.name.as_str(), ()).is_some() {
                return Err(Failure::invalid(format!("node `{}` is listed twice", n.name)));
            }
        }
        let mut nodes: Vec<Node> = nodes
            .iter()
            .map(|n| {
                let mut eligible: Units = 0;
                for (u, unit) in units.iter().enumerate() {
                    if unit.services.iter().all(|s| template.services[s].needs.met_by(&n.labels, &n.facts)) {
                        eligible |= self::unit(u);
                    }
                }
                Node {
                    name: n.name.clone(),
                    eligible,
                }
            })
            .collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let mut p = Problem {
            size,
            conflicts: vec![0; units.len()],
            units,
            apart: Vec::new(),
            cliques: Vec::new(),
            nodes,
            unit_of,
        };
        p.set_apart(apart);
        Ok(p)
    }

    /// Sets the `apart` groups, and with them the conflicts and cliques.
    pub fn set_apart(&mut self, apart: Vec<(usize, Units)>) {
        self.conflicts = vec![0; self.units.len()];
        for &(_, set) in &apart {
            for u in bits(set) {
                self.conflicts[u] |= set & !unit(u);
            }
        }
        let mut found = Vec::new();
        let involved = self
            .conflicts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c != 0)
            .fold(0, |acc, (u, _)| acc | unit(u));
        self.cliques_from(0, involved, 0, &mut found);
        let mut cliques: Vec<Clique> = found
            .into_iter()
            .map(|units| Clique {
                units,
                groups: apart.iter().filter(|(_, g)| g & !units == 0).map(|(gi, _)| *gi).collect(),
            })
            .collect();
        cliques.sort_by(|a, b| (a.groups.first(), a.units).cmp(&(b.groups.first(), b.units)));
        self.apart = apart;
        self.cliques = cliques;
    }

    /// Maximal cliques of the conflict graph (Bron–Kerbosch with pivoting), at most
    /// [`MAX_CLIQUES`].
    fn cliques_from(&self, r: Units, mut p: Units, mut x: Units, out: &mut Vec<Units>) {
        if out.len() >= MAX_CLIQUES {
            return;
        }
        if p == 0 {
            if x == 0 && r.count_ones() >= 2 {
                out.push(r);
            }
            return;
        }
        let pivot = bits(p | x).max_by_key(|&u| (self.conflicts[u] & p).count_ones()).unwrap_or(0);
        for v in bits(p & !self.conflicts[pivot]) {
            let nv = self.conflicts[v];
            self.cliques_from(r | unit(v), p & nv, x & nv, out);
            p &= !unit(v);
            x |= unit(v);
        }
    }

    /// The same problem for a cluster of `size` nodes.
    pub fn with_size(&self, size: usize) -> Problem {
        let mut q = self.clone();
        for u in &mut q.units {
            u.cap = u.max.map_or(size, |m| m.min(size));
        }
        q.size = size;
        q
    }

    /// The unit's services, for messages: `` `a` `` or `` `a`, `b` ``.
    pub fn describe(&self, u: usize) -> String {
        let names: Vec<String> = self.units[u].services.iter().map(|s| format!("`{s}`")).collect();
        names.join(" + ")
    }

    /// The largest sets of units a node with `eligible` may host together: every maximal set
    /// with no two units in one `apart` group (Bron–Kerbosch with pivoting, over the
    /// "compatible" relation), in increasing mask order, at most [`MAX_CONFIGS`] of them (a
    /// longer list is cut, and the caller told by its length). Never empty when `eligible` is
    /// not.
    pub fn maximal_configs(&self, eligible: Units) -> Vec<Units> {
        let mut out = Vec::new();
        if eligible != 0 {
            self.bron_kerbosch(0, eligible, 0, eligible, &mut out);
        }
        out.sort_unstable();
        out
    }

    fn compatible(&self, u: usize, within: Units) -> Units {
        within & !self.conflicts[u] & !unit(u)
    }

    fn bron_kerbosch(&self, r: Units, mut p: Units, mut x: Units, within: Units, out: &mut Vec<Units>) {
        if out.len() >= MAX_CONFIGS {
            return;
        }
        if p == 0 {
            if x == 0 {
                out.push(r);
            }
            return;
        }
        // Branch only on the pivot and the candidates it conflicts with: every maximal set holds
        // one of them (Tomita's pivoting).
        let pivot = bits(p | x)
            .max_by_key(|&u| (self.compatible(u, within) & p).count_ones())
            .unwrap_or(0);
        for v in bits(p & !self.compatible(pivot, within)) {
            let nv = self.compatible(v, within);
            self.bron_kerbosch(r | unit(v), p & nv, x & nv, within, out);
            p &= !unit(v);
            x |= unit(v);
        }
    }

    /// Requests that can plainly not be met, named by the constraint at fault: the size, a
    /// service nobody can host or that needs more nodes than there are, an `apart` group that
    /// needs more distinct nodes than the cluster has, counts too small to occupy every node.
    pub fn precheck(&self) -> Result<(), Failure> {
        let size = self.size;
        if size == 0 {
            return Err(Failure::no_layout("size", "a cluster has at least one node"));
        }
        if self.nodes.len() < size {
            return Err(Failure::no_layout(
                "size",
                format!(
                    "the cluster asks for {}, {} {} available",
                    nodes(size),
                    self.nodes.len(),
                    if self.nodes.len() == 1 { "is" } else { "are" }
                ),
            ));
        }
        for (u, unit) in self.units.iter().enumerate() {
            if unit.min == 0 {
                continue;
            }
            let eligible = self.nodes.iter().filter(|n| n.eligible & self::unit(u) != 0).count();
            if eligible == 0 {
                return Err(self.nobody_hosts(u));
            }
            if unit.min > size {
                return Err(Failure::no_layout(
                    format!("services.{}.count", unit.min_service),
                    format!(
                        "`{}` must run on at least {} nodes, the cluster has {size}",
                        unit.min_service, unit.min
                    ),
                ));
            }
            if eligible < unit.min {
                return Err(Failure::no_layout(
                    format!("services.{}.count", unit.min_service),
                    format!(
                        "`{}` must run on at least {} nodes, only {eligible} of the {} nodes meet {}'s needs",
                        unit.min_service,
                        unit.min,
                        self.nodes.len(),
                        self.describe(u)
                    ),
                ));
            }
        }
        let usable = self.nodes.iter().filter(|n| n.eligible != 0).count();
        if usable < size {
            return Err(Failure::no_layout(
                "size",
                format!(
                    "the cluster asks for {}, only {usable} of the {} nodes meet the needs of any of its services",
                    nodes(size),
                    self.nodes.len()
                ),
            ));
        }
        for clique in &self.cliques {
            let group = clique.units;
            let gi = clique.groups.first().copied().unwrap_or(0);
            let demand: usize = bits(group).map(|u| self.units[u].min).sum();
            let its = if clique.groups.len() > 1 {
                let others: Vec<String> = clique.groups[1..].iter().map(|g| format!("constraints.apart[{g}]")).collect();
                format!("its services and those of {}", others.join(" and "))
            } else {
                "its services".to_string()
            };
            let described = || {
                bits(group)
                    .filter(|&u| self.units[u].min > 0)
                    .map(|u| format!("{} on at least {}", self.describe(u), self.units[u].min))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            if demand > size {
                return Err(Failure::no_layout(
                    format!("constraints.apart[{gi}]"),
                    format!(
                        "{its} pairwise never share a node and need {demand} nodes ({}), the cluster has {size}",
                        described()
                    ),
                ));
            }
            let caps: Vec<usize> = self.units.iter().map(|u| u.min).collect();
            let mut m = Matching::new(caps, self.nodes.len());
            let placed = m.fill(self.nodes.iter().enumerate().map(|(i, n)| (i, n.eligible & group)), demand);
            if placed < demand {
                return Err(Failure::no_layout(
                    format!("constraints.apart[{gi}]"),
                    format!(
                        "{its} pairwise never share a node and need {demand} distinct nodes ({}), but only {placed} of the nodes can host them that way",
                        described()
                    ),
                ));
            }
        }
        // Every node hosts a service: can `size` nodes be occupied within the counts' maxima?
        let caps: Vec<usize> = self.units.iter().map(|u| u.cap).collect();
        let mut m = Matching::new(caps, self.nodes.len());
        let occupied = m.fill(self.nodes.iter().enumerate().map(|(i, n)| (i, n.eligible)), size);
        if occupied < size {
            let witness = m.last_failure();
            let confined = self.nodes.iter().filter(|n| n.eligible != 0 && n.eligible & !witness == 0).count();
            let caps: Vec<String> = bits(witness)
                .map(|u| format!("{} on at most {}", self.describe(u), self.units[u].cap))
                .collect();
            let (constraint, culprit) = if witness.count_ones() == 1 {
                let u = witness.trailing_zeros() as usize;
                (format!("services.{}.count", self.units[u].cap_service), caps.join(""))
            } else {
                ("size".to_string(), caps.join(", "))
            };
            return Err(Failure::no_layout(
                constraint,
                format!(
                    "every node of the cluster hosts a service, but at most {occupied} of the {size} nodes asked for can: {confined} of the nodes can host only {culprit}"
                ),
            ));
        }
        Ok(())
    }

    /// A unit that must be placed but whose needs no node meets: the service at fault, or the
    /// `together` group whose services' needs no single node meets.
    fn nobody_hosts(&self, u: usize) -> Failure {
        let unit = &self.units[u];
        if let Some(s) = &unit.unmet {
            return Failure::no_layout(
                format!("services.{s}.needs"),
                format!("none of the {} nodes meets what `{s}` needs", self.nodes.len()),
            );
        }
        Failure::no_layout(
            format!("constraints.together[{}]", unit.together.unwrap_or(0)),
            format!(
                "{} share every node, and none of the {} nodes meets the needs of all of them",
                self.describe(u),
                self.nodes.len()
            ),
        )
    }
}
