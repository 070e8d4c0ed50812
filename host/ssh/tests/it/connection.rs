//! Host keys, authentication, an unreachable node, reconnecting.

use orc_node::{NodeBackend, NodeCommand, NodeErrorKind};
use orc_ssh::{Credential, HostKeyPolicy, SshError, SshNode};

use crate::{options, target};
use orc_tests::sshd::{Sshd, TEST_PASSWORD, TEST_USER};

fn echo(text: &str) -> NodeCommand {
    NodeCommand {
        argv: vec!["echo".into(), text.into()],
        ..Default::default()
    }
}

#[tokio::test]
async fn host_keys_trust_on_first_use_pinned_and_changed() {
    let mut sshd = Sshd::start();
    let (tofu, verified) = SshNode::connect(target(&sshd, TEST_USER, HostKeyPolicy::TrustOnFirstUse), options())
        .await
        .unwrap();
    assert_eq!(verified.fingerprint, sshd.host_fingerprint);
    assert!(verified.fingerprint.starts_with("SHA256:"));
    assert_eq!(tofu.host_key(), sshd.host_fingerprint);
    let (_pinned, again) = SshNode::connect(
        target(&sshd, TEST_USER, HostKeyPolicy::Pinned(verified.fingerprint.clone())),
        options(),
    )
    .await
    .unwrap();
    assert_eq!(again, verified);

    let old = sshd.host_fingerprint.clone();
    sshd.replace_host_key();
    let err = SshNode::connect(target(&sshd, TEST_USER, HostKeyPolicy::Pinned(old.clone())), options())
        .await
        .unwrap_err();
    match &err {
        SshError::HostKeyChanged { expected, presented, .. } => {
            assert_eq!(expected, &old);
            assert_eq!(presented, &sshd.host_fingerprint);
        }
        other => panic!("expected HostKeyChanged, got {other:?}"),
    }
    assert!(err.to_string().contains("HOST KEY CHANGED"), "{err}");
    // The node connected first under trust-on-first-use refuses the new key on reconnect, loudly.
    let err = tofu.run(echo("hi")).await.unwrap_err();
    assert_eq!(err.kind, NodeErrorKind::Denied, "{err}");
    assert!(
        err.message.contains("HOST KEY CHANGED") && err.message.contains(&sshd.host_fingerprint),
        "{err}"
    );
}

#[tokio::test]
async fn wrong_credentials_are_auth_errors_that_never_show_the_secret() {
    let sshd = Sshd::start();
    let mut password = target(&sshd, TEST_USER, HostKeyPolicy::TrustOnFirstUse);
    password.credential = Credential::Password(TEST_PASSWORD.into());
    let (node, _) = SshNode::connect(password.clone(), options()).await.unwrap();
    let out = node
        .run(NodeCommand {
            argv: vec!["id".into(), "-un".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{TEST_USER}\n"));

    let secret = "Wr0ng-pa55word-$ecret";
    password.credential = Credential::Password(secret.into());
    let err = SshNode::connect(password.clone(), options()).await.unwrap_err();
    assert!(matches!(err, SshError::Auth { .. }), "{err:?}");
    let text = format!("{err} {err:?} {password:?}");
    let text = format!("{text} {:?}", orc_node::NodeError::from(err));
    assert!(
        text.contains(TEST_USER) && text.contains(&format!("127.0.0.1:{}", sshd.port)),
        "{text}"
    );
    assert!(!text.contains(secret), "{text}");

    let other = russh::keys::PrivateKey::random(&mut russh::keys::key::safe_rng(), russh::keys::Algorithm::Ed25519).unwrap();
    let pem = other.to_openssh(russh::keys::ssh_key::LineEnding::LF).unwrap().to_string();
    let mut wrong_key = target(&sshd, TEST_USER, HostKeyPolicy::TrustOnFirstUse);
    wrong_key.credential = Credential::PrivateKey {
        pem: pem.clone(),
        passphrase: Some("unused".into()),
    };
    let err = SshNode::connect(wrong_key.clone(), options()).await.unwrap_err();
    let text = format!("{err} {err:?} {wrong_key:?}");
    assert!(matches!(err, SshError::Auth { .. }), "{err:?}");
    let key_body = pem.lines().nth(1).unwrap();
    assert!(!text.contains(key_body) && !text.contains("unused"), "{text}");

    wrong_key.credential = Credential::PrivateKey {
        pem: "not a key".into(),
        passphrase: None,
    };
    let err = SshNode::connect(wrong_key, options()).await.unwrap_err();
    assert!(matches!(err, SshError::Key { .. }), "{err:?}");
}

#[tokio::test]
async fn an_unreachable_node_is_unavailable_and_reconnects_after_restart() {
    let mut sshd = Sshd::start();
    let scratch = sshd.scratch_dir("reconnect");
    let node = crate::connect(&sshd).await;
    assert_eq!(node.run(echo("before")).await.unwrap().stdout, b"before\n");
    let file = crate::path(&scratch, "f");
    node.write_file(&file, b"x".to_vec(), None).await.unwrap();

    sshd.stop();
    let err = node.run(echo("down")).await.unwrap_err();
    assert_eq!(err.kind, NodeErrorKind::Unavailable, "{err}");
    assert!(err.message.contains(&format!("127.0.0.1:{}", sshd.port)), "{err}");
    let err = node.stat(&file).await.unwrap_err();
    assert_eq!(err.kind, NodeErrorKind::Unavailable, "{err}");
    let err = node.read_file(&file).await.unwrap_err();
    assert_eq!(err.kind, NodeErrorKind::Unavailable, "{err}");
    // Many calls at once while the node is down all fail, sharing connect attempts.
    let all = futures::future::join_all((0..20).map(|_| node.run(echo("down")))).await;
    assert!(all.iter().all(|r| r.as_ref().is_err_and(|e| e.kind == NodeErrorKind::Unavailable)));

    sshd.start_again();
    assert_eq!(node.run(echo("after")).await.unwrap().stdout, b"after\n");
    assert_eq!(node.read_file(&file).await.unwrap().unwrap(), b"x");
    assert_eq!(node.connections_made(), 2);

    // Lost again with no call in between: the next file operation reconnects by itself.
    sshd.stop();
    sshd.start_again();
    assert!(node.stat(&file).await.unwrap().is_some());
    assert_eq!(node.connections_made(), 3);
}

/// A connection that goes silent (its sshd processes stopped, as on a lost network) is found dead
/// by keepalives, and the call waiting on it goes on over a new connection.
#[tokio::test]
async fn keepalives_detect_a_silent_connection_and_the_call_reconnects() {
    let sshd = Sshd::start();
    let scratch = sshd.scratch_dir("keepalive");
    let options = orc_ssh::SshOptions {
        keepalive_interval: Some(std::time::Duration::from_millis(300)),
        keepalive_max: 2,
        ..options()
    };
    let (node, _) = SshNode::connect(
        target(&sshd, TEST_USER, HostKeyPolicy::Pinned(sshd.host_fingerprint.clone())),
        options,
    )
    .await
    .unwrap();
    let file = crate::path(&scratch, "f");
    node.write_file(&file, b"x".to_vec(), None).await.unwrap();
    let frozen = sshd.freeze_connections();
    assert!(!frozen.is_empty());
    let started = std::time::Instant::now();
    let stat = node.stat(&file).await;
    let elapsed = started.elapsed();
    sshd.kill_frozen(&frozen);
    assert!(stat.unwrap().is_some());
    assert_eq!(node.connections_made(), 2);
    assert!(elapsed < std::time::Duration::from_secs(5), "took {elapsed:?}");
    assert_eq!(node.run(echo("alive")).await.unwrap().stdout, b"alive\n");
}

#[test]
fn credentials_are_redacted_in_debug_output() {
    let c = Credential::PrivateKey {
        pem: "-----BEGIN OPENSSH PRIVATE KEY-----\nSECRETBODY".into(),
        passphrase: Some("pp-secret".into()),
    };
    let text = format!("{c:?} {:?}", Credential::Password("pw-secret".into()));
    assert!(
        !text.contains("SECRETBODY") && !text.contains("pp-secret") && !text.contains("pw-secret"),
        "{text}"
    );
    assert!(text.contains("redacted"), "{text}");
}
