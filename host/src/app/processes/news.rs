//! News of process tasks for their watchers: the environment's scheduler sink hands each
//! persisted batch's task states to the watcher of the process they belong to, and to no other;
//! and the process tasks' states as persisted, kept in memory for the watchers' steps and the
//! process views (see [`ProcessNews::states_of`]).
//!
//! With hundreds of operations under way, each watcher reading the environment's whole event
//! stream (every batch woke every watcher, which searched every event's JSON for its own tasks)
//! cost as much as the work it watched. The sink picks the states of process tasks out of a
//! batch before the store takes it ([`Follower::pick`], no serialising), and after the write
//! sends each to the watchers subscribed to its process at that moment. A watcher subscribes
//! before it looks at the store, so a state persisted after its look reaches it.
//!
//! Each watcher's step and each view of a process read its tasks' states: with hundreds of
//! operations under way, a statement each was a fifth of the host's work on SQLite. The states
//! of process tasks are kept here as the store holds them, the way [`StatusCounts`] keeps the
//! counts: seeded from the states read when the environment starts, moved by each batch once it
//! is persisted (a state replaces its resource's row, keeping the stored times where it leaves
//! them unchanged; a release removes the rows it dropped and makes the others its own, a complete
//! one the rows of every other version), before the batch's news
//! is sent, so what a watcher reads is never behind the news it waits for. A batch the store
//! could not take leaves them unknown: readers go to the store from then on. The scheduler's
//! sink is the only writer of an environment's states after it starts, so nothing else moves
//! the rows under them.
//!
//! [`StatusCounts`]: crate::scheduler::events::StatusCounts

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use orc_manifest::Digest;
use tokio::sync::mpsc;

use crate::intent::ResourceId;
use crate::processes::SET_PREFIX;
use crate::scheduler::events::{Delivery, Follower};
use crate::scheduler::persistence::stored_state;
use crate::scheduler::{Event, ResourceStatus};
use crate::store::ResourceState;

/// A state of one of a process's tasks, as persisted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskNews {
    /// The task's resource id.
    pub resource: String,
    pub status: ResourceStatus,
    pub deployed_hash: Option<Digest>,
}

type Subscribers = HashMap<String, Vec<(u64, mpsc::UnboundedSender<TaskNews>)>>;

/// The process tasks' states as persisted, by resource id; `None`: not known (a batch was lost).
type States = Option<HashMap<String, ResourceState>>;

/// One environment's watchers by process name, and its process tasks' states (in `Running`, and
/// its sink's follower).
#[derive(Default)]
pub(crate) struct ProcessNews {
    subscribers: Arc<Mutex<Subscribers>>,
    next: AtomicU64,
    states: Arc<Mutex<States>>,
}

/// A watcher's subscription to its process's news; unsubscribed when dropped.
pub(crate) struct Subscription {
    news: Arc<ProcessNews>,
    process: String,
    id: u64,
    receiver: mpsc::UnboundedReceiver<TaskNews>,
}

impl ProcessNews {
    /// News for an environment whose stored states are `stored` (read when it starts, before its
    /// scheduler writes any).
    pub(crate) fn seeded<'a>(stored: impl IntoIterator<Item = &'a ResourceState>) -> ProcessNews {
        let states = stored
            .into_iter()
            .filter(|s| process_of(&s.resource_id).is_some())
            .map(|s| (s.resource_id.clone(), s.clone()))
            .collect();
        ProcessNews {
            states: Arc::new(Mutex::new(Some(states))),
            ..ProcessNews::default()
        }
    }

    /// The persisted states of `resources` (process tasks) that have one, by resource id, as
    /// [`crate::store::Store::states_of`] would answer; `None` if they are not known here.
    pub(crate) fn states_of<'a>(&self, resources: impl IntoIterator<Item = &'a str>) -> Option<HashMap<String, ResourceState>> {
        let states = self.states.lock().expect("process task states");
        let states = states.as_ref()?;
        Some(
            resources
                .into_iter()
                .filter_map(|id| states.get(id).map(|s| (id.to_string(), s.clone())))
                .collect(),
        )
    }

    pub(crate) fn subscribe(self: &Arc<Self>, process: &str) -> Subscription {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = mpsc::unbounded_channel();
        self.subscribers().entry(process.to_string()).or_default().push((id, sender));
        Subscription {
            news: self.clone(),
            process: process.to_string(),
            id,
            receiver,
        }
    }

    fn subscribers(&self) -> std::sync::MutexGuard<'_, Subscribers> {
        lock(&self.subscribers)
    }
}

impl Subscription {
    /// The next news; never ends while subscribed.
    pub(crate) async fn next(&mut self) -> TaskNews {
        match self.receiver.recv().await {
            Some(news) => news,
            // Every sender is in the subscribers map until this is dropped.
            None => std::future::pending().await,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut subscribers = self.news.subscribers();
        if let Some(list) = subscribers.get_mut(&self.process) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                subscribers.remove(&self.process);
            }
        }
    }
}

fn lock(subscribers: &Mutex<Subscribers>) -> std::sync::MutexGuard<'_, Subscribers> {
    subscribers.lock().expect("process news")
}

/// The process a task's resource id belongs to: `task[node,process.NAME/service/step]`.
fn process_of(resource: &str) -> Option<String> {
    // Most resources of a large environment are not tasks: no parse for them.
    if !resource.starts_with(crate::clusters::planner::TASK_TYPE) {
        return None;
    }
    let id: ResourceId = resource.parse().ok()?;
    if id.resource_type != crate::clusters::planner::TASK_TYPE {
        return None;
    }
    let (set, _) = id.key.split_once('/')?;
    Some(set.strip_prefix(SET_PREFIX)?.to_string())
}

impl Follower for ProcessNews {
    fn pick(&self, events: &[Event]) -> Option<Delivery> {
        let mut picked = Vec::new();
        let mut released = None;
        for event in events {
            match event {
                Event::State(s) => {
                    if let Some(process) = process_of(&s.resource) {
                        picked.push((process, s.clone()));
                    }
                }
                Event::Released {
                    version,
                    dropped,
                    complete,
                } => {
                    let dropped: Vec<String> = dropped.iter().filter(|id| process_of(id).is_some()).cloned().collect();
                    released = Some((*version as i64, *complete, dropped));
                }
                Event::Action { .. } => {}
            }
        }
        if picked.is_empty() && released.is_none() {
            return None;
        }
        let (subscribers, states) = (self.subscribers.clone(), self.states.clone());
        Some(Box::new(move |persisted| {
            {
                // The states first: a watcher woken by the news reads them.
                let mut states = states.lock().expect("process task states");
                match (persisted, states.as_mut()) {
                    (true, Some(known)) => {
                        for (_, s) in &picked {
                            let state = stored_state(s, known.get(&s.resource));
                            known.insert(s.resource.clone(), state);
                        }
                        match released {
                            Some((version, true, _)) => known.retain(|_, s| s.version == version),
                            Some((version, false, dropped)) => {
                                for id in dropped {
                                    known.remove(&id);
                                }
                                for s in known.values_mut() {
                                    s.version = version;
                                }
                            }
                            None => {}
                        }
                    }
                    (true, None) => {}
                    (false, _) => *states = None,
                }
            }
            let subscribers = lock(&subscribers);
            if subscribers.is_empty() {
                return;
            }
            for (process, s) in picked {
                for (_, sender) in subscribers.get(&process).into_iter().flatten() {
                    let _ = sender.send(TaskNews {
                        resource: s.resource.clone(),
                        status: s.status,
                        deployed_hash: s.deployed_hash,
                    });
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::ResourceState;

    fn state(resource: &str, status: ResourceStatus) -> Event {
        ResourceState::event(resource, 1, status)
    }

    #[test]
    fn a_task_state_reaches_the_watchers_of_its_process_only_after_the_write() {
        let news = Arc::new(ProcessNews::seeded([]));
        let follower: &dyn Follower = &*news;
        assert!(
            follower
                .pick(&[state("file[n1,/etc/process.a/x]", ResourceStatus::Deployed)])
                .is_none(),
            "nothing of a process"
        );
        let mut a = news.subscribe("a");
        let mut b = news.subscribe("b");
        let batch = [
            state("task[n1,process.a/s/start]", ResourceStatus::Deployed),
            state("task[n1,cluster.a/s/start]", ResourceStatus::Deployed),
            state("file[n1,/etc/process.a/x]", ResourceStatus::Failed),
            state("task[n2,process.b/s/configure]", ResourceStatus::Failed),
        ];
        let delivery = follower.pick(&batch).expect("news for a and b");
        assert!(a.receiver.try_recv().is_err(), "nothing before the delivery (the write)");
        assert_eq!(news.states_of(["task[n1,process.a/s/start]"]).map(|s| s.len()), Some(0));
        // A watcher that subscribes between the pick and the delivery gets it too.
        let mut late = news.subscribe("a");
        delivery(true);
        assert_eq!(
            a.receiver.try_recv().map(|n| n.resource).as_deref(),
            Ok("task[n1,process.a/s/start]")
        );
        assert!(
            a.receiver.try_recv().is_err(),
            "a cluster's task or another type is not a process's"
        );
        assert_eq!(late.receiver.try_recv().map(|n| n.status), Ok(ResourceStatus::Deployed));
        assert_eq!(b.receiver.try_recv().map(|n| n.status), Ok(ResourceStatus::Failed));
        let known = news
            .states_of(["task[n1,process.a/s/start]", "task[n1,cluster.a/s/start]"])
            .expect("known");
        assert_eq!(
            known.keys().collect::<Vec<_>>(),
            ["task[n1,process.a/s/start]"],
            "only processes' tasks are kept"
        );
        drop(a);
        drop(late);
        assert!(!news.subscribers().contains_key("a"), "unsubscribed when dropped");
        let delivery = follower.pick(&[state("task[n1,process.a/s/start]", ResourceStatus::Deployed)]);
        delivery.expect("a state of a process task")(true);
        assert!(b.receiver.try_recv().is_err());
        // A batch the store did not take: the states are not known any more.
        follower
            .pick(&[state("task[n1,process.a/s/start]", ResourceStatus::Failed)])
            .expect("picked")(false);
        assert!(news.states_of(["task[n1,process.a/s/start]"]).is_none());
    }

    /// A small deterministic generator (xorshift), so that a failing case can be re-run.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Model-based: random batches of states (process tasks and others, times left unchanged or
    /// not, errors) and releases, written through the real store sink into SQLite; after each
    /// batch, what the news keeps for the process tasks is exactly what the store answers.
    #[tokio::test]
    async fn the_kept_states_are_the_stored_ones_after_every_batch() {
        use crate::executor::ActionError;
        use crate::scheduler::ResourceState as SchedulerState;
        use crate::scheduler::persistence::StoreSink;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open_sqlite(dir.path().join("orc.db")).await.unwrap();
        let env = store
            .create_environment("mirrored", &crate::policy::settings::EnvironmentSettings::default())
            .await
            .unwrap();
        let sink = StoreSink::new(store.clone(), env.id);
        let ids = [
            "task[n1,process.a/s/start]",
            "task[n1,process.a/s/install]",
            "task[n2,process.b/s/configure]",
            "task[n2,process.b-c/t/start]",
            "task[n1,cluster.a/s/start]",
            "file[n1,/tmp/process.a/x]",
        ];
        for seed in 1..=12u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let news = ProcessNews::seeded(&store.load_states(&env.id).await.unwrap());
            let mut version = 1 + seed * 100;
            for _ in 0..30 {
                let mut batch = Vec::new();
                for _ in 0..1 + rng.below(6) {
                    if rng.below(8) == 0 {
                        version += 1;
                        // Complete (every other version's rows go) or not (the dropped go, the
                        // rest are renewed).
                        let dropped = ids.iter().filter(|_| rng.below(4) == 0).map(|id| id.to_string()).collect();
                        batch.push(Event::Released {
                            version,
                            dropped,
                            complete: rng.below(2) == 0,
                        });
                        continue;
                    }
                    let time = |rng: &mut Rng| (rng.below(2) == 0).then(|| rng.below(1_000_000) as i64);
                    batch.push(Event::State(SchedulerState {
                        resource: ids[rng.below(ids.len() as u64) as usize].to_string(),
                        version: version - rng.below(2),
                        status: ResourceStatus::ALL[rng.below(ResourceStatus::ALL.len() as u64) as usize],
                        desired_hash: Digest::of(&[rng.below(3) as u8]),
                        deployed_hash: (rng.below(2) == 0).then(|| Digest::of(&[rng.below(3) as u8])),
                        attempts: rng.below(4) as u32,
                        last_error: (rng.below(3) == 0).then(|| ActionError {
                            code: "retryable".into(),
                            message: format!("try {}", rng.below(9)),
                        }),
                        last_deploy_at: time(&mut rng),
                        last_verified_at: time(&mut rng),
                        next_retry_at: time(&mut rng),
                    }));
                }
                let delivery = (&news as &dyn Follower).pick(&batch);
                let persisted = sink.persist(batch).await;
                assert!(persisted);
                if let Some(delivery) = delivery {
                    delivery(persisted);
                }
                let process_ids: Vec<String> = ids.iter().filter(|id| process_of(id).is_some()).map(|id| id.to_string()).collect();
                let stored: HashMap<String, crate::store::ResourceState> = store
                    .states_of(&env.id, &process_ids)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|s| (s.resource_id.clone(), s))
                    .collect();
                let kept = news.states_of(ids).expect("known");
                assert_eq!(kept, stored, "seed {seed}");
            }
        }
    }
}
