//! Policy: what an environment's plugins may reach beyond their grants — outgoing HTTP under the
//! environment's HTTP settings with the host-held secrets bound to origins ([`outbound`]), and
//! the call context every plugin call of the environment carries.

pub mod outbound;
pub mod settings;
