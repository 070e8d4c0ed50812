//! Prometheus metrics of the host, in one [`Metrics`] registry rendered as OpenMetrics text by
//! `GET /metrics`: resources per environment and status, resource actions by trigger and
//! outcome with their durations, intent versions released, and HTTP requests by route.
//!
//! The resource and action figures are fed by the schedulers' events: each environment's sink
//! has an [`EnvironmentMetrics`] observer ([`Metrics::environment`]), so they cost nothing at
//! scrape time and need no database. A status
//! gauge moves a resource from its previous status to its new one, so `Metrics` remembers the
//! last status of every resource; [`Metrics::seed`] starts an environment from what the store
//! holds when its scheduler resumes.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::executor::Outcome;
use crate::scheduler::ResourceStatus;
use crate::scheduler::events::Observer;
use crate::scheduler::subscribers::StreamStats;
use crate::scheduler::{Event, Trigger};

/// The content type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResourceLabels {
    environment: String,
    status: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ActionLabels {
    environment: String,
    trigger: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EnvironmentLabels {
    environment: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteLabels {
    method: String,
    route: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Resource actions: 100 µs to about 26 s, ×4 per bucket.
fn action_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 4.0, 10))
}

/// HTTP requests: 250 µs to about 16 s, ×4 per bucket.
fn request_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 4.0, 9))
}

/// The host's metrics. Shared (`&self` everywhere); cheap to update from any task.
pub struct Metrics {
    registry: Registry,
    resources: Family<ResourceLabels, Gauge>,
    actions: Family<ActionLabels, Counter>,
    action_seconds: Histograms<EnvironmentLabels>,
    releases: Family<EnvironmentLabels, Counter>,
    scheduler_failures: Family<EnvironmentLabels, Counter>,
    released_version: Family<EnvironmentLabels, Gauge>,
    requests: Family<RequestLabels, Counter>,
    request_seconds: Histograms<RouteLabels>,
    /// Per environment, the last status of each resource, keyed by a 64-bit hash of its id:
    /// about 20 bytes a resource instead of a copy of every id. Two ids of one environment
    /// sharing a hash (odds about 3·10⁻¹⁰ for 100,000 resources) would only skew the gauge.
    statuses: Mutex<HashMap<String, HashMap<u64, ResourceStatus>>>,
    hasher: RandomState,
    /// The event streams' queued bytes and lagged subscribers, moved by the streams themselves.
    streams: StreamStats,
    /// Environments this replica claimed, and those it stopped because their lease was gone.
    takeovers: Counter,
    losses: Counter,
    /// Environments this replica holds.
    held: Gauge,
    /// Writes the database refused by their fence (`Store::fenced_writes`, read at each scrape).
    fenced_writes: Counter,
    /// Seconds since this replica last renewed its leases (read at each scrape).
    lease_age: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("orc");
        let resources = Family::<ResourceLabels, Gauge>::default();
        registry.register("resources", "Resources per environment and status", resources.clone());
        let actions = Family::<ActionLabels, Counter>::default();
        registry.register(
            "actions",
            "Resource actions (read, diff and enforce) by environment, trigger and outcome",
            actions.clone(),
        );
        let action_seconds: Histograms<EnvironmentLabels> = Family::new_with_constructor(action_buckets);
        registry.register("action_duration_seconds", "Duration of resource actions", action_seconds.clone());
        let releases = Family::<EnvironmentLabels, Counter>::default();
        registry.register("intent_versions_released", "Intent versions released", releases.clone());
        let scheduler_failures = Family::<EnvironmentLabels, Counter>::default();
        registry.register(
            "scheduler_failures",
            "Environment schedulers that stopped on their own (the environment answers 503 until the host restarts)",
            scheduler_failures.clone(),
        );
        let released_version = Family::<EnvironmentLabels, Gauge>::default();
        registry.register(
            "released_intent_version",
            "The intent version each environment runs",
            released_version.clone(),
        );
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register("http_requests", "HTTP requests by method, route and status", requests.clone());
        let request_seconds: Histograms<RouteLabels> = Family::new_with_constructor(request_buckets);
        registry.register(
            "http_request_duration_seconds",
            "Time to answer HTTP requests, by method and route",
            request_seconds.clone(),
        );
        let streams = StreamStats::default();
        registry.register(
            "event_stream_buffered_bytes",
            "Bytes of events queued for event stream subscribers (each bounded by event_buffer_bytes)",
            streams.buffered_bytes.clone(),
        );
        registry.register(
            "event_stream_lagged",
            "Event stream subscribers ended because they fell behind their buffer",
            streams.lagged.clone(),
        );
        let takeovers = Counter::default();
        registry.register(
            "environment_takeovers",
            "Environments this replica claimed (at its start, from a replica that ended or was drained, or new)",
            takeovers.clone(),
        );
        let losses = Counter::default();
        registry.register(
            "environment_losses",
            "Environments this replica stopped at once because their lease was gone (its writes for them are refused from then on)",
            losses.clone(),
        );
        let held = Gauge::default();
        registry.register("environments_held", "Environments this replica runs", held.clone());
        let fenced_writes = Counter::default();
        registry.register(
            "fenced_writes",
            "Writes for an environment refused because this replica no longer held it under the epoch they were made in (the action log, states, events, plugin state, jobs)",
            fenced_writes.clone(),
        );
        let lease_age = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "lease_renewal_age_seconds",
            "Seconds since this replica last renewed its leases (past the self-fencing time, 3 s, it stops every environment it runs)",
            lease_age.clone(),
        );
        Metrics {
            fenced_writes,
            lease_age,
            takeovers,
            losses,
            held,
            streams,
            registry,
            resources,
            actions,
            action_seconds,
            releases,
            scheduler_failures,
            released_version,
            requests,
            request_seconds,
            statuses: Mutex::new(HashMap::new()),
            hasher: RandomState::new(),
        }
    }

    /// What every environment's event stream moves.
    pub fn streams(&self) -> &StreamStats {
        &self.streams
    }

    /// Starts (or restarts) `environment` from the stored status of each of its resources, as
    /// its scheduler resumes; its resource gauges are set to exactly these counts.
    pub fn seed<'a>(&self, environment: &str, states: impl IntoIterator<Item = (&'a str, ResourceStatus)>) {
        let last: HashMap<u64, ResourceStatus> = states.into_iter().map(|(id, status)| (self.hasher.hash_one(id), status)).collect();
        let mut counts: HashMap<ResourceStatus, i64> = HashMap::new();
        for status in last.values() {
            *counts.entry(*status).or_default() += 1;
        }
        for &status in ResourceStatus::ALL {
            self.resources
                .get_or_create(&resource_labels(environment, status))
                .set(counts.get(&status).copied().unwrap_or(0));
        }
        self.lock_statuses().insert(environment.to_string(), last);
    }

    /// The [`Observer`] of one environment's events, for its scheduler's sink.
    pub fn environment(self: &Arc<Self>, environment: &str) -> EnvironmentMetrics {
        EnvironmentMetrics {
            metrics: self.clone(),
            environment: environment.to_string(),
        }
    }

    /// Counts a batch of one environment's scheduler events (in the order the sink got them).
    pub fn observe(&self, environment: &str, events: &[Event]) {
        let mut moved: HashMap<ResourceStatus, i64> = HashMap::new();
        let mut actions: HashMap<(&'static str, &'static str), u64> = HashMap::new();
        let mut durations: Vec<Duration> = Vec::new();
        {
            let mut statuses = self.lock_statuses();
            if !statuses.contains_key(environment) {
                statuses.insert(environment.to_string(), HashMap::new());
            }
            let last = statuses.get_mut(environment).expect("just inserted");
            for event in events {
                match event {
                    Event::State(state) => {
                        let previous = last.insert(self.hasher.hash_one(state.resource.as_str()), state.status);
                        if previous != Some(state.status) {
                            *moved.entry(state.status).or_default() += 1;
                            if let Some(previous) = previous {
                                *moved.entry(previous).or_default() -= 1;
                            }
                        }
                    }
                    Event::Action { trigger, report, .. } => {
                        *actions.entry((trigger_name(*trigger), outcome_name(report.outcome))).or_default() += 1;
                        durations.push(report.duration);
                    }
                    Event::Released { dropped, .. } => {
                        for resource in dropped {
                            if let Some(previous) = last.remove(&self.hasher.hash_one(resource.as_str())) {
                                *moved.entry(previous).or_default() -= 1;
                            }
                        }
                    }
                }
            }
        }
        for (status, delta) in moved {
            if delta != 0 {
                self.resources.get_or_create(&resource_labels(environment, status)).inc_by(delta);
            }
        }
        for ((trigger, outcome), n) in actions {
            let labels = ActionLabels {
                environment: environment.to_string(),
                trigger,
                outcome,
            };
            self.actions.get_or_create(&labels).inc_by(n);
        }
        if !durations.is_empty() {
            let histogram = self.action_seconds.get_or_create(&environment_labels(environment));
            for d in durations {
                histogram.observe(d.as_secs_f64());
            }
        }
    }

    /// An intent version of `environment` was released (a submission with `auto_deploy`, a
    /// release, a rollback).
    pub fn released(&self, environment: &str, version: i64) {
        let labels = environment_labels(environment);
        self.releases.get_or_create(&labels).inc();
        self.released_version.get_or_create(&labels).set(version);
    }

    /// The scheduler of `environment` stopped on its own.
    pub fn scheduler_failed(&self, environment: &str) {
        self.scheduler_failures.get_or_create(&environment_labels(environment)).inc();
    }

    /// This replica claimed an environment; it now holds `held`.
    pub fn took_over(&self, held: usize) {
        self.takeovers.inc();
        self.held.set(held as i64);
    }

    /// This replica stopped an environment whose lease was gone; it now holds `held`.
    pub fn lost(&self, held: usize) {
        self.losses.inc();
        self.held.set(held as i64);
    }

    /// What is read rather than counted: the writes refused by their fence so far, and how long
    /// ago the leases were renewed.
    pub fn replica(&self, fenced_writes: u64, lease_age: std::time::Duration) {
        let counted = self.fenced_writes.get();
        if fenced_writes > counted {
            self.fenced_writes.inc_by(fenced_writes - counted);
        }
        self.lease_age.set(lease_age.as_secs_f64());
    }

    /// This replica now holds `held` environments.
    pub fn holding(&self, held: usize) {
        self.held.set(held as i64);
    }

    /// `environment` was deleted: its gauges go away (counters stay, as counters do).
    pub fn forget(&self, environment: &str) {
        self.lock_statuses().remove(environment);
        for &status in ResourceStatus::ALL {
            self.resources.remove(&resource_labels(environment, status));
        }
        self.released_version.remove(&environment_labels(environment));
    }

    /// One answered HTTP request. `route` is the matched route template (`/api/v1/environments/{env}`),
    /// never the raw path, so that the number of series stays bounded.
    pub fn request(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let labels = RequestLabels {
            method: method.to_string(),
            route: route.to_string(),
            status,
        };
        self.requests.get_or_create(&labels).inc();
        let labels = RouteLabels {
            method: labels.method,
            route: labels.route,
        };
        self.request_seconds.get_or_create(&labels).observe(elapsed.as_secs_f64());
    }

    /// Everything, in the OpenMetrics text format ([`CONTENT_TYPE`]), ending with `# EOF`.
    pub fn render(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }

    fn lock_statuses(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<u64, ResourceStatus>>> {
        // The map is consistent after every statement; a panic elsewhere does not spoil it.
        self.statuses.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// [`Metrics::observe`] for one environment: what its scheduler's sink calls with every batch.
pub struct EnvironmentMetrics {
    metrics: Arc<Metrics>,
    environment: String,
}

impl Observer for EnvironmentMetrics {
    fn observe(&self, events: &[Event]) {
        self.metrics.observe(&self.environment, events);
    }
}

fn resource_labels(environment: &str, status: ResourceStatus) -> ResourceLabels {
    ResourceLabels {
        environment: environment.to_string(),
        status: status.as_str(),
    }
}

fn environment_labels(environment: &str) -> EnvironmentLabels {
    EnvironmentLabels {
        environment: environment.to_string(),
    }
}

fn trigger_name(trigger: Trigger) -> &'static str {
    match trigger {
        Trigger::Deploy => "deploy",
        Trigger::Repair => "repair",
        Trigger::Retry => "retry",
    }
}

fn outcome_name(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Unchanged => "unchanged",
        Outcome::Changed => "changed",
        Outcome::WouldChange => "would_change",
        Outcome::Failed => "failed",
        Outcome::Unavailable => "unavailable",
        Outcome::Skipped => "skipped",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::{ActionReport, Mode};
    use crate::scheduler::ResourceState;

    fn state(resource: &str, status: ResourceStatus) -> Event {
        ResourceState::event(resource, 1, status)
    }

    fn action(resource: &str, trigger: Trigger, outcome: Outcome, millis: u64) -> Event {
        Event::Action {
            version: 1,
            trigger,
            report: ActionReport {
                resource: resource.to_string(),
                mode: Mode::Deploy,
                outcome,
                changes: Vec::new(),
                messages: Vec::new(),
                error: None,
                started_at: 0,
                duration: Duration::from_millis(millis),
            },
        }
    }

    /// The sample lines (not comments) of the exposition, for exact comparisons.
    fn samples(metrics: &Metrics, prefix: &str) -> Vec<String> {
        let mut lines: Vec<String> = metrics
            .render()
            .lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_string)
            .collect();
        lines.sort();
        lines
    }

    fn resources(metrics: &Metrics, environment: &str) -> Vec<String> {
        samples(metrics, &format!("orc_resources{{environment=\"{environment}\""))
    }

    #[test]
    fn the_exposition_is_openmetrics_with_help_types_and_eof() {
        let metrics = Metrics::new();
        metrics.observe(
            "dev",
            &[
                state("file[local,/a]", ResourceStatus::Available),
                action("file[local,/a]", Trigger::Deploy, Outcome::Changed, 1),
            ],
        );
        let text = metrics.render();
        assert!(
            text.contains("# HELP orc_resources Resources per environment and status."),
            "{text}"
        );
        assert!(text.contains("# TYPE orc_resources gauge"), "{text}");
        assert!(text.contains("# TYPE orc_actions counter"), "{text}");
        assert!(text.contains("# TYPE orc_action_duration_seconds histogram"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn resources_move_between_statuses_as_their_states_change() {
        let metrics = Metrics::new();
        metrics.observe(
            "dev",
            &[
                state("file[local,/a]", ResourceStatus::Available),
                state("file[local,/b]", ResourceStatus::Available),
                state("file[local,/a]", ResourceStatus::Deploying),
            ],
        );
        assert_eq!(
            resources(&metrics, "dev"),
            [
                r#"orc_resources{environment="dev",status="available"} 1"#,
                r#"orc_resources{environment="dev",status="deploying"} 1"#,
            ]
        );
        metrics.observe(
            "dev",
            &[
                state("file[local,/a]", ResourceStatus::Deployed),
                state("file[local,/b]", ResourceStatus::Deploying),
                state("file[local,/b]", ResourceStatus::Failed),
                // The same status again is no move.
                state("file[local,/a]", ResourceStatus::Deployed),
            ],
        );
        assert_eq!(
            resources(&metrics, "dev"),
            [
                r#"orc_resources{environment="dev",status="available"} 0"#,
                r#"orc_resources{environment="dev",status="deployed"} 1"#,
                r#"orc_resources{environment="dev",status="deploying"} 0"#,
                r#"orc_resources{environment="dev",status="failed"} 1"#,
            ]
        );
        // Environments are counted apart.
        metrics.observe("prod", &[state("file[local,/a]", ResourceStatus::Available)]);
        assert_eq!(
            resources(&metrics, "prod"),
            [r#"orc_resources{environment="prod",status="available"} 1"#]
        );
        assert_eq!(resources(&metrics, "dev").len(), 4);
    }

    #[test]
    fn a_seeded_environment_continues_from_the_stored_statuses() {
        let metrics = Metrics::new();
        metrics.seed(
            "dev",
            [
                ("file[local,/a]", ResourceStatus::Deployed),
                ("file[local,/b]", ResourceStatus::Deployed),
                ("file[local,/c]", ResourceStatus::Failed),
            ],
        );
        assert_eq!(
            resources(&metrics, "dev"),
            [
                r#"orc_resources{environment="dev",status="available"} 0"#,
                r#"orc_resources{environment="dev",status="deployed"} 2"#,
                r#"orc_resources{environment="dev",status="deploying"} 0"#,
                r#"orc_resources{environment="dev",status="failed"} 1"#,
                r#"orc_resources{environment="dev",status="skipped"} 0"#,
                r#"orc_resources{environment="dev",status="unavailable"} 0"#,
            ]
        );
        // The resumed scheduler re-announces a known resource: no double count.
        metrics.observe(
            "dev",
            &[
                state("file[local,/a]", ResourceStatus::Deployed),
                state("file[local,/c]", ResourceStatus::Available),
            ],
        );
        let dev = resources(&metrics, "dev");
        assert!(
            dev.contains(&r#"orc_resources{environment="dev",status="deployed"} 2"#.to_string()),
            "{dev:?}"
        );
        assert!(
            dev.contains(&r#"orc_resources{environment="dev",status="failed"} 0"#.to_string()),
            "{dev:?}"
        );
        assert!(
            dev.contains(&r#"orc_resources{environment="dev",status="available"} 1"#.to_string()),
            "{dev:?}"
        );
        // Seeding again replaces, never adds.
        metrics.seed("dev", [("file[local,/a]", ResourceStatus::Deployed)]);
        let dev = resources(&metrics, "dev");
        assert!(
            dev.contains(&r#"orc_resources{environment="dev",status="deployed"} 1"#.to_string()),
            "{dev:?}"
        );
        assert!(
            dev.contains(&r#"orc_resources{environment="dev",status="available"} 0"#.to_string()),
            "{dev:?}"
        );
        metrics.forget("dev");
        assert!(resources(&metrics, "dev").is_empty());
    }

    #[test]
    fn an_environment_observer_counts_under_its_name() {
        let metrics = Arc::new(Metrics::new());
        let observer: Arc<dyn Observer> = Arc::new(metrics.environment("prod"));
        observer.observe(&[state("file[local,/a]", ResourceStatus::Deploying)]);
        assert_eq!(
            resources(&metrics, "prod"),
            [r#"orc_resources{environment="prod",status="deploying"} 1"#]
        );
    }

    #[test]
    fn actions_are_counted_by_trigger_and_outcome_and_timed() {
        let metrics = Metrics::new();
        metrics.observe(
            "dev",
            &[
                action("file[local,/a]", Trigger::Deploy, Outcome::Changed, 2),
                action("file[local,/b]", Trigger::Deploy, Outcome::Changed, 3),
                action("file[local,/c]", Trigger::Retry, Outcome::Failed, 50),
                action("file[local,/a]", Trigger::Repair, Outcome::Unchanged, 1),
            ],
        );
        assert_eq!(
            samples(&metrics, "orc_actions_total"),
            [
                r#"orc_actions_total{environment="dev",trigger="deploy",outcome="changed"} 2"#,
                r#"orc_actions_total{environment="dev",trigger="repair",outcome="unchanged"} 1"#,
                r#"orc_actions_total{environment="dev",trigger="retry",outcome="failed"} 1"#,
            ]
        );
        let text = metrics.render();
        assert!(text.contains(r#"orc_action_duration_seconds_count{environment="dev"} 4"#), "{text}");
        assert!(
            text.contains(r#"orc_action_duration_seconds_sum{environment="dev"} 0.056"#),
            "{text}"
        );
        // 1, 2 and 3 ms fall in the 6.4 ms bucket, 50 ms in the 102.4 ms one.
        assert!(
            text.contains(r#"orc_action_duration_seconds_bucket{le="0.0064",environment="dev"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"orc_action_duration_seconds_bucket{le="0.1024",environment="dev"} 4"#),
            "{text}"
        );
    }

    #[test]
    fn releases_and_requests_are_counted() {
        let metrics = Metrics::new();
        metrics.released("dev", 1);
        metrics.released("dev", 2);
        assert_eq!(
            samples(&metrics, "orc_intent_versions_released_total"),
            [r#"orc_intent_versions_released_total{environment="dev"} 2"#]
        );
        assert_eq!(
            samples(&metrics, "orc_released_intent_version"),
            [r#"orc_released_intent_version{environment="dev"} 2"#]
        );
        metrics.request("GET", "/api/v1/environments/{env}", 200, Duration::from_millis(1));
        metrics.request("GET", "/api/v1/environments/{env}", 200, Duration::from_millis(1));
        metrics.request("POST", "/api/v1/environments", 422, Duration::from_millis(1));
        assert_eq!(
            samples(&metrics, "orc_http_requests_total"),
            [
                r#"orc_http_requests_total{method="GET",route="/api/v1/environments/{env}",status="200"} 2"#,
                r#"orc_http_requests_total{method="POST",route="/api/v1/environments",status="422"} 1"#,
            ]
        );
        let text = metrics.render();
        assert!(
            text.contains(r#"orc_http_request_duration_seconds_count{method="GET",route="/api/v1/environments/{env}"} 2"#),
            "{text}"
        );
    }
}
