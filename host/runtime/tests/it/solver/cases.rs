//! One case per behaviour: each constraint kind, fill, minimal change, each refusal named,
//! malformed templates, determinism.

use orc_cluster::Layout;
use orc_runtime::{CallError, PluginErrorKind};
use serde_json::json;

use super::{Solver, layout, node, plain, template};

fn hosting<'a>(l: &'a Layout, service: &'a str) -> Vec<&'a str> {
    l.nodes_of(service).collect()
}

#[tokio::test]
async fn together_services_share_every_node() {
    let s = Solver::load();
    let t = template(json!({"services": {"web": {}, "agent": {}, "db": {"count": {"max": 1}}},
        "constraints": {"together": [["web", "agent"]]}}));
    let l = s.solve(&t, 3, &plain(3), &Layout::default()).await.layout();
    assert_eq!(
        l,
        layout(&[
            ("n1", &["agent", "db", "web"]),
            ("n2", &["agent", "web"]),
            ("n3", &["agent", "web"])
        ])
    );
    // A together group whose partner has a max: both follow the tighter count.
    let t = template(json!({"services": {"web": {}, "agent": {"count": {"max": 2}}, "base": {}},
        "constraints": {"together": [["web", "agent"]]}}));
    let l = s.solve(&t, 4, &plain(4), &Layout::default()).await.layout();
    assert_eq!(hosting(&l, "web"), hosting(&l, "agent"));
    assert_eq!(hosting(&l, "web").len(), 2);
}

#[tokio::test]
async fn apart_services_never_share_a_node() {
    let s = Solver::load();
    let t = template(json!({"services": {"db": {"count": {"max": 1}}, "web": {}, "cache": {}},
        "constraints": {"apart": [["db", "web"]]}}));
    let l = s.solve(&t, 3, &plain(3), &Layout::default()).await.layout();
    assert_eq!(
        l,
        layout(&[("n1", &["cache", "db"]), ("n2", &["cache", "web"]), ("n3", &["cache", "web"])])
    );
    // Three services pairwise apart on three nodes: one each.
    let t = template(json!({"services": {"a": {}, "b": {}, "c": {}},
        "constraints": {"apart": [["a", "b", "c"]]}}));
    let l = s.solve(&t, 3, &plain(3), &Layout::default()).await.layout();
    assert!(l.0.values().all(|services| services.len() == 1), "{l:?}");
}

#[tokio::test]
async fn counts_bound_how_many_nodes_run_a_service() {
    let s = Solver::load();
    let t = template(json!({"services": {"web": {"count": {"min": 2, "max": 2}}, "mon": {}}}));
    let l = s.solve(&t, 4, &plain(4), &Layout::default()).await.layout();
    assert_eq!(hosting(&l, "web").len(), 2);
    assert_eq!(hosting(&l, "mon").len(), 4);
    // Mins are met before anything is filled: with min 2 each, two apart services split 2 + 2
    // (with the default min 1, fill would give the first one 3 nodes).
    let t = template(json!({"services": {"a": {"count": {"min": 2}}, "b": {"count": {"min": 2}}},
        "constraints": {"apart": [["a", "b"]]}}));
    let l = s.solve(&t, 4, &plain(4), &Layout::default()).await.layout();
    assert_eq!((hosting(&l, "a").len(), hosting(&l, "b").len()), (2, 2));
    let t = template(json!({"services": {"a": {}, "b": {}}, "constraints": {"apart": [["a", "b"]]}}));
    let l = s.solve(&t, 4, &plain(4), &Layout::default()).await.layout();
    assert_eq!((hosting(&l, "a").len(), hosting(&l, "b").len()), (3, 1));
    // min 0: an optional service nobody can host is simply left out.
    let t = template(json!({"services": {"web": {}, "gpu": {"count": {"min": 0}, "needs": {"labels": {"gpu": "yes"}}}}}));
    let l = s.solve(&t, 2, &plain(2), &Layout::default()).await.layout();
    assert!(hosting(&l, "gpu").is_empty());
}

#[tokio::test]
async fn needs_labels_pick_the_nodes() {
    let s = Solver::load();
    let t = template(json!({"services": {
        "db": {"count": {"max": 1}, "needs": {"labels": {"disk": "ssd"}}},
        "web": {"needs": {"labels": {"zone": "eu"}}},
        "base": {}}}));
    let nodes = vec![
        node("n1", &[("zone", "eu")], json!({})),
        node("n2", &[("disk", "ssd")], json!({})),
        node("n3", &[("disk", "ssd"), ("zone", "us")], json!({})),
    ];
    let l = s.solve(&t, 3, &nodes, &Layout::default()).await.layout();
    assert_eq!(hosting(&l, "db"), ["n2"]);
    assert_eq!(hosting(&l, "web"), ["n1"]);
    assert_eq!(hosting(&l, "base"), ["n1", "n2", "n3"]);
}

#[tokio::test]
async fn needs_facts_by_range_and_equality() {
    let s = Solver::load();
    let t = template(json!({"services": {
        "big": {"needs": {"facts": {"memory_bytes": {"min": 8_000_000_000u64}}}},
        "arm": {"needs": {"facts": {"architecture": "aarch64"}}},
        "quad": {"needs": {"facts": {"cpus": 4}}},
        "small": {"needs": {"facts": {"cpus": {"max": 2}}}},
        "base": {}}}));
    let nodes = vec![
        node(
            "n1",
            &[],
            json!({"architecture": "x86_64", "memory_bytes": 4_000_000_000u64, "cpus": 4}),
        ),
        node(
            "n2",
            &[],
            json!({"architecture": "aarch64", "memory_bytes": 16_000_000_000u64, "cpus": 2}),
        ),
        // 4.0 equals 4; a node without the fact never meets a need on it.
        node(
            "n3",
            &[],
            json!({"architecture": "x86_64", "memory_bytes": 16_000_000_000u64, "cpus": 4.0}),
        ),
        node("n4", &[], json!({"architecture": "x86_64"})),
    ];
    let l = s.solve(&t, 4, &nodes, &Layout::default()).await.layout();
    assert_eq!(hosting(&l, "big"), ["n2", "n3"]);
    assert_eq!(hosting(&l, "arm"), ["n2"]);
    assert_eq!(hosting(&l, "quad"), ["n1", "n3"]);
    assert_eq!(hosting(&l, "small"), ["n2"]);
    assert_eq!(hosting(&l, "base").len(), 4);
}

#[tokio::test]
async fn fill_places_services_up_to_their_max_and_prefers_nodes_that_host_more() {
    let s = Solver::load();
    let t = template(json!({"services": {"web": {}, "cache": {"count": {"max": 2}}}}));
    let l = s.solve(&t, 5, &plain(5), &Layout::default()).await.layout();
    assert_eq!(hosting(&l, "web").len(), 5);
    assert_eq!(hosting(&l, "cache"), ["n1", "n2"]);
    // Three nodes out of six: the ones that can also host `db` (unbounded) are taken.
    let t = template(json!({"services": {"web": {}, "db": {"needs": {"labels": {"disk": "ssd"}}}}}));
    let mut nodes = plain(6);
    for n in &mut nodes[3..] {
        n.labels.insert("disk".into(), "ssd".into());
    }
    let l = s.solve(&t, 3, &nodes, &Layout::default()).await.layout();
    assert_eq!(l, layout(&[("n4", &["db", "web"]), ("n5", &["db", "web"]), ("n6", &["db", "web"])]));
}

#[tokio::test]
async fn a_valid_existing_layout_is_kept_as_it_is() {
    let s = Solver::load();
    let t = template(json!({"services": {"db": {"count": {"max": 1}}, "web": {}},
        "constraints": {"apart": [["db", "web"]]}}));
    // Not what a fresh solve would pick (n1..n3), but valid: it stays.
    let existing = layout(&[("n3", &["web"]), ("n4", &["db"]), ("n5", &["web"])]);
    let l = s.solve(&t, 3, &plain(5), &existing).await.layout();
    assert_eq!(l, existing);
}

#[tokio::test]
async fn growing_keeps_every_node_and_its_services() {
    let s = Solver::load();
    let t = template(
        json!({"services": {"db": {"count": {"max": 1}}, "web": {}, "cache": {"count": {"max": 2}}},
        "constraints": {"apart": [["db", "web"]]}}),
    );
    let existing = layout(&[("n4", &["cache", "db"]), ("n5", &["cache", "web"]), ("n6", &["web"])]);
    assert_eq!(s.solve(&t, 3, &plain(6), &existing).await.layout(), existing);
    let l = s.solve(&t, 5, &plain(6), &existing).await.layout();
    assert_eq!(l.len(), 5);
    for (n, services) in &existing.0 {
        assert_eq!(l.services_on(n), Some(services), "{n} changed: {l:?}");
    }
    assert_eq!(hosting(&l, "web").len(), 4);
}

#[tokio::test]
async fn shrinking_keeps_the_remaining_nodes_intact() {
    let s = Solver::load();
    let t = template(
        json!({"services": {"db": {"count": {"max": 1}}, "web": {}, "cache": {"count": {"max": 2}}},
        "constraints": {"apart": [["db", "web"]]}}),
    );
    let five = s.solve(&t, 5, &plain(5), &Layout::default()).await.layout();
    let three = s.solve(&t, 3, &plain(5), &five).await.layout();
    assert_eq!(three.len(), 3);
    for (n, services) in &three.0 {
        assert_eq!(five.services_on(n), Some(services), "{n} changed: {five:?} -> {three:?}");
    }
    // `db` runs on one node only: that node is never the one dropped.
    assert_eq!(hosting(&three, "db"), hosting(&five, "db"));
}

#[tokio::test]
async fn adding_a_service_keeps_every_existing_placement() {
    let s = Solver::load();
    let before = template(json!({"services": {"db": {"count": {"max": 1}}, "web": {}},
        "constraints": {"apart": [["db", "web"]]}}));
    let existing = s.solve(&before, 3, &plain(3), &Layout::default()).await.layout();
    let after = template(json!({"services": {"db": {"count": {"max": 1}}, "web": {}, "cache": {}, "mon": {}},
        "constraints": {"apart": [["db", "web"]], "together": [["web", "mon"]]}}));
    let l = s.solve(&after, 3, &plain(3), &existing).await.layout();
    for (n, services) in &existing.0 {
        let now = l.services_on(n).expect("node kept");
        assert!(services.is_subset(now), "{n}: {services:?} -> {now:?}");
    }
    assert_eq!(hosting(&l, "cache").len(), 3);
    assert_eq!(hosting(&l, "mon"), hosting(&l, "web"));
}

#[tokio::test]
async fn each_impossible_request_names_its_constraint() {
    let s = Solver::load();
    let ssd = |name: &str| node(name, &[("disk", "ssd")], json!({}));
    // Nobody meets the needs.
    let t = template(json!({"services": {"db": {"needs": {"labels": {"disk": "ssd"}}}, "web": {}}}));
    let (c, m) = s.solve(&t, 2, &plain(3), &Layout::default()).await.refusal();
    assert_eq!(c, "services.db.needs", "{m}");
    assert!(m.contains("`db`"), "{m}");
    // More nodes wanted than meet the needs.
    let t = template(json!({"services": {"db": {"count": {"min": 3}, "needs": {"labels": {"disk": "ssd"}}}, "web": {}}}));
    let nodes = vec![ssd("n1"), ssd("n2"), node("n3", &[], json!({}))];
    let (c, m) = s.solve(&t, 3, &nodes, &Layout::default()).await.refusal();
    assert_eq!(c, "services.db.count", "{m}");
    assert!(m.contains("at least 3") && m.contains("only 2"), "{m}");
    // A min above the size.
    let t = template(json!({"services": {"db": {"count": {"min": 4}}}}));
    let (c, m) = s.solve(&t, 3, &plain(5), &Layout::default()).await.refusal();
    assert_eq!(c, "services.db.count", "{m}");
    // Apart services need more nodes than the cluster has.
    let t = template(json!({"services": {"db": {}, "web": {"count": {"min": 2}}}, "constraints": {"apart": [["db", "web"]]}}));
    let (c, m) = s.solve(&t, 2, &plain(3), &Layout::default()).await.refusal();
    assert_eq!(c, "constraints.apart[0]", "{m}");
    assert!(m.contains("need 3 nodes") && m.contains("has 2"), "{m}");
    // ... or more distinct nodes than meet their needs.
    let t = template(json!({"services": {
        "db": {"needs": {"labels": {"disk": "ssd"}}}, "web": {"needs": {"labels": {"disk": "ssd"}}}, "base": {}},
        "constraints": {"apart": [["base", "web"], ["db", "web"]]}}));
    let nodes = vec![ssd("n1"), node("n2", &[], json!({})), node("n3", &[], json!({}))];
    let (c, m) = s.solve(&t, 3, &nodes, &Layout::default()).await.refusal();
    assert_eq!(c, "constraints.apart[1]", "{m}");
    // Fewer nodes than the size.
    let t = template(json!({"services": {"web": {}}}));
    let (c, m) = s.solve(&t, 5, &plain(3), &Layout::default()).await.refusal();
    assert_eq!(c, "size", "{m}");
    assert!(m.contains("5 nodes") && m.contains("3 are available"), "{m}");
    // Together services whose needs no single node meets.
    let t = template(json!({"services": {
        "a": {"needs": {"labels": {"disk": "ssd"}}}, "b": {"needs": {"labels": {"gpu": "yes"}}}},
        "constraints": {"together": [["a", "b"]]}}));
    let nodes = vec![ssd("n1"), node("n2", &[("gpu", "yes")], json!({}))];
    let (c, m) = s.solve(&t, 1, &nodes, &Layout::default()).await.refusal();
    assert_eq!(c, "constraints.together[0]", "{m}");
    // Every node must host a service, but the only one runs on at most 2.
    let t = template(json!({"services": {"db": {"count": {"max": 2}}}}));
    let (c, m) = s.solve(&t, 3, &plain(3), &Layout::default()).await.refusal();
    assert_eq!(c, "services.db.count", "{m}");
    // Three services kept pairwise apart by three groups cannot fit on two nodes.
    let t = template(json!({"services": {"a": {}, "b": {}, "c": {}},
        "constraints": {"apart": [["a", "b"], ["b", "c"], ["a", "c"]]}}));
    let (c, m) = s.solve(&t, 2, &plain(2), &Layout::default()).await.refusal();
    assert_eq!(c, "constraints.apart[0]", "{m}");
    assert!(
        m.contains("constraints.apart[1] and constraints.apart[2]") && m.contains("need 3 nodes"),
        "{m}"
    );
    // Found only by the search: one node cannot meet both services' needs, two would.
    let t = template(json!({"services": {
        "db": {"needs": {"labels": {"disk": "ssd"}}}, "api": {"needs": {"facts": {"cpus": {"min": 4}}}}}}));
    let nodes = vec![
        node("n1", &[("disk", "ssd")], json!({"cpus": 2})),
        node("n2", &[], json!({"cpus": 8})),
    ];
    let (c, m) = s.solve(&t, 1, &nodes, &Layout::default()).await.refusal();
    assert_eq!(c, "size", "{m}");
    assert!(m.contains("at least 2 nodes"), "{m}");
}

#[tokio::test]
async fn malformed_templates_are_invalid_input() {
    let s = Solver::load();
    for bad in [
        "{not json".to_string(),
        json!({"services": {"web": {}}}).to_string(),
        json!({"services": {"web": {"automator": "x", "count": {"min": "two"}}}}).to_string(),
        json!({"services": {"web": {"automator": "x"}}, "constraints": {"apart": [["web", "db"]]}}).to_string(),
        json!({"services": {"web": {"automator": "x"}}, "colour": "blue"}).to_string(),
    ] {
        let err = s.solve_raw(bad.clone(), 1, &plain(1), &Layout::default()).await.expect_err(&bad);
        let CallError::Failed { error, .. } = &err else {
            panic!("{bad}: expected failed, got {err}");
        };
        assert_eq!(error.kind, PluginErrorKind::InvalidInput, "{bad}: {err}");
        assert!(error.message.starts_with("invalid template"), "{bad}: {err}");
    }
    // A node listed twice is invalid input too.
    let t = serde_json::to_string(&template(json!({"services": {"web": {}}}))).unwrap();
    let mut nodes = plain(2);
    nodes[1].name = "n1".into();
    let err = s.solve_raw(t, 1, &nodes, &Layout::default()).await.unwrap_err();
    assert!(
        matches!(&err, CallError::Failed { error, .. } if error.kind == PluginErrorKind::InvalidInput),
        "{err}"
    );
}

#[tokio::test]
async fn the_same_request_gets_the_same_answer_whatever_the_node_order() {
    let s = Solver::load();
    let t = template(json!({"services": {
        "db": {"count": {"min": 1, "max": 2}, "needs": {"labels": {"disk": "ssd"}}},
        "web": {}, "agent": {}, "cache": {"count": {"max": 3}}},
        "constraints": {"together": [["web", "agent"]], "apart": [["db", "web"]]}}));
    let mut nodes: Vec<_> = (1..=12)
        .map(|i| {
            let labels: &[(&str, &str)] = if i % 3 == 0 { &[("disk", "ssd")] } else { &[] };
            node(&format!("n{i:02}"), labels, json!({"cpus": i}))
        })
        .collect();
    let first = s.solve(&t, 7, &nodes, &Layout::default()).await.layout();
    assert_eq!(s.solve(&t, 7, &nodes, &Layout::default()).await.layout(), first);
    nodes.reverse();
    assert_eq!(s.solve(&t, 7, &nodes, &Layout::default()).await.layout(), first);
    // And solving again from its own answer changes nothing.
    assert_eq!(s.solve(&t, 7, &nodes, &first).await.layout(), first);
}
