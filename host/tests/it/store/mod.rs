//! Integration tests of `orc_host::store` against real databases: every case runs once on SQLite
//! (a file in a temporary directory) and once on PostgreSQL (a cluster this binary starts; see
//! `orc_tests::pg`). `batch_timings_10k` prints how long the 10,000-row batches take (`--nocapture`).

mod access;
mod cases;
mod clusters;
mod commands;
mod events;
mod harness;
mod ownership;

/// One `#[tokio::test]` per case and backend: `sqlite::<case>` and `postgres::<case>`, for the
/// cases of each module listed (`module: [case, …]`).
macro_rules! on_both_backends {
    ($($module:ident: [$($case:ident),* $(,)?]),* $(,)?) => {
        mod sqlite {
            $($(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() -> anyhow::Result<()> {
                    let db = super::harness::sqlite().await?;
                    super::$module::$case(&db).await
                }
            )*)*
        }
        mod postgres {
            $($(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() -> anyhow::Result<()> {
                    let db = super::harness::postgres().await?;
                    super::$module::$case(&db).await
                }
            )*)*
        }
    };
}

on_both_backends!(
    cases: [
        environments_crud,
        concurrent_submits_get_distinct_consecutive_versions,
        versions_release_and_rollback,
        states_batch_upsert_filters_and_pagination,
        status_transitions_in_batch,
        recovery_of_deploying,
        progress_batches_are_atomic_and_keep_times,
        actions_batch_and_query_order,
        dryrun_lifecycle,
        operations_lifecycle_and_interruption,
        users_tokens_and_memberships,
        db_kv_keeps_scopes_apart,
        db_kv_batches_answer_each_call_in_order,
        db_kv_answers_from_memory_like_the_database,
        db_kv_forgets_the_scopes_under_a_prefix,
        db_kv_counts_what_an_environment_holds_for_its_quota,
        deleting_an_environment_removes_its_data,
        migrations_are_idempotent_on_reconnect,
        jobs_migration_keeps_operations_and_dryruns,
        batch_timings_10k,
    ],
    access: [
        no_sequence_of_changes_leaves_no_way_in_that_can_act_as_admin,
        two_removals_racing_for_the_last_two_ways_in_leave_one,
    ],
    clusters: [
        template_versions_per_name_and_environment,
        concurrent_template_inserts_get_distinct_versions,
        template_in_use_cannot_be_deleted,
        clusters_crud,
        expired_cluster_leases,
        deleting_an_environment_removes_its_clusters,
        processes_are_revision_checked,
        connections_are_listed_oldest_first,
    ],
    commands: [a_relayed_command_is_claimed_once_by_the_holder_or_withdrawn],
    events: [recorded_events_are_read_after_any_number_across_owners],
    ownership: [
        a_stale_owner_never_writes_after_a_takeover,
        a_released_environment_is_claimed_at_once,
        an_ended_replica_lets_its_leases_go_at_once,
        plugin_state_written_under_a_stale_epoch_is_refused,
    ],
);
