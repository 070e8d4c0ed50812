//! Routes panic messages to the host's `log` interface.
//!
//! Guests are built with `panic = "abort"`, so a panic traps the instance; without this hook
//! its message would only reach WASI stderr, which the host may not attribute to the action.

use std::sync::Once;

pub(crate) fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            crate::log::error(&format!("plugin {info}"));
            previous(info);
        }));
    });
}
