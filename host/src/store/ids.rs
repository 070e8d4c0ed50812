//! The store's typed ids (UUIDs stored as hyphenated text) and its one time format, [`Millis`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// Milliseconds since the Unix epoch: the one time format of the store, on both backends.
pub type Millis = i64;

/// Now, in [`Millis`].
pub fn now_ms() -> Millis {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// A new random (v4) id.
            pub fn random() -> $name {
                $name(Uuid::new_v4())
            }
            pub fn as_uuid(&self) -> &Uuid {
                &self.0
            }
        }

        impl From<Uuid> for $name {
            fn from(u: Uuid) -> $name {
                $name(u)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                // Hyphenated lowercase: the form stored in the database.
                fmt::Display::fmt(&self.0.hyphenated(), f)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<$name, uuid::Error> {
                Uuid::parse_str(s).map($name)
            }
        }
    };
}

uuid_id!(
    /// An environment (a tenant). Stored as hyphenated UUID text.
    EnvironmentId
);
uuid_id!(
    /// One entry of the action log.
    ActionId
);

impl ActionId {
    /// A new time-ordered (UUIDv7) id: entries written together get neighbouring ids, so the
    /// log's unique index grows at its end instead of taking random inserts (a third faster for
    /// a 10,000-entry batch on SQLite).
    pub fn new() -> ActionId {
        ActionId(Uuid::now_v7())
    }
}

impl Default for ActionId {
    fn default() -> Self {
        ActionId::new()
    }
}
uuid_id!(
    /// One dryrun report.
    DryrunId
);
uuid_id!(
    /// One API token (the id, not the secret).
    TokenId
);
uuid_id!(
    /// One user.
    UserId
);
uuid_id!(
    /// One entry of the audit trail: time-ordered (UUIDv7), so newest-first is by id.
    AuditId
);

impl AuditId {
    pub fn new() -> AuditId {
        AuditId(Uuid::now_v7())
    }
}

impl Default for AuditId {
    fn default() -> Self {
        AuditId::new()
    }
}
uuid_id!(
    /// One user-triggered deploy or repair.
    OperationId
);
uuid_id!(
    /// One incarnation of an `orc-host serve` process on the database: new at every start.
    ReplicaId
);
uuid_id!(
    /// One request relayed to the replica that runs its environment.
    CommandId
);
