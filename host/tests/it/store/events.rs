//! The environments' recorded event streams (`event_batches`): batches written with a
//! scheduler's progress, under its owner's fence, read back after any number; numbers that
//! increase across a takeover; a stale owner's batch refused with the rest of its progress;
//! old batches forgotten; and a reader told when what it asks for no longer joins on.

use std::time::Duration;

use anyhow::{Result, ensure};
use orc_host::policy::settings::EnvironmentSettings;
use orc_host::store::{EnvironmentId, EventLog, Fence, Progress, RecordedEvents, ReplicaId, StoreError, first_seq_of, now_ms};

use super::harness::TestDb;

/// `n` events numbered from `first`, as the sink writes them.
fn lines(first: i64, n: i64) -> String {
    (first..first + n).map(|seq| format!("state {{\"seq\":{seq}}}\n")).collect()
}

async fn record(db: &TestDb, fence: &Fence, first: i64, n: i64, prev: Option<i64>, forget: Option<i64>) -> Result<(), StoreError> {
    let text = lines(first, n);
    let progress = Progress {
        events: Some(EventLog {
            first_seq: first,
            last_seq: first + n - 1,
            prev_seq: prev,
            events: &text,
            recorded_at: now_ms(),
        }),
        forget_events_before: forget,
        ..Progress::default()
    };
    db.store.record_progress(&fence.env, Some(fence), &progress).await
}

fn seqs(batches: &[RecordedEvents]) -> Result<Vec<i64>> {
    let mut out = Vec::new();
    for b in batches {
        for e in b.events()? {
            ensure!(e.data == format!("{{\"seq\":{}}}", e.seq), "{e:?}");
            ensure!(e.name == "state");
            out.push(e.seq);
        }
    }
    Ok(out)
}

pub async fn recorded_events_are_read_after_any_number_across_owners(db: &TestDb) -> Result<()> {
    let store = &db.store;
    let env: EnvironmentId = store.create_environment("streamed", &EnvironmentSettings::default()).await?.id;
    let (a, b) = (ReplicaId::random(), ReplicaId::random());
    let ttl = Duration::from_secs(60);
    let first = store.claim(&env, a, ttl, None).await?.expect("free");
    ensure!(store.last_event_seq(&env).await?.is_none());

    // Three batches of the first owner: 3, 1 and 4 events.
    let base = first_seq_of(first.epoch);
    record(db, &first, base, 3, None, None).await?;
    record(db, &first, base + 3, 1, Some(base + 2), None).await?;
    record(db, &first, base + 4, 4, Some(base + 3), None).await?;
    ensure!(store.last_event_seq(&env).await? == Some(base + 7));
    let all = store.events_after(&env, -1, 100).await?;
    ensure!(seqs(&all)? == (base..base + 8).collect::<Vec<_>>());
    // After a number inside a batch: that batch (the reader skips what it has) and the rest.
    let from_middle = store.events_after(&env, base + 1, 100).await?;
    ensure!(from_middle.len() == 3 && from_middle[0].first_seq == base);
    ensure!(store.events_after(&env, base + 3, 100).await?.len() == 1);
    ensure!(store.events_after(&env, base + 7, 100).await?.is_empty());
    ensure!(store.events_after(&env, -1, 2).await?.len() == 2, "at most the limit");
    for pair in all.windows(2) {
        ensure!(
            pair[1].prev_seq == Some(pair[0].last_seq),
            "each batch names the one before: {pair:?}"
        );
        ensure!(pair[1].follows(pair[0].last_seq));
    }

    // A takeover: the new owner numbers from its epoch's start, above everything before; the
    // old owner's batch is refused, and nothing of it recorded.
    let second = store.claim(&env, b, ttl, Some(a)).await?.expect("taken over");
    ensure!(second.epoch > first.epoch);
    let stale = record(db, &first, base + 8, 2, Some(base + 7), None).await;
    ensure!(matches!(stale, Err(StoreError::Fenced { .. })), "{stale:?}");
    ensure!(store.last_event_seq(&env).await? == Some(base + 7), "nothing of the stale batch");
    let next = first_seq_of(second.epoch);
    ensure!(next > base + 7);
    record(db, &second, next, 2, Some(base + 7), None).await?;
    let across = store.events_after(&env, base + 7, 100).await?;
    ensure!(across.len() == 1 && across[0].follows(base + 7), "the new owner's batch joins on");
    ensure!(seqs(&store.events_after(&env, base + 5, 100).await?)? == vec![base + 4, base + 5, base + 6, base + 7, next, next + 1]);

    // Forgetting what is older than a time keeps the batch written with it: a reader that asks
    // for what was forgotten is told, since the batch it gets does not join on.
    tokio::time::sleep(Duration::from_millis(5)).await;
    record(db, &second, next + 2, 1, Some(next + 1), Some(now_ms())).await?;
    let kept = store.events_after(&env, -1, 100).await?;
    ensure!(seqs(&kept)? == vec![next + 2], "{kept:?}");
    ensure!(!kept[0].follows(base + 3), "a reader at an old number does not join on");
    ensure!(kept[0].follows(next + 1));

    // Gone with the environment.
    store.delete_environment(&env).await?;
    ensure!(store.events_after(&env, -1, 100).await?.is_empty());
    Ok(())
}
