//! One process per data directory: a second `orc-host serve` (or an `orc-host deploy`) on the
//! directory of a running server is refused at once, naming that process; once it is gone — even killed with SIGKILL, leaving
//! its lock file behind — the directory serves again.

// Test support: a failed unwrap is the test failing, where it failed.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use orc_tests::bin;
use orc_tests::server::Served;

fn serve(data_dir: &Path) -> Command {
    let mut command = Command::new(bin("orc-host"));
    command.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"]).arg(data_dir);
    command
}

#[test]
fn a_second_server_on_a_data_directory_is_refused_naming_the_first() {
    let first = Served::start("", &[]);
    let data_dir = first.data_dir();

    let out = serve(&data_dir).stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the second server started:\n{stderr}");
    assert!(
        stderr.contains(&format!("is in use by another orc-host (process {})", first.pid())),
        "the refusal names the first process:\n{stderr}"
    );
    assert!(stderr.contains(&data_dir.display().to_string()), "and the directory:\n{stderr}");
    // So is an embedded deploy, which would write to the same local node.
    let out = Command::new(bin("orc-host"))
        .arg("deploy")
        .arg(orc_tests::repo_root().join("host/intents/quickstart.json"))
        .arg("--data-dir")
        .arg(&data_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the deploy ran:\n{stderr}");
    assert!(
        stderr.contains(&format!("is in use by another orc-host (process {})", first.pid())),
        "{stderr}"
    );

    // Killed outright, the first leaves its lock file; the kernel has dropped the lock.
    let _dir = first.kill();
    assert!(data_dir.join("orc-host.pid").exists());
    let mut again = serve(&data_dir).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut lines = BufReader::new(again.stdout.take().unwrap()).lines();
    let line = lines.next().expect("the server printed its address").unwrap();
    assert!(line.starts_with("listening on http://"), "{line}");
    let _ = again.kill();
    let _ = again.wait();
}
