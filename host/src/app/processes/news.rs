//! News of process tasks for their watchers: the environment's scheduler sink hands each
//! persisted batch's task states to the watcher of the process they belong to, and to no other.
//!
//! With hundreds of operations under way, each watcher reading the environment's whole event
//! stream (every batch woke every watcher, which searched every event's JSON for its own tasks)
//! cost as much as the work it watched. The sink picks the states of process tasks out of a
//! batch before the store takes it ([`Follower::pick`], no serialising), and after the write
//! sends each to the watchers subscribed to its process at that moment. A watcher subscribes
//! before it looks at the store, so a state persisted after its look reaches it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use orc_manifest::Digest;
use tokio::sync::mpsc;

use crate::intent::ResourceId;
use crate::scheduler::events::{Delivery, Follower};
use crate::scheduler::{Event, ResourceStatus};
use crate::services::SET_PREFIX;

/// A state of one of a process's tasks, as persisted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskNews {
    /// The task's resource id.
    pub resource: String,
    pub status: ResourceStatus,
    pub deployed_hash: Option<Digest>,
}

type Subscribers = HashMap<String, Vec<(u64, mpsc::UnboundedSender<TaskNews>)>>;

/// One environment's watchers by process name (in `Running`, and its sink's follower).
#[derive(Default)]
pub(crate) struct ProcessNews {
    subscribers: Arc<Mutex<Subscribers>>,
    next: AtomicU64,
}

/// A watcher's subscription to its process's news; unsubscribed when dropped.
pub(crate) struct Subscription {
    news: Arc<ProcessNews>,
    process: String,
    id: u64,
    receiver: mpsc::UnboundedReceiver<TaskNews>,
}

impl ProcessNews {
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
    let id: ResourceId = resource.parse().ok()?;
    if id.resource_type != crate::clusters::planner::TASK_TYPE {
        return None;
    }
    let (set, _) = id.key.split_once('/')?;
    Some(set.strip_prefix(SET_PREFIX)?.to_string())
}

impl Follower for ProcessNews {
    fn pick(&self, events: &[Event]) -> Option<Delivery> {
        if self.subscribers().is_empty() {
            return None;
        }
        let picked: Vec<(String, TaskNews)> = events
            .iter()
            .filter_map(|event| match event {
                Event::State(s) => Some((
                    process_of(&s.resource)?,
                    TaskNews {
                        resource: s.resource.clone(),
                        status: s.status,
                        deployed_hash: s.deployed_hash,
                    },
                )),
                _ => None,
            })
            .collect();
        if picked.is_empty() {
            return None;
        }
        let subscribers = self.subscribers.clone();
        Some(Box::new(move || {
            let subscribers = lock(&subscribers);
            for (process, item) in picked {
                for (_, sender) in subscribers.get(&process).into_iter().flatten() {
                    let _ = sender.send(item.clone());
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
        let news = Arc::new(ProcessNews::default());
        let follower: &dyn Follower = &*news;
        assert!(
            follower
                .pick(&[state("task[n1,process.a/s/start]", ResourceStatus::Deployed)])
                .is_none(),
            "nobody watches"
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
        // A watcher that subscribes between the pick and the delivery gets it too.
        let mut late = news.subscribe("a");
        delivery();
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
        drop(a);
        drop(late);
        assert!(!news.subscribers().contains_key("a"), "unsubscribed when dropped");
        assert!(
            follower
                .pick(&[state("task[n1,process.a/s/start]", ResourceStatus::Deployed)])
                .is_some_and(|d| {
                    d();
                    true
                })
        );
        assert!(b.receiver.try_recv().is_err());
    }
}
