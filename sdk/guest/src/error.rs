//! The one error type of the SDK: a kind the scheduler acts on, and a message for the operator.

use std::fmt;

use crate::bindings::types;

/// The result of every SDK call and every plugin entry point.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How the scheduler treats a failure (the WIT `error-kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The input (attributes, template, configuration) is wrong: retrying cannot help.
    InvalidInput,
    /// The target (node, device, API) cannot be reached now: the resource becomes `unavailable`.
    Unavailable,
    /// A transient failure: the scheduler retries with backoff.
    Retryable,
    /// A failure that retrying will not fix without an operator.
    Permanent,
    /// The host refused the operation (capability not granted, address not allowed).
    Denied,
}

impl ErrorKind {
    /// The WIT name, e.g. `invalid-input`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid-input",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Retryable => "retryable",
            ErrorKind::Permanent => "permanent",
            ErrorKind::Denied => "denied",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error returned by a plugin or by a host interface.
///
/// Messages should be specific: name the field, path or command at fault. `?` converts the
/// host's errors into this type, keeping their kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }

    /// The attributes, template or configuration are wrong.
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidInput, message)
    }

    /// The device cannot be reached now.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Unavailable, message)
    }

    /// A transient failure worth retrying.
    pub fn retryable(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Retryable, message)
    }

    /// A failure that needs an operator.
    pub fn permanent(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Permanent, message)
    }

    /// The operation is not allowed. Plugins rarely return this themselves; the host does.
    pub fn denied(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Denied, message)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// Prefixes the message with `context: `, keeping the kind.
    ///
    /// ```
    /// let e = orc_sdk::Error::unavailable("connection refused").context("reading /etc/motd");
    /// assert_eq!(e.message(), "reading /etc/motd: connection refused");
    /// ```
    #[must_use]
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Error {}

/// Adds context to the error of a `Result`, as in `node::read_file(..).context(path)?`.
pub trait ResultExt<T> {
    /// Prefixes the error message with `context: `.
    fn context(self, context: impl fmt::Display) -> Result<T>;
}

impl<T, E: Into<Error>> ResultExt<T> for std::result::Result<T, E> {
    fn context(self, context: impl fmt::Display) -> Result<T> {
        self.map_err(|e| e.into().context(context))
    }
}

impl From<types::ErrorKind> for ErrorKind {
    fn from(kind: types::ErrorKind) -> Self {
        match kind {
            types::ErrorKind::InvalidInput => ErrorKind::InvalidInput,
            types::ErrorKind::Unavailable => ErrorKind::Unavailable,
            types::ErrorKind::Retryable => ErrorKind::Retryable,
            types::ErrorKind::Permanent => ErrorKind::Permanent,
            types::ErrorKind::Denied => ErrorKind::Denied,
        }
    }
}

impl From<ErrorKind> for types::ErrorKind {
    fn from(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::InvalidInput => types::ErrorKind::InvalidInput,
            ErrorKind::Unavailable => types::ErrorKind::Unavailable,
            ErrorKind::Retryable => types::ErrorKind::Retryable,
            ErrorKind::Permanent => types::ErrorKind::Permanent,
            ErrorKind::Denied => types::ErrorKind::Denied,
        }
    }
}

impl From<types::Error> for Error {
    fn from(e: types::Error) -> Self {
        Error {
            kind: e.kind.into(),
            message: e.message,
        }
    }
}

impl From<Error> for types::Error {
    fn from(e: Error) -> Self {
        types::Error {
            kind: e.kind.into(),
            message: e.message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_errors_keep_their_kind() {
        let host = types::Error {
            kind: types::ErrorKind::Denied,
            message: "capability `http` not granted".into(),
        };
        let e: Error = host.into();
        assert_eq!(e.kind(), ErrorKind::Denied);
        assert_eq!(e.to_string(), "denied: capability `http` not granted");
        let back: types::Error = e.into();
        assert_eq!(back.kind, types::ErrorKind::Denied);
    }

    #[test]
    fn context_prefixes_the_message() {
        let r: std::result::Result<(), types::Error> = Err(types::Error {
            kind: types::ErrorKind::Unavailable,
            message: "no route".into(),
        });
        let e = r.context("stat /etc").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert_eq!(e.message(), "stat /etc: no route");
    }
}
