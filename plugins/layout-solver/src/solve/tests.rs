//! Native checks of the algorithm against brute force on tiny random instances (the Wasm
//! plugin's behaviour is tested through the runtime in `orc-runtime`'s `solver` tests).

use std::collections::BTreeMap;

use orc_cluster::{Layout, NodeInfo, Template, check_layout};
use serde_json::{Value, json};

use super::{Failure, solve};

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn random_template(r: &mut Rng, services: usize) -> Template {
    loop {
        let mut s = serde_json::Map::new();
        for i in 0..services {
            let mut svc = json!({"automator": "x"});
            let min = match r.below(4) {
                0 => None,
                1 => Some(0),
                2 => Some(1),
                _ => Some(2),
            };
            let max = match r.below(4) {
                0 | 1 => None,
                2 => Some(1),
                _ => Some(2),
            };
            let mut count = serde_json::Map::new();
            if let Some(m) = min {
                count.insert("min".into(), json!(m));
            }
            if let Some(m) = max {
                count.insert("max".into(), json!(m));
            }
            svc["count"] = Value::Object(count);
            if r.chance(30) {
                svc["needs"] = json!({"labels": {"disk": "ssd"}});
            } else if r.chance(20) {
                svc["needs"] = json!({"facts": {"cpus": {"min": 2}}});
            }
            s.insert(format!("s{i}"), svc);
        }
        let mut together = Vec::new();
        let mut apart = Vec::new();
        for _ in 0..r.below(3) {
            let a = r.below(services as u64);
            let b = r.below(services as u64);
            if a != b {
                let g = vec![format!("s{a}"), format!("s{b}")];
                if r.chance(50) { together.push(g) } else { apart.push(g) }
            }
        }
        let t = json!({"services": s, "constraints": {"together": together, "apart": apart}});
        if let Ok(t) = Template::from_json(t) {
            return t;
        }
    }
}

fn random_nodes(r: &mut Rng, n: usize) -> Vec<NodeInfo> {
    (0..n)
        .map(|i| NodeInfo {
            name: format!("n{i}"),
            labels: if r.chance(50) {
                [("disk".to_string(), "ssd".to_string())].into()
            } else {
                BTreeMap::new()
            },
            facts: json!({"cpus": r.below(4)}),
        })
        .collect()
}

/// Whether any valid layout exists, by trying every one.
fn brute_force(t: &Template, size: u32, nodes: &[NodeInfo]) -> Option<Layout> {
    let services: Vec<&String> = t.services.keys().collect();
    let subsets = 1usize << services.len();
    let n = nodes.len();
    for chosen in 0usize..(1 << n) {
        if chosen.count_ones() != size {
            continue;
        }
        let idx: Vec<usize> = (0..n).filter(|i| chosen & (1 << i) != 0).collect();
        let combos = subsets.pow(idx.len() as u32);
        for mut k in 0..combos {
            let layout: Layout = idx
                .iter()
                .map(|&i| {
                    let set = k % subsets;
                    k /= subsets;
                    let s: Vec<String> = (0..services.len())
                        .filter(|b| set & (1 << b) != 0)
                        .map(|b| services[b].clone())
                        .collect();
                    (nodes[i].name.clone(), s)
                })
                .collect();
            if check_layout(t, size, nodes, &layout).is_ok() {
                return Some(layout);
            }
        }
    }
    None
}

#[test]
fn tiny_instances_agree_with_brute_force() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut solved, mut refused) = (0, 0);
    for case in 0..3000 {
        let services = 1 + r.below(4) as usize;
        let t = random_template(&mut r, services);
        let n = 1 + r.below(4) as usize;
        let nodes = random_nodes(&mut r, n);
        let size = 1 + r.below(n as u64) as u32;
        let got = solve(&t, size, &nodes, &Layout::default());
        match &got {
            Ok(layout) => {
                solved += 1;
                check_layout(&t, size, &nodes, layout).unwrap_or_else(|v| panic!("case {case}: {v}"));
                let again = solve(&t, size, &nodes, layout).unwrap();
                assert_eq!(&again, layout, "case {case}: re-solving changed the layout");
            }
            Err(Failure::NoLayout { constraint, message }) => {
                refused += 1;
                if let Some(l) = brute_force(&t, size, &nodes) {
                    panic!(
                        "case {case}: solver says {constraint}: {message}, but {l:?} is valid\ntemplate {}\nnodes {nodes:?} size {size}",
                        serde_json::to_string(&t).unwrap()
                    );
                }
            }
            Err(e) => panic!("case {case}: {e:?}"),
        }
    }
    // Both outcomes are exercised.
    assert!(solved > 500 && refused > 500, "{solved} solved, {refused} refused");
}

/// A random layout over `nodes` (valid or not).
fn random_layout(r: &mut Rng, t: &Template, nodes: &[NodeInfo]) -> Layout {
    let services: Vec<&String> = t.services.keys().collect();
    let mut layout = Layout::default();
    for n in nodes {
        if r.chance(60) {
            let s = services.iter().filter(|_| r.chance(50)).map(|s| s.to_string()).collect();
            layout.0.insert(n.name.clone(), s);
        }
    }
    layout
}

#[test]
fn any_existing_layout_still_gets_a_valid_answer_and_a_valid_one_is_kept() {
    let mut r = Rng(0x5eed);
    let mut kept = 0;
    for case in 0..2000 {
        let services = 1 + r.below(4) as usize;
        let t = random_template(&mut r, services);
        let n = 1 + r.below(4) as usize;
        let nodes = random_nodes(&mut r, n);
        let size = 1 + r.below(n as u64) as u32;
        let existing = random_layout(&mut r, &t, &nodes);
        let valid = check_layout(&t, size, &nodes, &existing).is_ok();
        match solve(&t, size, &nodes, &existing) {
            Ok(layout) => {
                check_layout(&t, size, &nodes, &layout).unwrap_or_else(|v| panic!("case {case}: {v}"));
                if valid {
                    kept += 1;
                    for (node, services) in &existing.0 {
                        let now = layout.services_on(node).unwrap_or_else(|| panic!("case {case}: {node} dropped"));
                        assert!(services.is_subset(now), "case {case}: {node}: {services:?} -> {now:?}");
                    }
                }
            }
            Err(Failure::NoLayout { .. }) => {
                assert!(!valid, "case {case}: the existing layout is valid");
                assert!(brute_force(&t, size, &nodes).is_none(), "case {case}: a layout exists");
            }
            Err(e) => panic!("case {case}: {e:?}"),
        }
    }
    assert!(kept > 50, "only {kept} valid existing layouts");
}

#[test]
fn larger_instances_are_valid_and_stable() {
    let mut r = Rng(42);
    let mut solved = 0;
    for case in 0..300 {
        let services = 3 + r.below(8) as usize;
        let t = random_template(&mut r, services);
        let n = 1 + r.below(40) as usize;
        let nodes = random_nodes(&mut r, n);
        let size = 1 + r.below(n as u64) as u32;
        match solve(&t, size, &nodes, &Layout::default()) {
            Ok(layout) => {
                solved += 1;
                check_layout(&t, size, &nodes, &layout).unwrap_or_else(|v| panic!("case {case}: {v}"));
                assert_eq!(solve(&t, size, &nodes, &layout).unwrap(), layout, "case {case}");
            }
            Err(Failure::NoLayout { .. }) => {}
            Err(e) => panic!("case {case}: {e:?}"),
        }
    }
    assert!(solved > 100, "{solved} of 300 solved");
}
