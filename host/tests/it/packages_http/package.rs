//! `package` over a real SSH node: two versions of a package built here (`dpkg-deb`), served by
//! a local apt repository (`dpkg-scanpackages`, a `[trusted=yes]` file source) that the adaptor
//! reaches through its `apt_options`, with package lists and caches kept in a temporary
//! directory so the machine's own apt state is left alone. The package is purged at the start
//! and at the end, even when the test fails.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use orc_host::executor::{ActionReport, Outcome};
use orc_host::scheduler::{self, ResourceStatus as Status, Trigger};
use orc_node::Nodes;
use orc_runtime::CallContext;

use serde_json::{Value, json};

use super::{Harness, self_healing, until};
use orc_tests::sshd::Sshd;

const PACKAGE: &str = "orc-test-hello";
const ID: &str = "package[web1,orc-test-hello]";
const MISSING: &str = "package[web1,orc-test-missing]";

fn run(program: &str, args: &[&str], dir: &Path) -> String {
    let out = Command::new(program).args(args).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Purges the test package now and when dropped.
struct Purge;

impl Purge {
    fn now() -> Purge {
        purge();
        Purge
    }
}

impl Drop for Purge {
    fn drop(&mut self) {
        purge();
    }
}

fn purge() {
    let _ = Command::new("dpkg").args(["--purge", PACKAGE]).output();
}

/// The installed version of the test package on this machine, as dpkg says.
fn installed() -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f", "${Status}\t${Version}", PACKAGE])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (status, version) = text.split_once('\t')?;
    status.ends_with(" installed").then(|| version.to_string())
}

/// Versions 1.0 and 2.0 of the test package in a local repository; the apt options that use
/// only that repository, with lists and caches inside `dir`.
fn repository(dir: &Path) -> Vec<String> {
    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    for version in ["1.0", "2.0"] {
        let root = dir.join(format!("build-{version}"));
        std::fs::create_dir_all(root.join("DEBIAN")).unwrap();
        std::fs::create_dir_all(root.join("usr/share/orc-test-hello")).unwrap();
        std::fs::write(
            root.join("DEBIAN/control"),
            format!(
                "Package: {PACKAGE}\nVersion: {version}\nArchitecture: all\nMaintainer: orc tests <orc@localhost>\n\
                 Description: a package for orc's tests\n"
            ),
        )
        .unwrap();
        std::fs::write(root.join("usr/share/orc-test-hello/version"), format!("{version}\n")).unwrap();
        let deb = repo.join(format!("{PACKAGE}_{version}_all.deb"));
        run(
            "dpkg-deb",
            &["--root-owner-group", "--build", root.to_str().unwrap(), deb.to_str().unwrap()],
            dir,
        );
    }
    let packages = run("dpkg-scanpackages", &["--multiversion", ".", "/dev/null"], &repo);
    std::fs::write(repo.join("Packages"), packages).unwrap();
    let sources = dir.join("sources.list");
    std::fs::write(&sources, format!("deb [trusted=yes] file:{} ./\n", repo.display())).unwrap();
    for sub in ["lists/partial", "cache/archives/partial"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    let d = dir.display();
    vec![
        format!("Dir::Etc::SourceList={}", sources.display()),
        "Dir::Etc::SourceParts=-".to_string(),
        format!("Dir::State::Lists={d}/lists"),
        format!("Dir::Cache={d}/cache"),
        // The file source is read as root, not by apt's unprivileged sandbox user.
        "APT::Sandbox::User=root".to_string(),
    ]
}

fn resource(id: &str, mut attributes: Value, options: &[String]) -> Value {
    attributes["apt_options"] = json!(options);
    json!({ "id": id, "adaptor": "package@0.1.0", "attributes": attributes })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_package_converges_over_ssh_pins_repairs_and_is_removed() {
    let _purge = Purge::now();
    let dir = tempfile::tempdir().unwrap();
    let options = repository(dir.path());
    let sshd = Sshd::start();
    let node = crate::support::ssh_node::connect_as_root(&sshd).await;
    let nodes = Nodes::default();
    nodes.insert("web1", Arc::new(node));
    let h = Harness::new(CallContext {
        nodes: Arc::new(nodes),
        deadline: Some(Duration::from_secs(300)),
        ..CallContext::new("test")
    });
    let s = h.scheduler(self_healing(Duration::from_millis(500)));
    let r = |attributes: Value| resource(ID, attributes, &options);
    let change = |report: &ActionReport, i: usize| {
        let c = &report.changes[i];
        (c.field.clone(), c.current.clone(), c.desired.clone())
    };

    // Unpinned: the candidate (2.0) is installed, after the adaptor refreshed the lists it had
    // never read. A package the sources lack fails as invalid input, naming it.
    s.release(h.version(1, json!([r(json!({})), resource(MISSING, json!({}), &options)])))
        .unwrap();
    let snap = s.settled().await.unwrap();
    assert_eq!(installed().as_deref(), Some("2.0"));
    let report = h.recorder.last_deploy(ID);
    assert_eq!(report.outcome, Outcome::Changed, "{report:?}");
    assert_eq!(report.changes.len(), 1, "{:?}", report.changes);
    assert_eq!(change(&report, 0), ("state".into(), None, Some(json!("present"))));
    assert!(
        report.messages.iter().any(|m| m == "installed orc-test-hello 2.0"),
        "{:?}",
        report.messages
    );
    let error = h.recorder.last_deploy(MISSING).error.expect("the missing package fails");
    assert!(
        error.message.contains("InvalidInput")
            && error
                .message
                .contains("package orc-test-missing is not available from the sources of node web1"),
        "{error:?}"
    );
    assert_eq!((snap.count(Status::Deployed), snap.count(Status::Failed)), (1, 1), "{snap:?}");

    // A second pass (a user repair, then self-healing) changes nothing.
    s.repair().unwrap();
    until(&s, "repair passes", || {
        h.recorder.count(ID, Trigger::Repair, Outcome::Unchanged) >= 2
    })
    .await;
    assert_eq!(h.recorder.count(ID, Trigger::Repair, Outcome::Changed), 0);
    assert_eq!(installed().as_deref(), Some("2.0"));

    // Pinned to the older version: a downgrade, shown as a version change.
    s.release(h.version(2, json!([r(json!({"version": "1.0"}))]))).unwrap();
    s.settled().await.unwrap();
    let report = h.recorder.last_deploy(ID);
    assert_eq!(report.outcome, Outcome::Changed, "{report:?}");
    assert_eq!(change(&report, 0), ("version".into(), Some(json!("2.0")), Some(json!("1.0"))));
    assert!(
        report.messages.iter().any(|m| m == "changed orc-test-hello from 2.0 to 1.0"),
        "{:?}",
        report.messages
    );
    assert_eq!(installed().as_deref(), Some("1.0"));

    // A version the sources lack: invalid input naming it; nothing changes on the node.
    s.release(h.version(3, json!([r(json!({"version": "9.9"}))]))).unwrap();
    s.settled().await.unwrap();
    let error = h.recorder.last_deploy(ID).error.expect("a missing version fails");
    assert!(
        error.message.contains("InvalidInput") && error.message.contains("version 9.9 of package orc-test-hello is not available"),
        "{error:?}"
    );
    assert_eq!(installed().as_deref(), Some("1.0"));

    // Back to 1.0 (nothing to do); then drift, removed by hand while the environment is halted:
    // a dryrun shows it, and self-healing repairs it once the environment resumes.
    let pinned = h.version(4, json!([r(json!({"version": "1.0", "purge_config": false}))]));
    s.release(pinned.clone()).unwrap();
    s.settled().await.unwrap();
    assert_eq!(h.recorder.last_deploy(ID).outcome, Outcome::Unchanged);
    s.set_halted(true).unwrap();
    s.settled().await.unwrap();
    let repaired_before = h.recorder.count(ID, Trigger::Repair, Outcome::Changed);
    run("dpkg", &["-r", PACKAGE], dir.path());
    assert_eq!(installed(), None);
    let dry = scheduler::dryrun(&pinned, &h.ctx, 1).await;
    assert_eq!(dry[0].outcome, Outcome::WouldChange, "{:?}", dry[0]);
    assert_eq!(
        (change(&dry[0], 0), change(&dry[0], 1)),
        (
            ("state".into(), None, Some(json!("present"))),
            ("version".into(), None, Some(json!("1.0")))
        )
    );
    assert_eq!(installed(), None, "a dryrun changes nothing");
    s.set_halted(false).unwrap();
    until(&s, "self-healing reinstalls 1.0", || installed().as_deref() == Some("1.0")).await;
    assert_eq!(h.recorder.count(ID, Trigger::Repair, Outcome::Changed), repaired_before + 1);

    // `absent` removes it; present again installs it; purge removes it.
    s.release(h.version(5, json!([r(json!({"state": "absent"}))]))).unwrap();
    s.settled().await.unwrap();
    let report = h.recorder.last_deploy(ID);
    assert_eq!(report.outcome, Outcome::Changed, "{report:?}");
    assert_eq!(change(&report, 0), ("state".into(), Some(json!("present")), Some(json!("absent"))));
    assert_eq!(installed(), None);
    s.release(h.version(6, json!([r(json!({"version": "2.0"}))]))).unwrap();
    s.settled().await.unwrap();
    assert_eq!(installed().as_deref(), Some("2.0"));
    let mut purged = r(json!({"version": "2.0"}));
    purged["purged"] = json!(true);
    s.release(h.version(7, json!([purged]))).unwrap();
    s.settled().await.unwrap();
    let report = h.recorder.last_deploy(ID);
    assert_eq!(report.outcome, Outcome::Changed, "{report:?}");
    assert!(
        report.messages.iter().any(|m| m == "removed orc-test-hello"),
        "{:?}",
        report.messages
    );
    assert_eq!(installed(), None);
}
