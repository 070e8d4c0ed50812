//! Cases for cluster templates and clusters; `main.rs` runs each on both backends.

use std::collections::BTreeSet;

use anyhow::{Result, ensure};
use orc_host::policy::settings::EnvironmentSettings;
use orc_host::store::{ClusterRecord, ConnectionRecord, EnvironmentId, Store, StoreError, now_ms};

use super::harness::TestDb;

async fn new_env(store: &Store, name: &str) -> Result<EnvironmentId> {
    Ok(store.create_environment(name, &EnvironmentSettings::default()).await?.id)
}

fn cluster(name: &str, template: &str, template_version: i64, lease_expires_at: Option<i64>) -> ClusterRecord {
    ClusterRecord {
        name: name.to_string(),
        template: template.to_string(),
        template_version,
        status: "pending".to_string(),
        document: format!(r#"{{"cluster":"{name}"}}"#),
        lease_expires_at,
        revision: 1,
        created_at: 1_000,
        updated_at: 1_000,
    }
}

fn not_found(err: StoreError, expected: &[&str]) -> Result<()> {
    ensure!(matches!(err, StoreError::NotFound { .. }), "expected NotFound, got {err:?}");
    let message = err.to_string();
    for part in expected {
        ensure!(message.contains(part), "`{message}` does not name {part}");
    }
    Ok(())
}

fn conflict(err: StoreError, expected: &str) -> Result<()> {
    ensure!(matches!(err, StoreError::Conflict { .. }), "expected Conflict, got {err:?}");
    ensure!(err.to_string() == expected, "`{err}`, expected `{expected}`");
    Ok(())
}

pub async fn template_versions_per_name_and_environment(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = new_env(store, "prod").await?;
    let other = new_env(store, "staging").await?;
    for n in 1..=3 {
        let t = store.insert_template(&env, "web", &format!(r#"{{"v":{n}}}"#)).await?;
        assert_eq!((t.name.as_str(), t.version), ("web", n));
        assert_eq!(t.document, format!(r#"{{"v":{n}}}"#));
    }
    assert_eq!(store.insert_template(&env, "db", "{}").await?.version, 1, "versions are per name");
    assert_eq!(
        store.insert_template(&other, "web", "{}").await?.version,
        1,
        "versions are per environment"
    );

    let latest = store.get_template(&env, "web", None).await?;
    assert_eq!((latest.version, latest.document.as_str()), (3, r#"{"v":3}"#));
    assert_eq!(store.get_template(&env, "web", Some(2)).await?.document, r#"{"v":2}"#);
    assert_eq!(store.get_template(&env, "web", Some(3)).await?, latest);

    not_found(
        store.get_template(&env, "web", Some(4)).await.unwrap_err(),
        &["version 4", "`web`", &env.to_string()],
    )?;
    not_found(
        store.get_template(&env, "nope", None).await.unwrap_err(),
        &["`nope`", &env.to_string()],
    )?;
    not_found(
        store.get_template(&other, "db", None).await.unwrap_err(),
        &["`db`", &other.to_string()],
    )?;

    // The latest of each name, by name.
    let listed: Vec<(String, i64)> = store.list_templates(&env).await?.into_iter().map(|t| (t.name, t.version)).collect();
    assert_eq!(listed, [("db".to_string(), 1), ("web".to_string(), 3)]);
    assert_eq!(store.list_templates(&other).await?.len(), 1);
    assert!(store.list_templates(&new_env(store, "empty").await?).await?.is_empty());

    let versions: Vec<i64> = store.list_template_versions(&env, "web").await?.iter().map(|t| t.version).collect();
    assert_eq!(versions, [3, 2, 1], "newest first");
    not_found(store.list_template_versions(&env, "nope").await.unwrap_err(), &["`nope`"])?;

    let unknown = EnvironmentId::random();
    not_found(
        store.insert_template(&unknown, "web", "{}").await.unwrap_err(),
        &[&unknown.to_string()],
    )?;
    Ok(())
}

pub async fn concurrent_template_inserts_get_distinct_versions(db: &TestDb) -> Result<()> {
    let store = db.store.clone();
    let env = new_env(&store, "prod").await?;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..24 {
        let store = store.clone();
        tasks.spawn(async move { store.insert_template(&env, "web", &format!(r#"{{"n":{i}}}"#)).await });
    }
    let mut versions = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let t = done??;
        // Each document went with the number it was given.
        assert_eq!(store.get_template(&env, "web", Some(t.version)).await?.document, t.document);
        versions.push(t.version);
    }
    versions.sort();
    assert_eq!(versions, (1..=24).collect::<Vec<i64>>());
    let documents: BTreeSet<String> = store
        .list_template_versions(&env, "web")
        .await?
        .into_iter()
        .map(|t| t.document)
        .collect();
    assert_eq!(documents.len(), 24);
    Ok(())
}

pub async fn template_in_use_cannot_be_deleted(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = new_env(store, "prod").await?;
    let other = new_env(store, "staging").await?;
    store.insert_template(&env, "web", "{}").await?;
    store.insert_template(&env, "web", "{}").await?;
    store.insert_template(&other, "web", "{}").await?;
    // Version 1 is in use, not the latest: every version goes or none does.
    store.insert_cluster(&env, &cluster("shop", "web", 1, None)).await?;
    conflict(
        store.delete_template(&env, "web").await.unwrap_err(),
        "template `web` is used by cluster `shop`",
    )?;
    assert_eq!(store.list_template_versions(&env, "web").await?.len(), 2);

    // A template of the same name elsewhere is not in use.
    store.delete_template(&other, "web").await?;
    not_found(store.get_template(&other, "web", None).await.unwrap_err(), &["`web`"])?;

    store.delete_cluster(&env, "shop", 1).await?;
    store.delete_template(&env, "web").await?;
    not_found(store.list_template_versions(&env, "web").await.unwrap_err(), &["`web`"])?;
    not_found(store.delete_template(&env, "web").await.unwrap_err(), &["`web`", &env.to_string()])?;
    // Numbers start again.
    assert_eq!(store.insert_template(&env, "web", "{}").await?.version, 1);
    Ok(())
}

pub async fn clusters_crud(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = new_env(store, "prod").await?;
    let other = new_env(store, "staging").await?;
    store.insert_template(&env, "web", "{}").await?;
    store.insert_template(&env, "web", "{}").await?;
    store.insert_template(&other, "web", "{}").await?;

    let shop = cluster("shop", "web", 1, Some(5_000));
    store.insert_cluster(&env, &shop).await?;
    store.insert_cluster(&env, &cluster("blog", "web", 2, None)).await?;
    store.insert_cluster(&other, &cluster("shop", "web", 1, None)).await?;
    assert_eq!(store.get_cluster(&env, "shop").await?, shop);
    assert_eq!(store.find_cluster(&env, "shop").await?, Some(shop.clone()));
    assert_eq!(store.find_cluster(&env, "nope").await?, None);
    not_found(
        store.get_cluster(&env, "nope").await.unwrap_err(),
        &["cluster `nope`", &env.to_string()],
    )?;

    conflict(
        store.insert_cluster(&env, &cluster("shop", "web", 2, None)).await.unwrap_err(),
        &format!("a cluster named `shop` already exists in environment {env}"),
    )?;
    let unknown = EnvironmentId::random();
    not_found(
        store.insert_cluster(&unknown, &shop).await.unwrap_err(),
        &["environment", &unknown.to_string()],
    )?;
    not_found(
        store.insert_cluster(&env, &cluster("x", "web", 9, None)).await.unwrap_err(),
        &["version 9 of template `web`"],
    )?;
    not_found(
        store.insert_cluster(&env, &cluster("x", "nope", 1, None)).await.unwrap_err(),
        &["template `nope`"],
    )?;

    let names: Vec<String> = store.list_clusters(&env).await?.into_iter().map(|c| c.name).collect();
    assert_eq!(names, ["blog", "shop"]);
    assert!(
        store.list_clusters(&env).await?.iter().all(|c| c.revision == 1),
        "inserted at revision 1"
    );
    assert_eq!(store.list_clusters(&other).await?.len(), 1);

    let before = now_ms();
    let changed = ClusterRecord {
        template_version: 2,
        status: "active".to_string(),
        document: r#"{"layout":[]}"#.to_string(),
        lease_expires_at: None,
        created_at: 7,
        updated_at: 7,
        ..shop.clone()
    };
    let stored = store.update_cluster(&env, &changed).await?;
    assert_eq!(stored.revision, 2, "an update is one revision more");
    assert_eq!((stored.status.as_str(), stored.template_version), ("active", 2));
    assert_eq!((stored.document.as_str(), stored.lease_expires_at), (r#"{"layout":[]}"#, None));
    assert_eq!(stored.created_at, shop.created_at, "created_at is kept");
    assert!(stored.updated_at >= before, "updated_at is now");
    assert_eq!(store.get_cluster(&env, "shop").await?, stored);
    assert_eq!(
        store.get_cluster(&other, "shop").await?.status,
        "pending",
        "the other environment's is untouched"
    );

    not_found(
        store.update_cluster(&env, &cluster("nope", "web", 1, None)).await.unwrap_err(),
        &["cluster `nope`"],
    )?;
    not_found(
        store
            .update_cluster(
                &env,
                &ClusterRecord {
                    template_version: 3,
                    ..stored.clone()
                },
            )
            .await
            .unwrap_err(),
        &["version 3 of template `web`"],
    )?;
    // A writer that read revision 1 lost to the update above: refused, naming both revisions.
    conflict(
        store.update_cluster(&env, &changed).await.unwrap_err(),
        "cluster `shop` is at revision 2, not 1",
    )?;
    conflict(
        store.delete_cluster(&env, "shop", 1).await.unwrap_err(),
        "cluster `shop` is at revision 2, not 1",
    )?;
    assert_eq!(store.get_cluster(&env, "shop").await?, stored, "a refused update changes nothing");
    // An insert always starts at revision 1, whatever the record says.
    store
        .insert_cluster(
            &env,
            &ClusterRecord {
                revision: 9,
                ..cluster("new", "web", 1, None)
            },
        )
        .await?;
    assert_eq!(store.get_cluster(&env, "new").await?.revision, 1);

    store.delete_cluster(&env, "shop", 2).await?;
    assert_eq!(store.find_cluster(&env, "shop").await?, None);
    not_found(
        store.delete_cluster(&env, "shop", 2).await.unwrap_err(),
        &["cluster `shop`", &env.to_string()],
    )?;
    assert_eq!(store.list_clusters(&other).await?.len(), 1);
    Ok(())
}

pub async fn expired_cluster_leases(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = new_env(store, "prod").await?;
    let other = new_env(store, "staging").await?;
    for e in [env, other] {
        store.insert_template(&e, "web", "{}").await?;
    }
    store.insert_cluster(&env, &cluster("late", "web", 1, Some(300))).await?;
    store.insert_cluster(&env, &cluster("early", "web", 1, Some(100))).await?;
    store.insert_cluster(&env, &cluster("forever", "web", 1, None)).await?;
    store.insert_cluster(&env, &cluster("future", "web", 1, Some(1_000))).await?;
    store.insert_cluster(&other, &cluster("mid", "web", 1, Some(200))).await?;

    let expired: Vec<(EnvironmentId, String)> = store.expired_clusters(500).await?.into_iter().map(|(e, c)| (e, c.name)).collect();
    assert_eq!(
        expired,
        [(env, "early".to_string()), (other, "mid".to_string()), (env, "late".to_string())],
        "every environment, soonest ended first"
    );
    // Strictly before `now`.
    assert_eq!(store.expired_clusters(100).await?.len(), 0);
    assert_eq!(store.expired_clusters(101).await?.len(), 1);

    // A renewed lease is no longer expired.
    let renewed = ClusterRecord {
        lease_expires_at: Some(10_000),
        ..store.get_cluster(&env, "early").await?
    };
    store.update_cluster(&env, &renewed).await?;
    let names: Vec<String> = store.expired_clusters(500).await?.into_iter().map(|(_, c)| c.name).collect();
    assert_eq!(names, ["mid", "late"]);
    Ok(())
}

pub async fn deleting_an_environment_removes_its_clusters(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = new_env(store, "prod").await?;
    let keep = new_env(store, "keep").await?;
    for e in [env, keep] {
        store.insert_template(&e, "web", "{}").await?;
        store.insert_template(&e, "db", "{}").await?;
        store.insert_cluster(&e, &cluster("shop", "web", 1, Some(1))).await?;
    }
    // Both tables go in one statement, though clusters reference templates.
    store.delete_environment(&env).await?;
    assert!(store.list_templates(&env).await?.is_empty());
    assert!(store.list_clusters(&env).await?.is_empty());
    assert_eq!(store.list_templates(&keep).await?.len(), 2);
    assert_eq!(store.list_clusters(&keep).await?.len(), 1);
    let expired: Vec<EnvironmentId> = store.expired_clusters(now_ms()).await?.into_iter().map(|(e, _)| e).collect();
    assert_eq!(expired, [keep]);
    Ok(())
}

/// Processes: revision 1 when inserted, one more per update; an update or delete naming another
/// revision is refused naming the current one, so of two writers that read the same row only
/// one writes; rows are per environment and go with it.
pub async fn processes_are_revision_checked(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = new_env(store, "prod").await?;
    let other = new_env(store, "staging").await?;
    let p = store.insert_process(&env, "cache", "creating", "{}").await?;
    ensure!(p.revision == 1, "{p:?}");
    store.insert_process(&other, "cache", "creating", "{}").await?;
    conflict(
        store.insert_process(&env, "cache", "creating", "{}").await.unwrap_err(),
        &format!("a process named `cache` already exists in environment {env}"),
    )?;
    let updated = store.update_process(&env, "cache", 1, "running", r#"{"n":1}"#).await?;
    ensure!(
        updated.revision == 2 && updated.state == "running" && updated.created_at == p.created_at,
        "{updated:?}"
    );
    // A second writer that read revision 1 loses.
    conflict(
        store.update_process(&env, "cache", 1, "updating", "{}").await.unwrap_err(),
        "process `cache` is at revision 2, not 1",
    )?;
    conflict(
        store.delete_process(&env, "cache", 1).await.unwrap_err(),
        "process `cache` is at revision 2, not 1",
    )?;
    let listed = store.list_processes(&env).await?;
    ensure!(
        listed.len() == 1 && listed[0].document == r#"{"n":1}"# && listed[0].revision == 2,
        "{listed:?}"
    );
    ensure!(store.find_process(&env, "cache").await?.is_some_and(|r| r.document == r#"{"n":1}"#));
    ensure!(store.find_process(&env, "ca\0che").await?.is_none());
    store.delete_process(&env, "cache", 2).await?;
    not_found(store.delete_process(&env, "cache", 2).await.unwrap_err(), &["process `cache`"])?;
    not_found(
        store.update_process(&env, "cache", 2, "x", "{}").await.unwrap_err(),
        &["process `cache`"],
    )?;
    ensure!(store.list_processes(&other).await?.len() == 1);
    store.delete_environment(&other).await?;
    ensure!(store.list_processes(&other).await?.is_empty());
    Ok(())
}

/// An environment's connections, oldest first; nothing of another environment; gone with their
/// delete.
pub async fn connections_are_listed_oldest_first(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = new_env(store, "prod").await?;
    let other = new_env(store, "staging").await?;
    let link = |id: &str, from: &str, to: &str, at: i64| ConnectionRecord {
        id: id.to_string(),
        from_process: from.to_string(),
        from_interface: "store".to_string(),
        to_process: to.to_string(),
        to_interface: "kv".to_string(),
        version: "1.0.0".to_string(),
        interface_id: "sha256:00".to_string(),
        created_by: None,
        created_at: at,
    };
    store.insert_connection(&env, &link("c1", "app", "cache", 1)).await?;
    store.insert_connection(&env, &link("c2", "web", "app", 2)).await?;
    store.insert_connection(&env, &link("c3", "web", "cache", 3)).await?;
    store.insert_connection(&other, &link("c4", "app", "cache", 4)).await?;
    let ids = |v: Vec<ConnectionRecord>| v.into_iter().map(|c| c.id).collect::<Vec<_>>();
    ensure!(ids(store.list_connections(&env).await?) == ["c1", "c2", "c3"]);
    ensure!(ids(store.list_connections(&other).await?) == ["c4"]);
    ensure!(store.delete_connection(&env, "c1").await?.is_some_and(|c| c.from_process == "app"));
    ensure!(store.delete_connection(&env, "c1").await?.is_none());
    ensure!(ids(store.list_connections(&env).await?) == ["c2", "c3"]);
    Ok(())
}
