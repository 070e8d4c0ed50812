//! Cluster templates and layouts (Coopr's model) and the service catalog's documents (dEF-Pi's
//! services, [`service`]), shared by the host, the registry, the solver plugins and the
//! automators.
//!
//! A [`Template`] names the services a cluster may contain — each with its automator, its
//! configuration and its install-time and run-time dependencies — and the constraints on where
//! they may go: services that must share a node (`together`), services that must never share
//! one (`apart`), how many nodes a service runs on (`count`) and what a node must have to host a
//! service (`needs`: labels and facts). [`Template::validate`] refuses a template that names
//! unknown services, has a dependency cycle or contradicts itself, naming the culprit.
//!
//! A [`Layout`] is which services run on which node. [`check_layout`] says whether a layout
//! meets every constraint of a template for a requested size and set of nodes; the host runs it
//! on every solver's answer (a solver is a plugin, possibly an operator's own), and the solver
//! tests run it on every layout they get.
//!
//! Constraints are named by their JSON path in the template (`services.db.count`,
//! `constraints.apart[0]`, …) — the names a solver's "no valid layout" answer uses.

mod layout;
pub mod service;
mod template;

pub use layout::{Layout, NodeInfo, Violation, check_layout};
pub use service::{Interface, InterfaceVersion, Role, ServiceDocument, ServiceError};
pub use template::{Constraints, Count, Defaults, FactNeed, Needs, Range, Requires, Service, Template, TemplateError, valid_service_name};
