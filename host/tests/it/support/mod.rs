//! What several suites share that needs orc-host's types: a real server with a JSON client
//! (`host`), API paths (`paths`), an `SshNode` on a test sshd (`ssh_node`), a private network
//! of namespaces for sshd nodes (`network`), and [`on_both_backends!`].

pub mod host;
pub mod network;
pub mod paths;
pub mod ssh_node;

/// One `#[tokio::test]` per case and backend: `sqlite::<case>` and `postgres::<case>`, each
/// calling `super::<case>(backend)` in the module that invokes it.
macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(orc_host::store::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(orc_host::store::Backend::Postgres).await
                }
            )*
        }
    };
}
pub(crate) use on_both_backends;
