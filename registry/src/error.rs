//! Everything that can go wrong in the registry, each with a stable machine code, and the JSON
//! error body the HTTP service sends and the client turns back into a [`RegistryError`].

use orc_manifest::Digest;
use serde::{Deserialize, Serialize};

pub type Result<T, E = RegistryError> = std::result::Result<T, E>;

/// A registry failure. Every message names its culprit: the digest, `name@version` or index path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    #[error("{what} not found")]
    NotFound { what: String },
    #[error("no blob {0} in the registry")]
    UnknownDigest(Digest),
    /// Stored bytes no longer hash to the digest they are filed under: the store was tampered with
    /// or the disk lost data.
    #[error("blob {digest} is corrupt: its stored bytes hash to {actual}")]
    Corrupt { digest: Digest, actual: Digest },
    /// Uploaded or downloaded bytes do not hash to the digest they claim.
    #[error("bytes do not match digest {expected}: they hash to {actual}")]
    DigestMismatch { expected: Digest, actual: Digest },
    #[error("{name}@{version} is already published as {existing} and cannot be re-pointed to {attempted}")]
    VersionTaken {
        name: String,
        version: String,
        existing: Digest,
        attempted: Digest,
    },
    #[error("not a publishable plugin: {0}")]
    InvalidPlugin(String),
    /// A service document refused: `path` is its culprit (`interfaces[0].max_connections`).
    #[error("not a publishable service: {path}: {message}")]
    InvalidService { path: String, message: String },
    #[error("{0}")]
    InvalidName(String),
    #[error("{0}")]
    InvalidDigest(String),
    #[error("{size} bytes exceed the registry's limit of {limit} bytes")]
    TooLarge { size: u64, limit: u64 },
    /// An index file exists but cannot be read as an entry (hand-edited, truncated by a foreign tool).
    #[error("index entry `{path}` is unreadable: {message}")]
    IndexCorrupt { path: String, message: String },
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[cfg(feature = "client")]
    #[error("request to {url} failed")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// A remote registry answered with an error this client has no variant for.
    #[error("registry answered {status} `{code}`: {message}")]
    Remote { status: u16, code: String, message: String },
    #[error("{0}")]
    Unsupported(String),
}

impl RegistryError {
    /// A stable machine-readable code, the `code` of the HTTP error body.
    pub fn code(&self) -> &'static str {
        match self {
            RegistryError::NotFound { .. } => "not_found",
            RegistryError::UnknownDigest(_) => "unknown_digest",
            RegistryError::Corrupt { .. } => "blob_corrupt",
            RegistryError::DigestMismatch { .. } => "digest_mismatch",
            RegistryError::VersionTaken { .. } => "version_taken",
            RegistryError::InvalidPlugin(_) => "invalid_plugin",
            RegistryError::InvalidService { .. } => "invalid_service",
            RegistryError::InvalidName(_) => "invalid_name",
            RegistryError::InvalidDigest(_) => "invalid_digest",
            RegistryError::TooLarge { .. } => "too_large",
            RegistryError::IndexCorrupt { .. } => "index_corrupt",
            RegistryError::Io { .. } => "io",
            #[cfg(feature = "client")]
            RegistryError::Http { .. } => "http",
            RegistryError::Remote { .. } => "remote",
            RegistryError::Unsupported(_) => "unsupported",
        }
    }

    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> RegistryError {
        let context = context.into();
        move |source| RegistryError::Io { context, source }
    }
}

/// Parses a `sha256:<hex>` digest given by a user or a URL.
pub fn parse_digest(text: &str) -> Result<Digest> {
    text.parse()
        .map_err(|e: orc_manifest::DigestError| RegistryError::InvalidDigest(e.to_string()))
}

/// The body of every error response: `{code, message}` plus the fields a client needs to rebuild
/// the typed error. Never carries internal detail (paths, OS errors).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub what: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The JSON path of the culprit in a refused document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<Digest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<Digest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual: Option<Digest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing: Option<Digest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempted: Option<Digest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

impl ErrorBody {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            code: code.into(),
            message: message.into(),
            ..ErrorBody::default()
        }
    }

    /// The body for `err`. An `io` error gets a generic message: its detail belongs in the log.
    pub fn from_error(err: &RegistryError) -> ErrorBody {
        let mut body = ErrorBody::new(err.code(), err.to_string());
        match err {
            RegistryError::NotFound { what } => body.what = Some(what.clone()),
            RegistryError::UnknownDigest(d) => body.digest = Some(*d),
            RegistryError::Corrupt { digest, actual } => (body.digest, body.actual) = (Some(*digest), Some(*actual)),
            RegistryError::DigestMismatch { expected, actual } => (body.expected, body.actual) = (Some(*expected), Some(*actual)),
            RegistryError::VersionTaken {
                name,
                version,
                existing,
                attempted,
            } => {
                body.name = Some(name.clone());
                body.version = Some(version.clone());
                body.existing = Some(*existing);
                body.attempted = Some(*attempted);
            }
            RegistryError::InvalidPlugin(r) | RegistryError::InvalidName(r) | RegistryError::InvalidDigest(r) => {
                body.reason = Some(r.clone())
            }
            RegistryError::InvalidService { path, message } => (body.path, body.reason) = (Some(path.clone()), Some(message.clone())),
            RegistryError::TooLarge { size, limit } => (body.size, body.limit) = (Some(*size), Some(*limit)),
            RegistryError::Io { .. } => body.message = "internal storage error in the registry (details are in its log)".into(),
            _ => {}
        }
        body
    }

    /// The typed error a client reports for this body received with HTTP `status`.
    pub fn into_error(self, status: u16) -> RegistryError {
        let remote = |b: ErrorBody| RegistryError::Remote {
            status,
            code: b.code,
            message: b.message,
        };
        match self.code.as_str() {
            "not_found" => RegistryError::NotFound {
                what: self.what.clone().unwrap_or_else(|| self.message.clone()),
            },
            "unknown_digest" => match self.digest {
                Some(d) => RegistryError::UnknownDigest(d),
                None => remote(self),
            },
            "blob_corrupt" => match (self.digest, self.actual) {
                (Some(digest), Some(actual)) => RegistryError::Corrupt { digest, actual },
                _ => remote(self),
            },
            "digest_mismatch" => match (self.expected, self.actual) {
                (Some(expected), Some(actual)) => RegistryError::DigestMismatch { expected, actual },
                _ => remote(self),
            },
            "version_taken" => match (self.name.clone(), self.version.clone(), self.existing, self.attempted) {
                (Some(name), Some(version), Some(existing), Some(attempted)) => RegistryError::VersionTaken {
                    name,
                    version,
                    existing,
                    attempted,
                },
                _ => remote(self),
            },
            "invalid_plugin" => RegistryError::InvalidPlugin(self.reason.unwrap_or(self.message)),
            "invalid_service" => match (self.path.clone(), self.reason.clone()) {
                (Some(path), Some(message)) => RegistryError::InvalidService { path, message },
                _ => remote(self),
            },
            "invalid_name" => RegistryError::InvalidName(self.reason.unwrap_or(self.message)),
            "invalid_digest" => RegistryError::InvalidDigest(self.reason.unwrap_or(self.message)),
            "too_large" => match (self.size, self.limit) {
                (Some(size), Some(limit)) => RegistryError::TooLarge { size, limit },
                _ => remote(self),
            },
            _ => remote(self),
        }
    }
}

impl From<&RegistryError> for ErrorBody {
    fn from(err: &RegistryError) -> ErrorBody {
        ErrorBody::from_error(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_round_trip_to_typed_errors() {
        let a = Digest::of(b"a");
        let b = Digest::of(b"b");
        let errors = [
            RegistryError::NotFound { what: "plugin `x`".into() },
            RegistryError::UnknownDigest(a),
            RegistryError::Corrupt { digest: a, actual: b },
            RegistryError::DigestMismatch { expected: a, actual: b },
            RegistryError::VersionTaken {
                name: "x".into(),
                version: "1.0.0".into(),
                existing: a,
                attempted: b,
            },
            RegistryError::InvalidPlugin("no manifest".into()),
            RegistryError::InvalidService {
                path: "interfaces[0].name".into(),
                message: "duplicate interface `kv`".into(),
            },
            RegistryError::InvalidName("bad".into()),
            RegistryError::InvalidDigest("bad".into()),
            RegistryError::TooLarge { size: 10, limit: 5 },
        ];
        for err in errors {
            let json = serde_json::to_string(&ErrorBody::from_error(&err)).unwrap();
            let back: ErrorBody = serde_json::from_str(&json).unwrap();
            let again = back.into_error(400);
            assert_eq!(again.code(), err.code(), "{json}");
            assert_eq!(again.to_string(), err.to_string(), "{json}");
        }
    }

    #[test]
    fn io_detail_stays_out_of_the_body() {
        let err = RegistryError::Io {
            context: "writing /secret/path".into(),
            source: std::io::Error::other("disk on fire"),
        };
        let body = ErrorBody::from_error(&err);
        assert_eq!(body.code, "io");
        assert!(
            !body.message.contains("secret") && !body.message.contains("fire"),
            "{}",
            body.message
        );
    }
}
