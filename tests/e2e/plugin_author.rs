//! The plugin author's path: `orc-plugin new` in an empty directory outside the repository,
//! `build`, `inspect`, `publish` to a registry service and to a registry directory, then the host
//! loads the plugin by digest and calls it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use orc_manifest::{Digest, PluginKind};
use orc_runtime::{CallContext, Grants, Runtime, RuntimeConfig};
use orc_tests::{bin, repo_root, run, stdout};

/// The `sha256:` line `orc-plugin build` and `publish` print.
fn digest_line(text: &str) -> Digest {
    text.lines()
        .find_map(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no digest line in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn new_build_publish_and_load_by_digest() {
    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("orc-home");
    let plugin = |args: &[&str]| {
        let mut c = Command::new(bin("orc-plugin"));
        c.args(args).current_dir(work.path()).env("ORC_HOME", &home);
        c
    };

    run(
        plugin(&["new", "adaptor", "welcome"]).arg("--dir").arg(work.path().join("welcome")),
        true,
    );
    let manifest = std::fs::read_to_string(work.path().join("welcome/Cargo.toml")).unwrap();
    assert!(
        !manifest.contains(&repo_root().display().to_string()),
        "the scaffold must not point into the repository:\n{manifest}"
    );

    let build = run(
        plugin(&["build", "welcome"]).env("CARGO_TARGET_DIR", orc_tests::guest_target_dir()),
        true,
    );
    let text = stdout(&build);
    let digest = digest_line(&text);
    let artifact = work.path().join("welcome/target/orc/welcome-0.1.0.wasm");
    let bytes = std::fs::read(&artifact).unwrap();
    assert_eq!(Digest::of(&bytes), digest, "the printed digest is the artifact's");

    let inspect = stdout(&run(plugin(&["inspect", "--json"]).arg(&artifact), true));
    let info: serde_json::Value = serde_json::from_str(&inspect).unwrap();
    assert_eq!(info["manifest"]["kind"], "adaptor");
    assert_eq!(info["manifest"]["capabilities"], serde_json::json!(["node-files"]));
    assert!(
        info["exports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == "orc:plugin/resource-adaptor@0.1.0"),
        "{inspect}"
    );

    // A registry service: the standalone binary on a free port.
    let root = work.path().join("registry-service");
    let mut server = Command::new(bin("orc-registry"))
        .args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(&root)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line}"))
        .to_string();

    let published = stdout(&run(plugin(&["publish"]).arg(&artifact).args(["--registry", &url]), true));
    assert!(published.contains("published welcome@0.1.0"), "{published}");
    assert_eq!(digest_line(&published), digest);
    let again = stdout(&run(plugin(&["publish"]).arg(&artifact).args(["--registry", &url]), true));
    assert!(again.contains("already published"), "{again}");

    // The host runtime fetches it by digest from the service and calls it on a local node.
    let client = orc_registry::Client::new(&url).unwrap();
    let runtime = Runtime::new(RuntimeConfig {
        max_instances: 8,
        ..RuntimeConfig::default()
    })
    .unwrap();
    // A scaffolded plugin's author tests it with everything granted; environments narrow that.
    let loaded = runtime.load(&digest, PluginKind::Adaptor, &client, &Grants::all()).await.unwrap();
    let node_root = work.path().join("node");
    let nodes = orc_node::Nodes::default();
    nodes.insert("web1", std::sync::Arc::new(orc_node::LocalNode::open(&node_root).unwrap()));
    let ctx = CallContext {
        nodes: std::sync::Arc::new(nodes),
        ..CallContext::new("e2e")
    };
    let target = orc_runtime::wit::Target {
        id: "welcome[web1,/hello.txt]".into(),
        resource_type: "welcome".into(),
        node: "web1".into(),
        key: "/hello.txt".into(),
        attributes: r#"{"greeting":"hello from a fresh plugin"}"#.into(),
    };
    let mut instance = loaded.adaptor(&ctx).await.unwrap();
    assert_eq!(instance.read(&target).await.unwrap(), None);
    let changes = instance.diff(&target, None).await.unwrap();
    instance.apply(&target, None, &changes).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(node_root.join("hello.txt")).unwrap(),
        "hello from a fresh plugin\n"
    );
    let logs = instance.take_logs();
    assert!(logs.iter().any(|l| l.message.contains("wrote")), "{logs:?}");
    server.kill().unwrap();
    let _ = server.wait();

    // And through a registry directory into an embedded deploy that names the plugin by digest.
    let data = work.path().join("data");
    run(
        plugin(&["publish"]).arg(&artifact).arg("--registry").arg(data.join("registry")),
        true,
    );
    let intent = work.path().join("intent.json");
    std::fs::write(
        &intent,
        serde_json::json!({ "resources": [
            { "id": "welcome[local,/motd]", "adaptor": digest.to_string(), "attributes": { "greeting": "hi" } }
        ]})
        .to_string(),
    )
    .unwrap();
    let out = run(
        Command::new(bin("orc-host"))
            .arg("deploy")
            .arg(&intent)
            .arg("--data-dir")
            .arg(&data),
        true,
    );
    assert!(stdout(&out).contains("1 changed"), "{}", stdout(&out));
    assert_eq!(std::fs::read_to_string(data.join("nodes/local/motd")).unwrap(), "hi\n");
}

#[test]
fn build_refuses_a_component_of_the_wrong_world() {
    let out = run(
        Command::new(bin("orc-plugin"))
            .arg("build")
            .arg(repo_root().join("plugins/fixtures/wrong-world"))
            .arg("--out")
            .arg(tempfile::tempdir().unwrap().path())
            .args(["--profile", "plugin"]),
        false,
    );
    assert!(!out.status.success());
    let err = orc_tests::stderr(&out);
    assert!(
        err.contains("does not implement the adaptor world") && err.contains("orc:plugin/resource-adaptor@0.1.0"),
        "{err}"
    );
}

/// The solver and automator scaffolds build and run through the host's runtime too.
#[tokio::test(flavor = "multi_thread")]
async fn solver_and_automator_scaffolds_build_and_run() {
    use orc_runtime::wit::{Action, LayoutRequest, NodeInfo, SolveError, Task};

    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("orc-home");
    let runtime = Runtime::new(RuntimeConfig {
        max_instances: 8,
        ..RuntimeConfig::default()
    })
    .unwrap();
    let mut built = Vec::new();
    for (kind, name) in [("solver", "spread"), ("automator", "scripted")] {
        let run_cli = |args: &[&str]| {
            let mut c = Command::new(bin("orc-plugin"));
            c.args(args)
                .current_dir(work.path())
                .env("ORC_HOME", &home)
                .env("CARGO_TARGET_DIR", orc_tests::guest_target_dir());
            run(&mut c, true)
        };
        run_cli(&["new", kind, name]);
        let digest = digest_line(&stdout(&run_cli(&["build", name])));
        let bytes = std::fs::read(work.path().join(name).join(format!("target/orc/{name}-0.1.0.wasm"))).unwrap();
        built.push((digest, bytes));
    }

    let (digest, bytes) = &built[0];
    let solver = runtime.load_bytes(digest, bytes, PluginKind::Solver, &Grants::none()).unwrap();
    let mut instance = solver.solver(&CallContext::new("e2e")).await.unwrap();
    let node = |name: &str| NodeInfo {
        name: name.into(),
        labels: vec![],
        facts: "{}".into(),
    };
    let request = LayoutRequest {
        template: r#"{"services":["db","web","cache"]}"#.into(),
        size: 2,
        nodes: vec![node("n1"), node("n2"), node("n3")],
        existing: vec![],
    };
    let layout = instance.solve(&request).await.unwrap().unwrap();
    assert_eq!(layout.len(), 2);
    assert_eq!(layout[0].services, vec!["db", "cache"]);
    let too_big = LayoutRequest { size: 5, ..request };
    match instance.solve(&too_big).await.unwrap() {
        Err(SolveError::NoValidLayout(e)) => assert_eq!(e.constraint, "size"),
        other => panic!("expected no valid layout, got {other:?}"),
    }

    let (digest, bytes) = &built[1];
    // As above: the author's own test, everything granted.
    let automator = runtime.load_bytes(digest, bytes, PluginKind::Automator, &Grants::all()).unwrap();
    let node_root = work.path().join("node");
    let nodes = orc_node::Nodes::default();
    nodes.insert("n1", std::sync::Arc::new(orc_node::LocalNode::open(&node_root).unwrap()));
    let ctx = CallContext {
        nodes: std::sync::Arc::new(nodes),
        ..CallContext::new("e2e")
    };
    let task = Task {
        cluster: "c1".into(),
        service: "web".into(),
        node: "n1".into(),
        action: Action::Install,
        config: r#"{"scripts":{"install":"echo installed $ORC_SERVICE > marker; cat marker"}}"#.into(),
        layout: "{}".into(),
    };
    let outcome = automator.automator(&ctx).await.unwrap().perform(&task).await.unwrap();
    assert_eq!(outcome.messages, vec!["installed web\n"]);
    assert_eq!(std::fs::read_to_string(node_root.join("marker")).unwrap(), "installed web\n");
}

/// `orc-plugin publish-service`: the first-party redis service from its TOML file, its
/// automator pinned to the digest it has in the registry; the same file again is no change; a
/// mistake is named by its field before anything is published.
#[test]
fn publish_service_pins_the_automator_and_names_a_bad_field() {
    let work = tempfile::tempdir().unwrap();
    let registry = work.path().join("registry");
    let redis = &orc_plugin_artifacts::REDIS;
    let wasm = work.path().join("redis.wasm");
    std::fs::write(&wasm, redis.bytes).unwrap();
    let cli = |args: &[&str]| {
        let mut c = Command::new(bin("orc-plugin"));
        c.args(args).arg("--registry").arg(&registry);
        c
    };
    run(&mut cli(&["publish", wasm.to_str().unwrap()]), true);
    let service = repo_root().join("plugins/redis/service.toml");
    let out = stdout(&run(&mut cli(&["publish-service", service.to_str().unwrap(), "--json"]), true));
    let published: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(published["created"], true, "{out}");
    assert_eq!(published["entry"]["automator"], redis.digest, "{out}");
    let store = orc_registry::Store::open(&registry, Default::default()).unwrap();
    let entry = store.resolve_service("redis", "1.0.0").unwrap();
    let doc = store.service_document(&entry).unwrap();
    assert_eq!(doc.automator.to_string(), redis.digest);
    assert_eq!(doc.interface("kv").unwrap().limit(), None);
    let again = stdout(&run(&mut cli(&["publish-service", service.to_str().unwrap()]), true));
    assert!(again.contains("already published (no change)"), "{again}");

    let bad = work.path().join("bad.toml");
    let text = std::fs::read_to_string(&service)
        .unwrap()
        .replace("version = \"1.0.0\"\ndescription", "version = \"1.1.0\"\ndescription");
    std::fs::write(&bad, text.replace("allow_multiple = true", "max_connections = 0")).unwrap();
    let out = run(&mut cli(&["publish-service", bad.to_str().unwrap()]), false);
    assert!(!out.status.success());
    let err = orc_tests::stderr(&out);
    assert!(err.contains("interfaces[0].max_connections") && err.contains("at least 1"), "{err}");
    assert_eq!(store.service_versions("redis").unwrap().len(), 1);
}
