//! `orc:plugin/log`: plugin log lines go to `tracing` (attributed to the plugin) and are kept
//! with the call so the host can put them in the action log.

use crate::bindings::host::orc::plugin::log::{Host, Level};
use crate::calls::LogLine;
use crate::state::CallState;

/// At most this many lines are kept per instance; later ones are counted, not stored.
const MAX_LINES: usize = 1000;

impl Host for CallState {
    async fn log(&mut self, level: Level, mut message: String) {
        crate::bounded::storable(&mut message, crate::bounded::MAX_MESSAGE);
        let plugin = self.plugin_name.as_str();
        match level {
            Level::Trace => tracing::trace!(plugin, "{message}"),
            Level::Debug => tracing::debug!(plugin, "{message}"),
            Level::Info => tracing::info!(plugin, "{message}"),
            Level::Warn => tracing::warn!(plugin, "{message}"),
            Level::Error => tracing::error!(plugin, "{message}"),
        }
        if self.logs.len() < MAX_LINES {
            self.logs.push(LogLine { level, message });
        } else {
            self.dropped_logs += 1;
        }
    }
}
