//! The README's quickstart: `orc-host deploy` of the example intent into a sandbox directory,
//! idempotent on the second run, drift reported by dryrun and repaired by the next deploy, and
//! bad intents refused with errors that name the culprit.

use std::process::Command;

use orc_tests::{bin, repo_root, run, stderr, stdout};

fn deploy(data: &std::path::Path, intent: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut c = Command::new(bin("orc-host"));
    c.arg("deploy").arg(intent).arg("--data-dir").arg(data).args(extra);
    run(&mut c, false)
}

#[test]
fn quickstart_deploys_is_idempotent_and_repairs_drift() {
    let data = tempfile::tempdir().unwrap();
    let intent = repo_root().join("host/intents/quickstart.json");

    let first = deploy(data.path(), &intent, &[]);
    assert!(first.status.success(), "{}{}", stdout(&first), stderr(&first));
    assert!(stdout(&first).contains("6 resources: 6 changed"), "{}", stdout(&first));
    let root = data.path().join("nodes/local");
    assert_eq!(
        std::fs::read_to_string(root.join("srv/www/index.html")).unwrap(),
        "<h1>Deployed by orc</h1>\n"
    );

    let second = deploy(data.path(), &intent, &[]);
    assert!(
        stdout(&second).contains("6 resources: 0 changed, 6 unchanged"),
        "{}",
        stdout(&second)
    );

    std::fs::write(root.join("etc/motd"), "drift\n").unwrap();
    let dry = deploy(data.path(), &intent, &["--dryrun", "--json"]);
    assert!(dry.status.success());
    let report: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    let motd = report["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["resource"] == "file[local,/etc/motd]")
        .unwrap();
    assert_eq!(motd["outcome"], "would_change");
    assert_eq!(motd["changes"][0]["current"], "drift\n");
    assert_eq!(
        std::fs::read_to_string(root.join("etc/motd")).unwrap(),
        "drift\n",
        "dryrun changes nothing"
    );

    let repair = deploy(data.path(), &intent, &[]);
    assert!(stdout(&repair).contains("1 changed, 5 unchanged"), "{}", stdout(&repair));
    assert_eq!(
        std::fs::read_to_string(root.join("etc/motd")).unwrap(),
        "Welcome. This machine is managed by orc.\n"
    );
}

#[test]
fn a_failure_skips_dependents_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let intent = dir.path().join("intent.json");
    std::fs::write(
        &intent,
        serde_json::json!({ "resources": [
            { "id": "file[local,/missing-parent/a]", "adaptor": "file@0.1.0", "attributes": { "content": "a" } },
            { "id": "file[local,/b]", "adaptor": "file@0.1.0", "attributes": { "content": "b" }, "requires": ["file[local,/missing-parent/a]"] },
            { "id": "file[local,/c]", "adaptor": "file@0.1.0", "attributes": { "content": "c" } }
        ]})
        .to_string(),
    )
    .unwrap();
    let out = deploy(&dir.path().join("data"), &intent, &[]);
    assert!(!out.status.success());
    let text = stdout(&out);
    assert!(text.contains("parent directory /missing-parent does not exist"), "{text}");
    assert!(text.contains("skipped  file[local,/b]"), "{text}");
    assert!(
        text.contains("1 changed, 0 unchanged, 1 failed, 0 unavailable, 1 skipped"),
        "{text}"
    );
}

#[test]
fn bad_intents_are_refused_with_the_culprit_named() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            serde_json::json!({"resources": [{"id": "file[local,/a]", "adaptor": "file@0.1.0", "requires": ["file[local,/b]"]}, {"id": "file[local,/b]", "adaptor": "file@0.1.0", "requires": ["file[local,/a]"]}]}),
            "dependency cycle: file[local,/a] -> file[local,/b] -> file[local,/a]",
        ),
        (
            serde_json::json!({"resources": [{"id": "file[local,/a]", "adaptor": "nosuch@1.0.0"}]}),
            "names adaptor `nosuch@1.0.0`, which is not in the registry",
        ),
        (
            serde_json::json!({"resources": [{"id": "file[local,/a]", "adaptor": format!("sha256:{}", "0".repeat(64))}]}),
            "which is not in the registry",
        ),
        (
            serde_json::json!({"resources": [{"id": "file[web9,/a]", "adaptor": "file@0.1.0"}]}),
            "is on node `web9`",
        ),
        (
            serde_json::json!({"resources": [{"id": "dir[local,/a]", "adaptor": "file@0.1.0"}]}),
            "handles only `file`",
        ),
        (
            serde_json::json!({"resources": [{"id": "file[local,/a]", "adaptor": "file@0.1.0"}, {"id": "file[local,/a]", "adaptor": "file@0.1.0"}]}),
            "`file[local,/a]` appears more than once",
        ),
    ];
    for (i, (intent, expected)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("{i}.json"));
        std::fs::write(&path, intent.to_string()).unwrap();
        let out = deploy(&dir.path().join("data"), &path, &[]);
        assert!(!out.status.success(), "case {i}");
        assert!(
            stderr(&out).contains(expected),
            "case {i}: expected `{expected}` in:\n{}",
            stderr(&out)
        );
    }
    std::fs::write(dir.path().join("bad.json"), "{ not json").unwrap();
    let out = deploy(&dir.path().join("data"), &dir.path().join("bad.json"), &[]);
    assert!(stderr(&out).contains("the intent is not valid JSON"), "{}", stderr(&out));
}

/// Where the sandbox cannot be set up, a command on the local node is refused with the reason and
/// never runs unconfined: `ORC_BWRAP` names a `bwrap` that is missing, then one that cannot
/// confine anything (`false`). A file resource beside it deploys as usual.
#[test]
fn commands_are_refused_where_the_sandbox_cannot_be_set_up() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let intent = dir.path().join("intent.json");
    let escaped = dir.path().join("escaped");
    std::fs::write(
        &intent,
        serde_json::json!({ "resources": [
            { "id": "command[local,escape]", "adaptor": "command@0.1.0",
              "attributes": { "argv": ["touch", escaped], "creates": escaped } },
            { "id": "file[local,/a]", "adaptor": "file@0.1.0", "attributes": { "content": "a" } }
        ]})
        .to_string(),
    )
    .unwrap();
    for (bwrap, reason) in [
        ("/nonexistent/bwrap", "bubblewrap, which is not installed"),
        (
            "/bin/false",
            "commands on the local node cannot be confined: a trial command failed",
        ),
    ] {
        let mut c = Command::new(bin("orc-host"));
        c.arg("deploy").arg(&intent).arg("--data-dir").arg(&data).env("ORC_BWRAP", bwrap);
        let out = run(&mut c, false);
        assert!(!out.status.success(), "{bwrap}: {}", stdout(&out));
        let text = stdout(&out);
        assert!(text.contains(reason), "{bwrap}: {text}{}", stderr(&out));
        assert!(text.contains("1 failed"), "{bwrap}: {text}");
        assert!(!escaped.exists(), "{bwrap}: the command ran unconfined");
    }
    assert_eq!(std::fs::read_to_string(data.join("nodes/local/a")).unwrap(), "a");
}
