//! Structured log lines, attributed by the host to the plugin and the running action.
//!
//! Use the functions with a plain message, or the crate-root macros (`orc_sdk::info!(..)`)
//! with format arguments. Built natively (unit tests), lines go to stderr instead.

/// The severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// Logs `message` at `level`.
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    {
        use crate::bindings::log as wit;
        let level = match level {
            Level::Trace => wit::Level::Trace,
            Level::Debug => wit::Level::Debug,
            Level::Info => wit::Level::Info,
            Level::Warn => wit::Level::Warn,
            Level::Error => wit::Level::Error,
        };
        wit::log(level, message);
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        eprintln!("[{level:?}] {message}");
    }
}

pub fn trace(message: &str) {
    log(Level::Trace, message);
}

pub fn debug(message: &str) {
    log(Level::Debug, message);
}

pub fn info(message: &str) {
    log(Level::Info, message);
}

pub fn warn(message: &str) {
    log(Level::Warn, message);
}

pub fn error(message: &str) {
    log(Level::Error, message);
}

/// `trace!("read {} bytes", n)`: logs at trace level with format arguments.
#[macro_export]
macro_rules! trace {
    ($($arg:tt)+) => { $crate::log::trace(&::std::format!($($arg)+)) };
}

/// `debug!("read {} bytes", n)`: logs at debug level with format arguments.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)+) => { $crate::log::debug(&::std::format!($($arg)+)) };
}

/// `info!("wrote {path}")`: logs at info level with format arguments.
#[macro_export]
macro_rules! info {
    ($($arg:tt)+) => { $crate::log::info(&::std::format!($($arg)+)) };
}

/// `warn!("{path} is a symlink")`: logs at warn level with format arguments.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)+) => { $crate::log::warn(&::std::format!($($arg)+)) };
}

/// `error!("giving up on {path}")`: logs at error level with format arguments.
#[macro_export]
macro_rules! error {
    ($($arg:tt)+) => { $crate::log::error(&::std::format!($($arg)+)) };
}
