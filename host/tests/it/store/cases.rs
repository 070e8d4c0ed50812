//! The test cases, each a function of a fresh database; `main.rs` runs each on both backends.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, ensure};
use orc_host::policy::settings::EnvironmentSettings;
use orc_host::scheduler::{ErrorInfo, ResourceStatus};
use orc_host::store::{
    ActionFilter, ActionId, ActionKind, ActionRecord, Attempts, Backend, DbKv, DryrunId, DryrunStatus, EnvironmentId, OperationKind,
    OperationStatus, Progress, ResourceState, StateFilter, StatusChange, Store, StoreError, hash_token, now_ms,
};
use orc_runtime::capability::kv::{KvError, KvQuota, KvStore, KvUsage, delete_counted, set_within};

use super::harness::TestDb;

fn state(i: usize, status: ResourceStatus, version: i64) -> ResourceState {
    let node = format!("web{}", i % 3);
    let (resource_type, key) = if i.is_multiple_of(2) {
        ("file", format!("/etc/app/{i:05}.conf"))
    } else {
        ("directory", format!("/srv/app/{i:05}"))
    };
    ResourceState {
        resource_id: format!("{resource_type}[{node},{key}]"),
        resource_type: resource_type.to_string(),
        node,
        desired_hash: format!("sha256:{i:064x}"),
        deployed_hash: None,
        status,
        version,
        last_deploy_at: None,
        last_verified_at: None,
        attempts: 0,
        last_error: None,
        next_retry_at: None,
    }
}

fn action(env: EnvironmentId, resource_id: &str, kind: ActionKind, started_at: i64) -> ActionRecord {
    ActionRecord {
        id: ActionId::new(),
        environment: env,
        resource_id: resource_id.to_string(),
        kind,
        version: Some(1),
        started_at,
        finished_at: started_at + 3,
        outcome: "changed".to_string(),
        changes: r#"[{"field":"content","current":"a","desired":"b"}]"#.to_string(),
        messages: r#"["wrote 12 bytes"]"#.to_string(),
        error: None,
    }
}

async fn new_env(store: &Store, name: &str) -> Result<EnvironmentId> {
    Ok(store.create_environment(name, &EnvironmentSettings::default()).await?.id)
}

pub async fn environments_crud(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let settings = EnvironmentSettings {
        repair_interval_s: 30,
        auto_deploy: false,
        ..EnvironmentSettings::default()
    };
    let prod = store.create_environment("prod", &settings).await?;
    assert_eq!(prod.name, "prod");
    assert_eq!(prod.settings, settings);
    assert!(!prod.halted);
    assert_eq!((prod.latest_version, prod.released_version), (0, None));
    assert_eq!(store.get_environment(&prod.id).await?, prod);
    assert_eq!(store.find_environment_by_name("prod").await?, Some(prod.clone()));
    assert_eq!(store.find_environment_by_name("nope").await?, None);

    let err = store.create_environment("prod", &EnvironmentSettings::default()).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err:?}");
    assert!(err.to_string().contains("`prod`"), "{err}");

    let staging = store.create_environment("staging", &EnvironmentSettings::default()).await?;
    let names: Vec<String> = store.list_environments().await?.into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["prod", "staging"]);

    let renamed = store.rename_environment(&staging.id, "test").await?;
    assert_eq!(renamed.name, "test");
    let err = store.rename_environment(&staging.id, "prod").await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err:?}");

    // Every field round-trips, the HTTP policy's too.
    let new_settings = EnvironmentSettings {
        per_node_concurrency: 2,
        http: orc_host::policy::settings::HttpSettings {
            allowed_origins: vec!["http://10.0.0.5:8080".into()],
            addresses: orc_host::policy::settings::AddressRule::Networks(vec!["10.0.0.0/8".into()]),
            secrets: vec!["billing".into()],
            secrets_over_plain_http: true,
        },
        ..settings.clone()
    };
    assert_eq!(store.update_settings(&prod.id, &new_settings).await?.settings, new_settings);
    assert_eq!(store.get_environment(&prod.id).await?.settings, new_settings);
    assert!(store.set_halted(&prod.id, true).await?.halted);
    assert!(store.get_environment(&prod.id).await?.halted);
    assert!(!store.set_halted(&prod.id, false).await?.halted);

    store.delete_environment(&staging.id).await?;
    let err = store.get_environment(&staging.id).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains(&staging.id.to_string()), "{err}");
    assert!(matches!(
        store.delete_environment(&staging.id).await,
        Err(StoreError::NotFound { .. })
    ));
    let unknown = EnvironmentId::random();
    assert!(matches!(store.set_halted(&unknown, true).await, Err(StoreError::NotFound { .. })));
    assert_eq!(store.list_environments().await?.len(), 1);
    Ok(())
}

pub async fn concurrent_submits_get_distinct_consecutive_versions(db: &TestDb) -> Result<()> {
    let store = db.store.clone();
    let env = new_env(&store, "prod").await?;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..24 {
        let store = store.clone();
        tasks.spawn(async move { store.submit_version(&env, &format!(r#"{{"resources":[],"n":{i}}}"#), None).await });
    }
    let mut versions = Vec::new();
    while let Some(done) = tasks.join_next().await {
        versions.push(done??.version);
    }
    versions.sort();
    assert_eq!(versions, (1..=24).collect::<Vec<i64>>());
    assert_eq!(store.get_environment(&env).await?.latest_version, 24);
    // Each document went with the number it was given.
    let mut documents = BTreeSet::new();
    for v in 1..=24 {
        documents.insert(store.get_version(&env, v).await?.document);
    }
    assert_eq!(documents.len(), 24);

    let err = store.submit_version(&EnvironmentId::random(), "{}", None).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    Ok(())
}

pub async fn versions_release_and_rollback(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = new_env(store, "prod").await?;
    let other = new_env(store, "other").await?;
    for n in 1..=3 {
        let info = store.submit_version(&env, &format!(r#"{{"v":{n}}}"#), None).await?;
        assert_eq!(info.version, n);
        assert!(!info.active && info.released_at.is_none());
    }
    assert_eq!(
        store.submit_version(&other, "{}", None).await?.version,
        1,
        "numbers are per environment"
    );

    let v2 = store.get_version(&env, 2).await?;
    assert_eq!(v2.document, r#"{"v":2}"#);
    assert!(!v2.info.active);

    let released = store.release_version(&env, 3).await?;
    assert!(released.active && released.released_at.is_some());
    assert_eq!(store.get_environment(&env).await?.released_version, Some(3));
    // Roll back to 2.
    store.release_version(&env, 2).await?;
    let listed = store.list_versions(&env).await?;
    assert_eq!(listed.iter().map(|v| v.version).collect::<Vec<_>>(), [3, 2, 1], "newest first");
    assert_eq!(listed.iter().filter(|v| v.active).map(|v| v.version).collect::<Vec<_>>(), [2]);
    assert!(listed[0].released_at.is_some() && listed[2].released_at.is_none());
    assert!(store.get_version(&env, 2).await?.info.active);

    let err = store.release_version(&env, 9).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("version 9"), "{err}");
    assert!(matches!(store.get_version(&env, 0).await, Err(StoreError::NotFound { .. })));
    assert!(matches!(
        store.list_versions(&EnvironmentId::random()).await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(store.get_environment(&env).await?.released_version, Some(2));
    Ok(())
}

pub async fn states_batch_upsert_filters_and_pagination(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = new_env(store, "prod").await?;
    let other = new_env(store, "other").await?;
    let statuses = [ResourceStatus::Available, ResourceStatus::Deployed, ResourceStatus::Failed];
    let states: Vec<ResourceState> = (0..250).map(|i| state(i, statuses[i % 3], 1)).collect();
    store.upsert_states(&env, &states).await?;
    store.upsert_states(&other, &states[..10]).await?;

    let mut all: Vec<ResourceState> = states.clone();
    all.sort_by(|a, b| a.resource_id.cmp(&b.resource_id));
    assert_eq!(store.load_states(&env).await?, all);
    assert_eq!(store.get_state(&env, &states[7].resource_id).await?, states[7]);
    // By key: the ones that exist, once each, whatever else is asked for.
    let asked: Vec<String> = [3, 7, 7, 249]
        .iter()
        .map(|&i| states[i].resource_id.clone())
        .chain(["file[web9,/nope]".to_string()])
        .collect();
    let mut found = store.states_of(&env, &asked).await?;
    found.sort_by(|a, b| a.resource_id.cmp(&b.resource_id));
    let mut expected = vec![states[3].clone(), states[7].clone(), states[249].clone()];
    expected.sort_by(|a, b| a.resource_id.cmp(&b.resource_id));
    assert_eq!(found, expected);
    assert!(store.states_of(&env, &[]).await?.is_empty());
    let err = store.get_state(&env, "file[web9,/nope]").await.unwrap_err();
    assert!(
        matches!(err, StoreError::NotFound { .. }) && err.to_string().contains("file[web9,/nope]"),
        "{err}"
    );

    // Upsert again: half changed (new version and hash, an error), half the same; a duplicate id
    // in the batch counts once, the last one winning.
    let mut second: Vec<ResourceState> = states.iter().step_by(2).cloned().collect();
    for s in &mut second {
        s.version = 2;
        s.desired_hash = format!("{}-v2", s.desired_hash);
        s.last_error = Some(ErrorInfo {
            code: "failed".into(),
            message: "disk full".into(),
        });
        s.attempts = 3;
        s.next_retry_at = Some(1234);
    }
    let mut duplicate = second[0].clone();
    duplicate.node = "web9".into();
    duplicate.attempts = 9;
    second.push(duplicate.clone());
    store.upsert_states(&env, &second).await?;
    assert_eq!(store.get_state(&env, &duplicate.resource_id).await?, duplicate);
    assert_eq!(store.get_state(&env, &second[1].resource_id).await?, second[1]);
    assert_eq!(store.get_state(&env, &states[1].resource_id).await?, states[1]);
    assert_eq!(store.load_states(&env).await?.len(), 250);

    // Filters.
    let page = |filter: StateFilter| async move { store.list_states(&env, &filter).await };
    let failed = page(StateFilter {
        status: Some(ResourceStatus::Failed),
        limit: 1000,
        ..StateFilter::default()
    })
    .await?;
    assert_eq!(
        failed.items.len(),
        states.iter().filter(|s| s.status == ResourceStatus::Failed).count()
    );
    assert!(failed.items.iter().all(|s| s.status == ResourceStatus::Failed));
    assert_eq!(failed.next_after, None);

    let web1_dirs = page(StateFilter {
        node: Some("web1".into()),
        resource_type: Some("directory".into()),
        limit: 1000,
        ..StateFilter::default()
    })
    .await?;
    let expected = states.iter().filter(|s| s.node == "web1" && s.resource_type == "directory").count();
    assert_eq!(web1_dirs.items.len(), expected);
    assert!(web1_dirs.items.iter().all(|s| s.node == "web1" && s.resource_type == "directory"));

    let text = page(StateFilter {
        text: Some("APP/0012".into()),
        limit: 1000,
        ..StateFilter::default()
    })
    .await?;
    let ids: Vec<&str> = text.items.iter().map(|s| s.resource_id.as_str()).collect();
    assert_eq!(ids.len(), 10, "{ids:?}");
    assert!(ids.iter().all(|id| id.contains("app/0012")), "{ids:?}");

    let nothing = page(StateFilter {
        node: Some("web1".into()),
        text: Some("no such".into()),
        ..StateFilter::default()
    })
    .await?;
    assert!(nothing.items.is_empty() && nothing.next_after.is_none());

    // Keyset pagination walks every state once, in id order.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let p = page(StateFilter {
            after: after.clone(),
            limit: 40,
            ..StateFilter::default()
        })
        .await?;
        ensure!(p.items.len() <= 40, "page of {}", p.items.len());
        seen.extend(p.items.iter().map(|s| s.resource_id.clone()));
        match p.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, all.iter().map(|s| s.resource_id.clone()).collect::<Vec<_>>());

    // Filter and pagination together.
    let first = page(StateFilter {
        status: Some(ResourceStatus::Deployed),
        limit: 5,
        ..StateFilter::default()
    })
    .await?;
    assert_eq!(first.items.len(), 5);
    let rest = page(StateFilter {
        status: Some(ResourceStatus::Deployed),
        after: first.next_after.clone(),
        limit: 1000,
        ..StateFilter::default()
    })
    .await?;
    let deployed = states.iter().filter(|s| s.status == ResourceStatus::Deployed).count();
    assert_eq!(first.items.len() + rest.items.len(), deployed);
    assert!(first.items.last().unwrap().resource_id < rest.items[0].resource_id);

    let counts = store.status_counts(&env).await?;
    assert_eq!(
        counts,
        [
            (ResourceStatus::Available, 84),
            (ResourceStatus::Deployed, 83),
            (ResourceStatus::Failed, 83)
        ]
    );

    let unknown = EnvironmentId::random();
    let err = store.upsert_states(&unknown, &states[..1]).await.unwrap_err();
    assert!(
        matches!(err, StoreError::NotFound { .. }) && err.to_string().contains(&unknown.to_string()),
        "{err}"
    );

    let gone = vec![
        states[0].resource_id.clone(),
        states[1].resource_id.clone(),
        "file[x,/never]".to_string(),
    ];
    assert_eq!(store.delete_states(&env, &gone).await?, 2);
    assert_eq!(store.load_states(&env).await?.len(), 248);
    assert_eq!(store.load_states(&other).await?.len(), 10, "other environments are untouched");
    Ok(())
}

pub async fn status_transitions_in_batch(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = new_env(store, "prod").await?;
    let states: Vec<ResourceState> = (0..6).map(|i| state(i, ResourceStatus::Available, 1)).collect();
    store.upsert_states(&env, &states).await?;
    let id = |i: usize| states[i].resource_id.clone();

    let deploying: Vec<StatusChange> = (0..6).map(|i| StatusChange::new(id(i), ResourceStatus::Deploying)).collect();
    assert_eq!(store.set_status(&env, &deploying).await?, 6);

    let changes = vec![
        StatusChange {
            deployed_hash: Some(states[0].desired_hash.clone()),
            last_deploy_at: Some(1000),
            last_verified_at: Some(1000),
            attempts: Attempts::Reset,
            ..StatusChange::new(id(0), ResourceStatus::Deployed)
        },
        StatusChange {
            attempts: Attempts::Increment,
            last_error: Some(ErrorInfo {
                code: "crashed".into(),
                message: "plugin file@1.0.0 trapped".into(),
            }),
            next_retry_at: Some(5000),
            ..StatusChange::new(id(1), ResourceStatus::Failed)
        },
        StatusChange {
            last_error: Some(ErrorInfo {
                code: "skipped".into(),
                message: format!("requires {} which failed", id(1)),
            }),
            ..StatusChange::new(id(2), ResourceStatus::Skipped)
        },
        // Computed for a superseded version: dropped.
        StatusChange {
            if_version: Some(7),
            ..StatusChange::new(id(3), ResourceStatus::Deployed)
        },
        StatusChange {
            if_version: Some(1),
            ..StatusChange::new(id(4), ResourceStatus::Unavailable)
        },
        StatusChange::new("file[nowhere,/x]", ResourceStatus::Deployed),
        // Listed twice: the last wins.
        StatusChange::new(id(5), ResourceStatus::Failed),
        StatusChange::new(id(5), ResourceStatus::Deployed),
    ];
    assert_eq!(store.set_status(&env, &changes).await?, 5);

    let s0 = store.get_state(&env, &id(0)).await?;
    assert_eq!(s0.status, ResourceStatus::Deployed);
    assert_eq!(s0.deployed_hash.as_deref(), Some(states[0].desired_hash.as_str()));
    assert_eq!((s0.last_deploy_at, s0.last_verified_at, s0.attempts), (Some(1000), Some(1000), 0));

    let s1 = store.get_state(&env, &id(1)).await?;
    assert_eq!((s1.status, s1.attempts, s1.next_retry_at), (ResourceStatus::Failed, 1, Some(5000)));
    assert_eq!(s1.last_error.as_ref().unwrap().code, "crashed");
    // A second failure counts again; a success clears the error and the retry, keeps the hash.
    store
        .set_status(
            &env,
            &[StatusChange {
                attempts: Attempts::Increment,
                ..StatusChange::new(id(1), ResourceStatus::Failed)
            }],
        )
        .await?;
    assert_eq!(store.get_state(&env, &id(1)).await?.attempts, 2);
    store
        .set_status(
            &env,
            &[StatusChange {
                last_verified_at: Some(2000),
                ..StatusChange::new(id(0), ResourceStatus::Deployed)
            }],
        )
        .await?;
    let s0 = store.get_state(&env, &id(0)).await?;
    assert_eq!(
        (s0.last_deploy_at, s0.last_verified_at),
        (Some(1000), Some(2000)),
        "None keeps, Some sets"
    );
    assert_eq!(s0.deployed_hash.as_deref(), Some(states[0].desired_hash.as_str()));

    assert_eq!(store.get_state(&env, &id(2)).await?.status, ResourceStatus::Skipped);
    assert_eq!(
        store.get_state(&env, &id(3)).await?.status,
        ResourceStatus::Deploying,
        "stale change dropped"
    );
    assert_eq!(store.get_state(&env, &id(4)).await?.status, ResourceStatus::Unavailable);
    assert_eq!(store.get_state(&env, &id(5)).await?.status, ResourceStatus::Deployed);
    assert_eq!(store.set_status(&env, &[]).await?, 0);
    Ok(())
}

pub async fn recovery_of_deploying(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = new_env(store, "prod").await?;
    let other = new_env(store, "other").await?;
    let states: Vec<ResourceState> = (0..20)
        .map(|i| {
            state(
                i,
                if i.is_multiple_of(4) {
                    ResourceStatus::Deploying
                } else {
                    ResourceStatus::Deployed
                },
                1,
            )
        })
        .collect();
    store.upsert_states(&env, &states).await?;
    store.upsert_states(&other, &states).await?;

    let mut expected: Vec<String> = states
        .iter()
        .filter(|s| s.status == ResourceStatus::Deploying)
        .map(|s| s.resource_id.clone())
        .collect();
    expected.sort();
    assert_eq!(store.recover_deploying(&env).await?, expected);
    for id in &expected {
        assert_eq!(store.get_state(&env, id).await?.status, ResourceStatus::Available);
    }
    assert!(store.recover_deploying(&env).await?.is_empty(), "nothing left deploying");
    let counts = store.status_counts(&other).await?;
    assert!(
        counts.contains(&(ResourceStatus::Deploying, 5)),
        "other environment untouched: {counts:?}"
    );
    Ok(())
}

/// `record_progress`: a scheduler batch of states and actions is one transaction, and a `None`
/// time keeps the stored one (the scheduler's "unchanged") where `upsert_states` would clear it.
pub async fn progress_batches_are_atomic_and_keep_times(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = new_env(store, "prod").await?;
    let mut deployed: Vec<ResourceState> = (0..3_000).map(|i| state(i, ResourceStatus::Deployed, 1)).collect();
    for s in &mut deployed {
        s.deployed_hash = Some(s.desired_hash.clone());
        s.last_deploy_at = Some(1_000);
        s.last_verified_at = Some(2_000);
    }
    deployed.sort_by(|a, b| a.resource_id.cmp(&b.resource_id)); // `load_states`' order
    let actions: Vec<ActionRecord> = deployed
        .iter()
        .map(|s| action(env, &s.resource_id, ActionKind::Deploy, 900))
        .collect();
    store.record_progress(&env, None, &Progress::of(&deployed, &actions)).await?;
    assert_eq!(store.load_states(&env).await?, deployed);
    let log = store
        .list_actions(
            &env,
            &ActionFilter {
                limit: 10_000,
                ..ActionFilter::default()
            },
        )
        .await?;
    assert_eq!(log.items.len(), actions.len());

    // Re-released (times `None`, as the scheduler sends them for what it did not touch): the
    // stored times stay; given ones are written.
    let mut again = deployed.clone();
    for s in &mut again {
        s.last_deploy_at = None;
        s.last_verified_at = None;
    }
    again[0].last_verified_at = Some(3_000);
    store.record_progress(&env, None, &Progress::of(&again, &[])).await?;
    let mut expected = deployed.clone();
    expected[0].last_verified_at = Some(3_000);
    assert_eq!(store.load_states(&env).await?, expected);

    // A batch that cannot be written whole leaves nothing behind: here its second action
    // repeats the first one's id, after states that would have changed every resource.
    let failing: Vec<ResourceState> = expected
        .iter()
        .map(|s| ResourceState {
            status: ResourceStatus::Failed,
            ..s.clone()
        })
        .collect();
    let first = action(env, &failing[0].resource_id, ActionKind::Deploy, 5_000);
    let duplicate = ActionRecord {
        resource_id: failing[1].resource_id.clone(),
        ..first.clone()
    };
    assert!(
        store
            .record_progress(&env, None, &Progress::of(&failing, &[first, duplicate]))
            .await
            .is_err()
    );
    assert_eq!(store.load_states(&env).await?, expected, "no state of the failed batch was kept");
    let log = store
        .list_actions(
            &env,
            &ActionFilter {
                limit: 10_000,
                ..ActionFilter::default()
            },
        )
        .await?;
    assert_eq!(log.items.len(), actions.len(), "no action of the failed batch was kept");

    // An unknown environment is named as such.
    let unknown = EnvironmentId::random();
    let err = store
        .record_progress(&unknown, None, &Progress::of(&deployed[..1], &[]))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    Ok(())
}

pub async fn actions_batch_and_query_order(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = new_env(store, "prod").await?;
    let other = new_env(store, "other").await?;
    let resources = ["file[web1,/a]", "file[web1,/b]", "directory[web2,/c]"];
    let kinds = [
        ActionKind::Deploy,
        ActionKind::Repair,
        ActionKind::Dryrun,
        ActionKind::Read,
        ActionKind::Delete,
    ];
    let mut batch = Vec::new();
    for i in 0..30 {
        let mut a = action(env, resources[i % 3], kinds[i % 5], 1000 + i as i64);
        if i.is_multiple_of(7) {
            a.outcome = "failed".into();
            a.error = Some(ErrorInfo {
                code: "timed_out".into(),
                message: format!("{} timed out after 30 s", resources[i % 3]),
            });
        }
        batch.push(a);
    }
    batch.push(action(other, resources[0], ActionKind::Deploy, 5000));
    store.insert_actions(&batch).await?;
    store.insert_actions(&[]).await?;

    // Per resource: newest first, limited.
    let latest = store.resource_actions(&env, resources[0], 4).await?;
    let expected: Vec<&ActionRecord> = batch[..30].iter().filter(|a| a.resource_id == resources[0]).rev().take(4).collect();
    assert_eq!(latest.iter().map(|l| &l.action).collect::<Vec<_>>(), expected);
    assert!(latest.windows(2).all(|w| w[0].seq > w[1].seq));
    assert_eq!(latest[0].action.changes, batch[27].changes);

    // Per environment, filtered.
    let failed = store
        .list_actions(
            &env,
            &ActionFilter {
                outcome: Some("failed".into()),
                ..ActionFilter::default()
            },
        )
        .await?;
    assert_eq!(
        failed.items.iter().map(|l| l.action.started_at).collect::<Vec<_>>(),
        [1028, 1021, 1014, 1007, 1000]
    );
    assert_eq!(failed.items[0].action.error.as_ref().unwrap().code, "timed_out");
    let repairs = store
        .list_actions(
            &env,
            &ActionFilter {
                kind: Some(ActionKind::Repair),
                since: Some(1010),
                until: Some(1020),
                ..ActionFilter::default()
            },
        )
        .await?;
    assert_eq!(repairs.items.iter().map(|l| l.action.started_at).collect::<Vec<_>>(), [1016, 1011]);
    let by_resource_and_version = store
        .list_actions(
            &env,
            &ActionFilter {
                resource_id: Some(resources[2].into()),
                version: Some(1),
                ..ActionFilter::default()
            },
        )
        .await?;
    assert_eq!(by_resource_and_version.items.len(), 10);
    let none = store
        .list_actions(
            &env,
            &ActionFilter {
                version: Some(2),
                ..ActionFilter::default()
            },
        )
        .await?;
    assert!(none.items.is_empty());

    // Pagination, newest first, over the environment only.
    let mut seen = Vec::new();
    let mut before = None;
    loop {
        let page = store
            .list_actions(
                &env,
                &ActionFilter {
                    before,
                    limit: 7,
                    ..ActionFilter::default()
                },
            )
            .await?;
        seen.extend(page.items.iter().map(|l| l.action.id));
        match page.next_before {
            Some(b) => before = Some(b),
            None => break,
        }
    }
    assert_eq!(seen, batch[..30].iter().rev().map(|a| a.id).collect::<Vec<_>>());
    assert_eq!(store.resource_actions(&other, resources[0], 10).await?.len(), 1);

    let stray = action(EnvironmentId::random(), "file[web1,/a]", ActionKind::Read, 1);
    let err = store.insert_actions(&[stray]).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");

    // Ids are unique.
    let err = store.insert_actions(&batch[..1]).await.unwrap_err();
    assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
    Ok(())
}

pub async fn dryrun_lifecycle(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = new_env(store, "prod").await?;
    let err = store.create_dryrun(&env, 1, None).await.unwrap_err();
    assert!(
        matches!(err, StoreError::NotFound { .. }) && err.to_string().contains("version 1"),
        "{err}"
    );

    store.submit_version(&env, "{}", None).await?;
    let first = store.create_dryrun(&env, 1, None).await?;
    assert_eq!(first.status, DryrunStatus::Running);
    assert_eq!(store.get_dryrun(&env, &first.id).await?, first);

    let report = r#"{"resources":[{"id":"file[web1,/a]","changes":[]}]}"#;
    let done = store.complete_dryrun(&env, &first.id, DryrunStatus::Done, report).await?;
    assert_eq!(done.status, DryrunStatus::Done);
    assert_eq!(done.report.as_deref(), Some(report));
    assert!(done.finished_at.is_some());
    assert_eq!(store.get_dryrun(&env, &first.id).await?, done);

    let err = store
        .complete_dryrun(&env, &first.id, DryrunStatus::Failed, "{}")
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict { .. }) && err.to_string().contains("already done"),
        "{err}"
    );
    let second = store.create_dryrun(&env, 1, None).await?;
    assert!(matches!(
        store.complete_dryrun(&env, &second.id, DryrunStatus::Running, "{}").await,
        Err(StoreError::Conflict { .. })
    ));
    let failed = store
        .complete_dryrun(&env, &second.id, DryrunStatus::Failed, r#"{"error":"x"}"#)
        .await?;
    assert_eq!(failed.status, DryrunStatus::Failed);

    let listed = store.list_dryruns(&env).await?;
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|d| d.report.is_none()));
    let unknown = DryrunId::random();
    assert!(matches!(store.get_dryrun(&env, &unknown).await, Err(StoreError::NotFound { .. })));
    assert!(matches!(
        store.complete_dryrun(&env, &unknown, DryrunStatus::Done, "{}").await,
        Err(StoreError::NotFound { .. })
    ));
    // Another environment cannot see it.
    let other = new_env(store, "other").await?;
    assert!(matches!(
        store.get_dryrun(&other, &first.id).await,
        Err(StoreError::NotFound { .. })
    ));
    Ok(())
}

pub async fn operations_lifecycle_and_interruption(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = new_env(store, "prod").await?;
    let repair = store.create_operation(&env, OperationKind::Repair, None).await?;
    assert_eq!(repair.status, OperationStatus::Running);
    assert_eq!(store.get_operation(&env, &repair.id).await?, repair);
    let done = store.complete_operation(&env, &repair.id, r#"{"deployed":3}"#).await?;
    assert_eq!(
        (done.status, done.result.as_deref()),
        (OperationStatus::Done, Some(r#"{"deployed":3}"#))
    );
    let again = store.complete_operation(&env, &repair.id, "{}").await.unwrap_err();
    assert!(
        matches!(again, StoreError::Conflict { .. }) && again.to_string().contains("already done"),
        "{again}"
    );

    // A host that stops leaves these running; the next start interrupts them.
    let deploy = store.create_operation(&env, OperationKind::Deploy, None).await?;
    store.submit_version(&env, "{}", None).await?;
    let dryrun = store.create_dryrun(&env, 1, None).await?;
    let other = new_env(store, "other").await?;
    let elsewhere = store.create_operation(&other, OperationKind::Deploy, None).await?;
    assert_eq!(store.interrupt_unfinished(&env, r#"{"error":"stopped"}"#).await?, (1, 1));
    assert_eq!(store.get_operation(&env, &deploy.id).await?.status, OperationStatus::Interrupted);
    assert_eq!(store.get_operation(&env, &repair.id).await?.status, OperationStatus::Done);
    let dryrun = store.get_dryrun(&env, &dryrun.id).await?;
    assert_eq!(
        (dryrun.status, dryrun.report.as_deref()),
        (DryrunStatus::Failed, Some(r#"{"error":"stopped"}"#))
    );
    assert_eq!(store.get_operation(&other, &elsewhere.id).await?.status, OperationStatus::Running);
    assert!(matches!(
        store.get_operation(&other, &deploy.id).await,
        Err(StoreError::NotFound { .. })
    ));

    // The action counts an operation's result is made of: per outcome, within the window.
    let mut failed = action(env, "file[web1,/b]", ActionKind::Repair, 2_000);
    failed.outcome = "failed".to_string();
    store
        .insert_actions(&[
            action(env, "file[web1,/a]", ActionKind::Repair, 1_000),
            action(env, "file[web1,/a]", ActionKind::Repair, 2_500),
            failed,
            action(env, "file[web1,/c]", ActionKind::Repair, 9_000),
            action(other, "file[web1,/a]", ActionKind::Repair, 2_000),
        ])
        .await?;
    assert_eq!(
        store.count_actions(&env, 1_000, 9_000).await?,
        vec![("changed".to_string(), 2), ("failed".to_string(), 1)]
    );
    Ok(())
}

/// Users own tokens; memberships go with their user or environment; no change leaves every
/// enabled admin without a way in (a token or a password).
pub async fn users_tokens_and_memberships(db: &TestDb) -> Result<()> {
    use orc_host::access::Role;
    use orc_host::store::UserChange;
    let store = &db.store;
    assert_eq!(store.count_tokens().await?, 0);
    let admin = store.insert_user("admin", None, true, false).await?;
    assert!(matches!(
        store.insert_user("admin", None, false, false).await,
        Err(StoreError::Conflict { .. })
    ));
    let hash = hash_token("orc_s3cret");
    assert_eq!(hash.len(), 64);
    let token = store.insert_token(&hash, &admin.id, None, "first").await?;
    let (id, scope, account) = store.find_credential(&hash).await?.unwrap();
    assert_eq!((id, scope, account.name.as_str(), account.admin), (token.id, None, "admin", true));
    assert_eq!(store.find_credential(&hash_token("orc_other")).await?, None);
    assert!(matches!(
        store.insert_token(&hash, &admin.id, None, "").await,
        Err(StoreError::Conflict { .. })
    ));

    // The admin's only token cannot go, nor can the admin be disabled or demoted.
    assert!(matches!(store.delete_token(&token.id).await, Err(StoreError::Conflict { .. })));
    for change in [
        UserChange {
            disabled: Some(true),
            ..Default::default()
        },
        UserChange {
            admin: Some(false),
            ..Default::default()
        },
    ] {
        assert!(matches!(
            store.update_user(&admin.id, &change).await,
            Err(StoreError::Conflict { .. })
        ));
    }
    assert!(matches!(store.delete_user(&admin.id).await, Err(StoreError::Conflict { .. })));
    assert!(store.find_credential(&hash).await?.is_some(), "a refused change changes nothing");
    // With a password it has another way in.
    let with_password = UserChange {
        password_hash: Some(Some("$argon2id$…".into())),
        ..Default::default()
    };
    store.update_user(&admin.id, &with_password).await?;
    store.delete_token(&token.id).await?;
    assert_eq!(store.find_credential(&hash).await?, None);
    assert!(matches!(store.delete_token(&token.id).await, Err(StoreError::NotFound { .. })));

    // Memberships, and what goes with a user.
    let ann = store.insert_user("ann", None, false, false).await?;
    let env = store.create_environment("prod", &Default::default()).await?;
    store.set_membership(&ann.id, &env.id, Role::Viewer).await?;
    store.set_membership(&ann.id, &env.id, Role::Owner).await?;
    let members = store.members(&env.id).await?;
    assert_eq!(
        members.iter().map(|m| (m.user.as_str(), m.role)).collect::<Vec<_>>(),
        [("ann", Role::Owner)]
    );
    let ann_token = store.insert_token(&hash_token("orc_ann"), &ann.id, None, "").await?;
    assert_eq!(store.list_tokens(Some(&ann.id)).await?.len(), 1);
    store.delete_user(&ann.id).await?;
    assert!(matches!(store.get_token(&ann_token.id).await, Err(StoreError::NotFound { .. })));
    assert!(store.members(&env.id).await?.is_empty());
    Ok(())
}

async fn exercise_kv(kv: &dyn KvStore) {
    kv.set("env/a", "k1", b"v1").await.unwrap();
    kv.set("env/a", "k2", b"v2").await.unwrap();
    kv.set("env/a", "other", b"o").await.unwrap();
    kv.set("env/b", "k1", b"other scope").await.unwrap();
    assert_eq!(kv.get("env/a", "k1").await.unwrap().unwrap(), b"v1");
    assert_eq!(kv.list("env/a", "k").await.unwrap(), ["k1", "k2"]);
    assert_eq!(kv.list("env/a", "").await.unwrap(), ["k1", "k2", "other"]);
    assert_eq!(kv.list("env/b", "").await.unwrap(), ["k1"]);
    assert!(kv.list("env/c", "").await.unwrap().is_empty());
    kv.set("env/a", "k1", b"v1 again").await.unwrap();
    assert_eq!(kv.get("env/a", "k1").await.unwrap().unwrap(), b"v1 again");
    assert!(kv.delete("env/a", "k1").await.unwrap());
    assert!(!kv.delete("env/a", "k1").await.unwrap());
    assert_eq!(kv.get("env/a", "k1").await.unwrap(), None);
    assert_eq!(kv.get("env/b", "k1").await.unwrap().unwrap(), b"other scope");
    // Keys are data, not paths or patterns; values are bytes.
    kv.set("env/a", "../../etc/passwd", b"x").await.unwrap();
    kv.set("env/a", "50%_off", &[0, 255, 1]).await.unwrap();
    assert_eq!(kv.get("env/a", "50%_off").await.unwrap().unwrap(), [0, 255, 1]);
    assert_eq!(kv.list("env/a", "50%").await.unwrap(), ["50%_off"]);
    assert!(kv.list("env/a", "5_").await.unwrap().is_empty());
    let big = vec![7u8; 1 << 20];
    kv.set("env/a", "big", &big).await.unwrap();
    assert_eq!(kv.get("env/a", "big").await.unwrap().unwrap(), big);
}

pub async fn db_kv_keeps_scopes_apart(db: &TestDb) -> Result<()> {
    let kv = Arc::new(DbKv::open(&db.store).await?);
    exercise_kv(kv.as_ref()).await;
    // Many callers at once: their writes are committed in groups, each answered once durable.
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let kv = Arc::clone(&kv);
            tokio::spawn(async move {
                let scope = format!("env/t{t}");
                let writes = (0..25).map(|i| {
                    let (kv, scope) = (Arc::clone(&kv), scope.clone());
                    async move { kv.set(&scope, &format!("{i:02}"), format!("{t}/{i}").as_bytes()).await }
                });
                for written in futures::future::join_all(writes).await {
                    written.unwrap();
                }
                assert!(kv.delete(&scope, "00").await.unwrap());
                kv.list(&scope, "").await.unwrap().len()
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await?, 24);
    }
    assert_eq!(kv.get("env/t3", "07").await?.unwrap(), b"3/7");
    // Persisted once durable: a new DbKv on a new pool sees it.
    kv.durable().await;
    drop(kv);
    let reopened = DbKv::open(&db.reopen().await?).await?;
    assert_eq!(reopened.get("env/a", "k2").await?.unwrap(), b"v2");
    assert_eq!(reopened.get("env/t5", "24").await?.unwrap(), b"5/24");
    Ok(())
}

/// Calls queued together are answered by one query (reads) or one transaction (writes), each
/// with what it would have got on its own: writes of one key apply in order, a delete knows
/// whether its key existed at that point, a key read twice gets its value twice.
pub async fn db_kv_batches_answer_each_call_in_order(db: &TestDb) -> Result<()> {
    let kv = DbKv::open(&db.store).await?;
    kv.set("env/b", "kept", b"old").await?;
    // `join_all` polls in order, so the calls are queued in this order.
    let (s1, d1, s2, d2, s3, d3, s4) = futures::join!(
        kv.set("env/b", "k", b"1"),
        kv.delete("env/b", "k"),
        kv.set("env/b", "k", b"2"),
        kv.delete("env/b", "never"),
        kv.set("env/b", "gone", b"x"),
        kv.delete("env/b", "gone"),
        kv.set("env/b", "kept", b"new"),
    );
    s1?;
    ensure!(d1?, "the delete after a set in the same group removed the key");
    s2?;
    ensure!(!d2?, "deleting a key that never existed answers false");
    s3?;
    ensure!(d3?);
    s4?;
    ensure!(
        kv.get("env/b", "k").await?.as_deref() == Some(b"2".as_slice()),
        "the last write of `k` wins"
    );
    ensure!(kv.get("env/b", "gone").await?.is_none());
    ensure!(kv.get("env/b", "kept").await?.as_deref() == Some(b"new".as_slice()));

    let writes = (0..300).map(|i| {
        let kv = &kv;
        async move {
            kv.set(&format!("env/s{}", i % 3), &format!("{i:03}"), format!("v{i}").as_bytes())
                .await
        }
    });
    for written in futures::future::join_all(writes).await {
        written?;
    }
    // 600 reads at once over three scopes: present keys, absent keys, every key twice.
    let reads = (0..600).map(|j| {
        let kv = &kv;
        let i = j % 400;
        async move { (i, kv.get(&format!("env/s{}", i % 3), &format!("{i:03}")).await) }
    });
    for (i, value) in futures::future::join_all(reads).await {
        let expected = (i < 300).then(|| format!("v{i}").into_bytes());
        ensure!(value? == expected, "read of key {i:03}");
    }
    Ok(())
}

/// Writes are answered before they are committed and reads answer from memory: what a caller
/// sees is what it would see of the database, with scopes copied, evicted and too large to copy
/// (a budget of 4 KiB: a scope over 2 KiB is read per key), and [`DbKv::durable`] resolves once
/// the database has every write accepted before it.
pub async fn db_kv_answers_from_memory_like_the_database(db: &TestDb) -> Result<()> {
    let kv = DbKv::open_with_budget(&db.store, 4 << 10).await?;
    exercise_kv(&kv).await;
    // A copy made before a write is kept current by its commit.
    ensure!(kv.get("env/fresh", "k").await?.is_none());
    kv.set("env/fresh", "k", b"x").await?;
    kv.durable().await;
    ensure!(kv.get("env/fresh", "k").await?.as_deref() == Some(b"x".as_slice()));
    ensure!(kv.list("env/fresh", "").await? == ["k"]);
    ensure!(kv.delete("env/fresh", "k").await?);
    kv.durable().await;
    ensure!(kv.get("env/fresh", "k").await?.is_none());
    ensure!(kv.list("env/fresh", "").await?.is_empty());
    // `large` outgrows half the budget (40 entries of ~100 bytes with overhead).
    for i in 0..40 {
        kv.set("env/large", &format!("k{i:02}"), &[i as u8; 40]).await?;
        kv.set(&format!("env/small{}", i % 4), "k", &[i as u8]).await?;
        // 40 scopes of ~150 bytes each: more than the budget holds, so copies are evicted.
        kv.set(&format!("env/many{i:02}"), "k", &[i as u8; 80]).await?;
    }
    // Everything written so far is visible in memory before and after it is durable.
    async fn check(kv: &DbKv) -> Result<()> {
        let kv = kv as &dyn KvStore;
        {
            for i in 0..40u8 {
                ensure!(kv.get("env/large", &format!("k{i:02}")).await?.as_deref() == Some([i; 40].as_slice()));
            }
            for s in 0..4u8 {
                let last = 36 + s;
                ensure!(kv.get(&format!("env/small{s}"), "k").await?.as_deref() == Some([last].as_slice()));
                ensure!(kv.get(&format!("env/small{s}"), "absent").await?.is_none());
            }
            ensure!(kv.list("env/large", "k0").await?.len() == 10);
            for i in 0..40u8 {
                let scope = format!("env/many{i:02}");
                ensure!(kv.get(&scope, "k").await?.as_deref() == Some([i; 80].as_slice()), "{scope}");
                ensure!(kv.get(&scope, "other").await?.is_none());
            }
            ensure!(kv.get("env/a", "k2").await?.as_deref() == Some(b"v2".as_slice()));
            Ok(())
        }
    }
    check(&kv).await?;
    kv.durable().await;
    check(&kv).await?;
    // A fresh store on a new pool copies the scopes from the database: the same answers.
    let reopened = DbKv::open_with_budget(&db.reopen().await?, 4 << 10).await?;
    check(&reopened).await?;
    // Written, deleted and listed through the fresh one (copies loaded, large scope per key).
    assert!(reopened.delete("env/large", "k05").await?);
    assert!(!reopened.delete("env/large", "k05").await?);
    reopened.set("env/small1", "new", b"n").await?;
    ensure!(reopened.list("env/large", "k0").await?.len() == 9);
    ensure!(reopened.list("env/small1", "").await? == ["k", "new"]);
    reopened.durable().await;
    ensure!(reopened.list("env/small1", "").await? == ["k", "new"]);
    // The first store's copies do not know about the second store's writes: one host serves a
    // scope. What is committed is what a third one reads.
    let third = DbKv::open(&db.reopen().await?).await?;
    ensure!(third.get("env/large", "k05").await?.is_none());
    ensure!(third.get("env/small1", "new").await?.as_deref() == Some(b"n".as_slice()));
    Ok(())
}

/// [`DbKv::forget`] deletes every scope under a prefix, writes accepted just before it
/// included, in memory and in the database; `e1/` is not `e10/`.
pub async fn db_kv_forgets_the_scopes_under_a_prefix(db: &TestDb) -> Result<()> {
    let kv = DbKv::open(&db.store).await?;
    for scope in ["e1/a", "e1/b", "e10/a", "e2/a"] {
        kv.set(scope, "k", scope.as_bytes()).await?;
    }
    kv.durable().await;
    // Copies exist, and one write is not committed yet when the forget is asked.
    ensure!(kv.get("e1/a", "k").await?.is_some());
    kv.set("e1/b", "late", b"x").await?;
    ensure!(kv.forget("e1/").await? == 3);
    for (scope, kept) in [("e1/a", false), ("e1/b", false), ("e10/a", true), ("e2/a", true)] {
        ensure!(kv.get(scope, "k").await?.is_some() == kept, "{scope}");
        ensure!(kv.list(scope, "").await?.len() == usize::from(kept), "{scope}");
    }
    ensure!(kv.get("e1/b", "late").await?.is_none());
    let reopened = DbKv::open(&db.reopen().await?).await?;
    ensure!(reopened.list("e1/a", "").await?.is_empty() && reopened.list("e1/b", "").await?.is_empty());
    ensure!(reopened.get("e10/a", "k").await?.as_deref() == Some(b"e10/a".as_slice()));
    ensure!(reopened.forget("nothing/").await? == 0);
    Ok(())
}

/// What an environment's plugins hold is counted from the database for its quota: keys and
/// their values in bytes (a key of the documented 1,024-byte limit, a key in Cyrillic), writes
/// accepted but not committed yet included, only the environment's own scopes (`e1/` is not
/// `e10/`, nor the scope `e1`). The runtime's checked writes refuse what goes past the quota and
/// keep the count current; a fresh store counts the same; forgetting the environment forgets it.
pub async fn db_kv_counts_what_an_environment_holds_for_its_quota(db: &TestDb) -> Result<()> {
    let kv = DbKv::open(&db.store).await?;
    let long = "k".repeat(1024);
    kv.set("e1/a", &long, b"12345").await?;
    kv.set("e1/b", "ключ", b"xy").await?;
    for scope in ["e10/a", "e1", "e1.x/a", "e0/a"] {
        kv.set(scope, "k", b"elsewhere").await?;
    }
    let held = KvUsage {
        keys: 2,
        bytes: 1024 + 5 + "ключ".len() as u64 + 2,
    };
    ensure!(kv.usage("e1").await? == held, "{:?}", kv.usage("e1").await?);
    ensure!(kv.get("e1/a", &long).await?.as_deref() == Some(b"12345".as_slice()));

    let quota = KvQuota {
        max_keys: 3,
        max_bytes: 2000,
    };
    set_within(&kv, "e1", quota, "e1/a", "k3", b"v").await?;
    let refused = set_within(&kv, "e1", quota, "e1/b", "k4", b"v").await;
    ensure!(matches!(refused, Err(KvError::QuotaExceeded { unit: "keys", .. })), "{refused:?}");
    let refused = set_within(&kv, "e1", quota, "e1/a", "k3", &[0; 1000]).await;
    ensure!(matches!(refused, Err(KvError::QuotaExceeded { unit: "bytes", .. })), "{refused:?}");
    ensure!(delete_counted(&kv, "e1", "e1/b", "ключ").await?);
    set_within(&kv, "e1", quota, "e1/b", "k4", b"v").await?;
    let now = KvUsage {
        keys: 3,
        bytes: 1024 + 5 + 3 + 3,
    };
    ensure!(kv.usage("e1").await? == now, "{:?}", kv.usage("e1").await?);
    kv.durable().await;
    let reopened = DbKv::open(&db.reopen().await?).await?;
    ensure!(reopened.usage("e1").await? == now);
    let refused = set_within(&reopened, "e1", quota, "e1/b", "k5", b"v").await;
    ensure!(matches!(refused, Err(KvError::QuotaExceeded { .. })), "{refused:?}");

    kv.forget("e1/").await?;
    ensure!(kv.usage("e1").await? == KvUsage::default());
    for i in 0..3 {
        set_within(&kv, "e1", quota, "e1/a", &format!("n{i}"), b"v").await?;
    }
    ensure!(kv.usage("e10").await? == KvUsage { keys: 1, bytes: 10 });
    Ok(())
}

pub async fn deleting_an_environment_removes_its_data(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env = new_env(store, "prod").await?;
    let keep = new_env(store, "keep").await?;
    for e in [env, keep] {
        store.submit_version(&e, "{}", None).await?;
        store.upsert_states(&e, &[state(1, ResourceStatus::Deployed, 1)]).await?;
        store.insert_actions(&[action(e, "file[web1,/a]", ActionKind::Deploy, 1)]).await?;
        store.create_dryrun(&e, 1, None).await?;
    }
    store.delete_environment(&env).await?;
    assert!(matches!(store.list_versions(&env).await, Err(StoreError::NotFound { .. })));
    assert!(store.load_states(&env).await?.is_empty());
    assert!(store.resource_actions(&env, "file[web1,/a]", 10).await?.is_empty());
    assert!(store.list_dryruns(&env).await?.is_empty());
    assert_eq!(store.load_states(&keep).await?.len(), 1);
    assert_eq!(store.resource_actions(&keep, "file[web1,/a]", 10).await?.len(), 1);
    assert_eq!(store.list_dryruns(&keep).await?.len(), 1);
    Ok(())
}

pub async fn migrations_are_idempotent_on_reconnect(db: &TestDb) -> Result<()> {
    let env = new_env(&db.store, "prod").await?;
    db.store.submit_version(&env, r#"{"kept":true}"#, None).await?;
    for _ in 0..2 {
        let again = db.reopen().await?;
        assert_eq!(again.backend(), db.store.backend());
        assert_eq!(again.get_version(&env, 1).await?.document, r#"{"kept":true}"#);
        again.close().await;
    }
    // Each migration recorded once.
    let applied: i64 = match db.store.backend() {
        Backend::Sqlite => {
            use sqlx::Connection as _;
            let mut c = sqlx::SqliteConnection::connect(&db.location).await?;
            sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations")
                .fetch_one(&mut c)
                .await?
        }
        Backend::Postgres => {
            use sqlx::Connection as _;
            let mut c = sqlx::PgConnection::connect(&db.location).await?;
            sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations")
                .fetch_one(&mut c)
                .await?
        }
    };
    let folder = match db.store.backend() {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    };
    let files = std::fs::read_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations").join(folder))?.count();
    assert_eq!(applied, files as i64);
    Ok(())
}

/// The migration to one `jobs` table keeps every operation and dryrun, their kinds, versions,
/// statuses and results: the migrations before it run on an empty schema, rows go into the old
/// tables, then it runs.
pub async fn jobs_migration_keeps_operations_and_dryruns(db: &TestDb) -> Result<()> {
    use sqlx::Connection as _;
    let folder = match db.store.backend() {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations").join(folder);
    let mut files: Vec<_> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.sort();
    let jobs = files
        .iter()
        .position(|f| f.file_name().is_some_and(|n| n.to_string_lossy().ends_with("_jobs.sql")))
        .ok_or_else(|| anyhow::anyhow!("no jobs migration in {}", dir.display()))?;
    let before: Vec<String> = files[..jobs].iter().map(std::fs::read_to_string).collect::<std::io::Result<_>>()?;
    let migration = std::fs::read_to_string(&files[jobs])?;
    let rows = "INSERT INTO environments (id, name, settings, created_at, updated_at) VALUES ('e', 'prod', '{}', 1, 1); \
                INSERT INTO intent_versions (environment_id, version, document, created_at) VALUES ('e', 1, '{}', 1); \
                INSERT INTO operations (id, environment_id, kind, status, created_at, finished_at, result) \
                  VALUES ('o1', 'e', 'repair', 'done', 2, 3, '{\"deployed\":1}'), ('o2', 'e', 'deploy', 'interrupted', 4, 5, NULL); \
                INSERT INTO dryruns (id, environment_id, version, status, created_at, finished_at, report) \
                  VALUES ('d1', 'e', 1, 'failed', 6, 7, '{\"error\":\"x\"}'), ('d2', 'e', 1, 'running', 8, NULL, NULL);";
    let read = "SELECT id, kind, version, status, created_at, finished_at, result FROM jobs ORDER BY id";
    type Job = (String, String, Option<i64>, String, i64, Option<i64>, Option<String>);
    let (jobs, old_tables): (Vec<Job>, i64) = match db.store.backend() {
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
            for sql in &before {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.as_str())).execute(&mut c).await?;
            }
            sqlx::raw_sql(rows).execute(&mut c).await?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(migration.as_str())).execute(&mut c).await?;
            let old = sqlx::query_scalar("SELECT COUNT(*) FROM sqlite_master WHERE name IN ('operations', 'dryruns')")
                .fetch_one(&mut c)
                .await?;
            (sqlx::query_as(read).fetch_all(&mut c).await?, old)
        }
        Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(&db.location).await?;
            sqlx::raw_sql("CREATE SCHEMA legacy; SET search_path TO legacy")
                .execute(&mut c)
                .await?;
            for sql in &before {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.as_str())).execute(&mut c).await?;
            }
            sqlx::raw_sql(rows).execute(&mut c).await?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(migration.as_str())).execute(&mut c).await?;
            let old = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'legacy' AND table_name IN ('operations', 'dryruns')",
            )
            .fetch_one(&mut c)
            .await?;
            (sqlx::query_as(read).fetch_all(&mut c).await?, old)
        }
    };
    let s = |t: &str| t.to_string();
    assert_eq!(
        jobs,
        vec![
            (s("d1"), s("dryrun"), Some(1), s("failed"), 6, Some(7), Some(s(r#"{"error":"x"}"#))),
            (s("d2"), s("dryrun"), Some(1), s("running"), 8, None, None),
            (s("o1"), s("repair"), None, s("done"), 2, Some(3), Some(s(r#"{"deployed":1}"#))),
            (s("o2"), s("deploy"), None, s("interrupted"), 4, Some(5), None),
        ]
    );
    assert_eq!(old_tables, 0, "the twin tables are gone");
    Ok(())
}

/// Not an assertion on time: prints the figures (`cargo test -p orc-host --test it -- --nocapture batch_timings`).
pub async fn batch_timings_10k(db: &TestDb) -> Result<()> {
    const N: usize = 10_000;
    let store = &db.store;
    let env = new_env(store, "bench").await?;
    let states: Vec<ResourceState> = (0..N).map(|i| state(i, ResourceStatus::Available, 1)).collect();
    let mut figures = Vec::new();
    let mut time = |label: &'static str, started: Instant| figures.push((label, started.elapsed()));

    let t = Instant::now();
    store.upsert_states(&env, &states).await?;
    time("upsert_states, 10,000 new", t);

    let updated: Vec<ResourceState> = states
        .iter()
        .map(|s| ResourceState {
            version: 2,
            desired_hash: format!("{}2", s.desired_hash),
            ..s.clone()
        })
        .collect();
    let t = Instant::now();
    store.upsert_states(&env, &updated).await?;
    time("upsert_states, 10,000 existing", t);

    let deploying: Vec<StatusChange> = states
        .iter()
        .map(|s| StatusChange::new(s.resource_id.clone(), ResourceStatus::Deploying))
        .collect();
    let t = Instant::now();
    store.set_status(&env, &deploying).await?;
    time("set_status, 10,000 → deploying", t);

    let now = now_ms();
    let deployed: Vec<StatusChange> = updated
        .iter()
        .map(|s| StatusChange {
            deployed_hash: Some(s.desired_hash.clone()),
            last_deploy_at: Some(now),
            last_verified_at: Some(now),
            attempts: Attempts::Reset,
            ..StatusChange::new(s.resource_id.clone(), ResourceStatus::Deployed)
        })
        .collect();
    let t = Instant::now();
    store.set_status(&env, &deployed).await?;
    time("set_status, 10,000 → deployed", t);

    let actions: Vec<ActionRecord> = states
        .iter()
        .map(|s| action(env, &s.resource_id, ActionKind::Deploy, now))
        .collect();
    let t = Instant::now();
    store.insert_actions(&actions).await?;
    time("insert_actions, 10,000", t);

    let t = Instant::now();
    let loaded = store.load_states(&env).await?;
    time("load_states, 10,000", t);
    ensure!(loaded.len() == N && loaded.iter().all(|s| s.status == ResourceStatus::Deployed));
    let counts = store.status_counts(&env).await?;
    ensure!(counts == [(ResourceStatus::Deployed, N as i64)], "{counts:?}");

    let backend = store.backend();
    for (label, took) in figures {
        println!("store batch [{backend}] {label}: {:.1} ms", took.as_secs_f64() * 1e3);
    }
    Ok(())
}
