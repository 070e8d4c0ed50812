//! Properties over random templates and nodes: every layout is valid, solving again from it
//! returns it unchanged, and on tiny instances "no valid layout" is confirmed by brute force (the
//! solver is complete there).

use std::cell::Cell;
use std::collections::BTreeSet;

use orc_cluster::{Layout, NodeInfo, Template, check_layout};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Map, json};

use super::{Answer, Solver, node};

/// One random service: (min, max, needs).
type ServiceSpec = (Option<u32>, Option<u32>, u8);
/// One random node: (ssd, zone b, cpus, aarch64).
type NodeSpec = (bool, bool, u32, bool);

#[derive(Debug, Clone)]
struct Spec {
    services: Vec<ServiceSpec>,
    together: Vec<Vec<usize>>,
    apart: Vec<Vec<usize>>,
    nodes: Vec<NodeSpec>,
    /// A fraction of the node count, in percent.
    size: u32,
}

fn spec(services: std::ops::RangeInclusive<usize>, nodes: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Spec> {
    let service = (
        prop::option::of(0u32..3),
        prop::option::of(1u32..4),
        0u8..8, // 0-2: no needs; 3: ssd; 4: zone a; 5: cpus >= 2; 6: aarch64; 7: cpus in 1..=2
    );
    (
        prop::collection::vec(service, services),
        prop::collection::vec((any::<bool>(), any::<bool>(), 0u32..4, any::<bool>()), nodes),
    )
        .prop_flat_map(|(services, nodes)| {
            let n = services.len();
            let group = prop::collection::vec(0..n, 2..=3);
            (
                Just(services),
                prop::collection::vec(group.clone(), 0..=2),
                prop::collection::vec(group, 0..=2),
                Just(nodes),
                1u32..=100,
            )
        })
        .prop_map(|(services, together, apart, nodes, size)| Spec {
            services,
            together,
            apart,
            nodes,
            size,
        })
}

impl Spec {
    fn name(i: usize) -> String {
        format!("s{i}")
    }

    fn groups(groups: &[Vec<usize>]) -> Vec<Vec<String>> {
        groups
            .iter()
            .map(|g| {
                let unique: BTreeSet<usize> = g.iter().copied().collect();
                unique.into_iter().map(Self::name).collect()
            })
            .collect()
    }

    /// The template, with constraints dropped until it validates (random groups often
    /// contradict each other or the counts).
    fn template(&self) -> Template {
        let mut services = Map::new();
        for (i, &(min, max, needs)) in self.services.iter().enumerate() {
            let (min, max) = match (min, max) {
                (Some(a), Some(b)) if a > b => (Some(b), Some(b)),
                other => other,
            };
            let mut count = Map::new();
            if let Some(m) = min {
                count.insert("min".into(), json!(m));
            }
            if let Some(m) = max {
                count.insert("max".into(), json!(m));
            }
            let needs = match needs {
                3 => json!({"labels": {"disk": "ssd"}}),
                4 => json!({"labels": {"zone": "a"}}),
                5 => json!({"facts": {"cpus": {"min": 2}}}),
                6 => json!({"facts": {"architecture": "aarch64"}}),
                7 => json!({"facts": {"cpus": {"min": 1, "max": 2}}}),
                _ => json!({}),
            };
            services.insert(Self::name(i), json!({"automator": "x", "count": count, "needs": needs}));
        }
        let attempts = [
            (Self::groups(&self.together), Self::groups(&self.apart)),
            (Vec::new(), Self::groups(&self.apart)),
            (Self::groups(&self.together), Vec::new()),
            (Vec::new(), Vec::new()),
        ];
        for (together, apart) in attempts {
            let t = json!({"services": services, "constraints": {"together": together, "apart": apart}});
            if let Ok(t) = Template::from_json(t) {
                return t;
            }
        }
        panic!("a template without groups is always valid: {services:?}")
    }

    fn nodes(&self) -> Vec<NodeInfo> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, &(ssd, zone_b, cpus, arm))| {
                let mut labels = vec![("zone", if zone_b { "b" } else { "a" })];
                if ssd {
                    labels.push(("disk", "ssd"));
                }
                let arch = if arm { "aarch64" } else { "x86_64" };
                node(&format!("n{i}"), &labels, json!({"cpus": cpus, "architecture": arch}))
            })
            .collect()
    }

    fn size(&self) -> u32 {
        (self.nodes.len() as u32 * self.size).div_ceil(100).max(1)
    }
}

/// Whether any valid layout exists, trying every one: the (node, services) choices each node
/// allows on its own (needs, together, apart), combined, then checked in full.
fn exists(t: &Template, size: u32, nodes: &[NodeInfo]) -> Option<Layout> {
    let services: Vec<&String> = t.services.keys().collect();
    let local: Vec<Vec<Vec<String>>> = nodes
        .iter()
        .map(|n| {
            (1u32..1 << services.len())
                .map(|set| {
                    (0..services.len())
                        .filter(|b| set & (1 << b) != 0)
                        .map(|b| services[b].clone())
                        .collect::<Vec<String>>()
                })
                .filter(|s| {
                    let here = |g: &Vec<String>| g.iter().filter(|x| s.contains(x)).count();
                    s.iter().all(|x| t.services[x].needs.met_by(&n.labels, &n.facts))
                        && t.constraints.together.iter().all(|g| here(g) == 0 || here(g) == g.len())
                        && t.constraints.apart.iter().all(|g| here(g) <= 1)
                })
                .collect()
        })
        .collect();
    let n = nodes.len();
    for chosen in 0u32..1 << n {
        if chosen.count_ones() != size {
            continue;
        }
        let idx: Vec<usize> = (0..n).filter(|i| chosen & (1 << i) != 0).collect();
        if idx.iter().any(|&i| local[i].is_empty()) {
            continue;
        }
        let mut pick = vec![0usize; idx.len()];
        loop {
            let layout: Layout = idx
                .iter()
                .zip(&pick)
                .map(|(&i, &k)| (nodes[i].name.clone(), local[i][k].clone()))
                .collect();
            if check_layout(t, size, nodes, &layout).is_ok() {
                return Some(layout);
            }
            // Next combination, odometer style.
            let mut d = 0;
            loop {
                if d == idx.len() {
                    break;
                }
                pick[d] += 1;
                if pick[d] < local[idx[d]].len() {
                    break;
                }
                pick[d] = 0;
                d += 1;
            }
            if d == idx.len() {
                break;
            }
        }
    }
    None
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

/// Solves `spec`; on a layout, checks that solving again from it returns it unchanged.
fn check(rt: &tokio::runtime::Runtime, solver: &Solver, spec: &Spec) -> Result<(Template, u32, Vec<NodeInfo>, Answer), TestCaseError> {
    let (t, size, nodes) = (spec.template(), spec.size(), spec.nodes());
    let answer = rt.block_on(solver.solve(&t, size, &nodes, &Layout::default()));
    if let Answer::Layout(l) = &answer {
        let again = rt.block_on(solver.solve(&t, size, &nodes, l));
        prop_assert_eq!(&again, &answer, "re-solving from its own layout changed it");
    }
    Ok((t, size, nodes, answer))
}

#[test]
fn tiny_instances_are_solved_whenever_a_layout_exists() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let solver = Solver::load();
    let (solved, refused) = (Cell::new(0), Cell::new(0));
    runner(300)
        .run(&spec(3..=4, 1..=4), |spec| {
            let (t, size, nodes, answer) = check(&rt, &solver, &spec)?;
            match answer {
                Answer::Layout(_) => solved.set(solved.get() + 1),
                Answer::NoLayout { constraint, message } => {
                    refused.set(refused.get() + 1);
                    let found = exists(&t, size, &nodes);
                    prop_assert!(found.is_none(), "solver says {}: {}, but {:?} is valid", constraint, message, found);
                }
            }
            Ok(())
        })
        .unwrap();
    // Both outcomes are exercised.
    let (solved, refused) = (solved.get(), refused.get());
    assert!(solved > 30 && refused > 30, "{solved} solved, {refused} refused");
}

#[test]
fn every_layout_is_valid_and_stable() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let solver = Solver::load();
    let (solved, gave_up) = (Cell::new(0), Cell::new(0));
    runner(150)
        .run(&spec(3..=10, 1..=30), |spec| {
            // Up to 30 nodes, a search may end at the solver's step budget without an answer
            // (its documented `permanent` error): nothing to check then, but it must stay rare.
            let (t, size, nodes) = (spec.template(), spec.size(), spec.nodes());
            let Some(answer) = rt.block_on(solver.solve_within_budget(&t, size, &nodes, &Layout::default())) else {
                gave_up.set(gave_up.get() + 1);
                return Ok(());
            };
            if let Answer::Layout(l) = &answer {
                let again = rt.block_on(solver.solve(&t, size, &nodes, l));
                prop_assert_eq!(&again, &answer, "re-solving from its own layout changed it");
                solved.set(solved.get() + 1);
            }
            Ok(())
        })
        .unwrap();
    let (solved, gave_up) = (solved.get(), gave_up.get());
    assert!(solved > 30, "{solved} of 150 solved");
    assert!(gave_up <= 5, "the search gave up on {gave_up} of 150 instances");
}

#[test]
fn an_existing_layout_is_kept_while_valid_and_never_blocks_a_layout() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let solver = Solver::load();
    let kept = Cell::new(0);
    // The existing layout: arbitrary (bits of `masks` are services, 0 leaves the node out), or
    // the solver's own answer with a service dropped here and there (often still valid, not full).
    let strategy = (spec(3..=4, 1..=4), prop::collection::vec(0u32..16, 4), any::<bool>());
    runner(200)
        .run(&strategy, |(spec, masks, thin)| {
            let (t, size, nodes) = (spec.template(), spec.size(), spec.nodes());
            let pick = |m: u32| -> BTreeSet<String> { (0..spec.services.len()).filter(|b| m & (1 << b) != 0).map(Spec::name).collect() };
            let existing: Layout = match rt.block_on(solver.solve(&t, size, &nodes, &Layout::default())) {
                Answer::Layout(l) if thin => {
                    l.0.iter()
                        .zip(&masks)
                        .map(|((n, services), &m)| {
                            // At most one service dropped per node (`m` names it when below the count).
                            let left: BTreeSet<String> = services.iter().filter(|s| **s != Spec::name(m as usize)).cloned().collect();
                            (n.clone(), if left.is_empty() { services.clone() } else { left })
                        })
                        .collect()
                }
                _ => nodes
                    .iter()
                    .zip(&masks)
                    .filter(|(_, m)| **m != 0)
                    .map(|(n, &m)| (n.name.clone(), pick(m)))
                    .collect(),
            };
            let valid = check_layout(&t, size, &nodes, &existing).is_ok();
            match rt.block_on(solver.solve(&t, size, &nodes, &existing)) {
                Answer::Layout(l) => {
                    if valid {
                        kept.set(kept.get() + 1);
                        for (n, services) in &existing.0 {
                            let now = l.services_on(n);
                            prop_assert!(now.is_some_and(|now| services.is_subset(now)), "{}: {:?} -> {:?}", n, services, now);
                        }
                    }
                }
                Answer::NoLayout { constraint, message } => {
                    prop_assert!(
                        !valid,
                        "refused ({}: {}) although the existing layout is valid",
                        constraint,
                        message
                    );
                    prop_assert!(
                        exists(&t, size, &nodes).is_none(),
                        "refused ({}: {}) although a layout exists",
                        constraint,
                        message
                    );
                }
            }
            Ok(())
        })
        .unwrap();
    assert!(kept.get() > 20, "only {} valid existing layouts", kept.get());
}
