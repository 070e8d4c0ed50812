//! How the scheduler runs one deploy action: the [`Actions`] seam. The host's is
//! [`AdaptorActions`] — the resource's adaptor through [`executor::execute`], the one code path of
//! every trigger; the scheduler's own tests give one whose completions and outcomes they choose.

use std::sync::Arc;

use orc_runtime::{CallContext, Plugin};

use super::BoxFuture;
use crate::executor::{self, ActionReport, Mode};
use crate::intent::ResourceSpec;

/// Runs deploy actions for a scheduler.
pub trait Actions: Send + Sync + 'static {
    /// One deploy action (read, diff, enforce) of `spec` through `plugin`, within `ctx`.
    fn deploy(&self, plugin: Arc<Plugin>, ctx: CallContext, spec: ResourceSpec) -> BoxFuture<'static, ActionReport>;
}

/// Actions through each resource's adaptor.
#[derive(Debug, Default, Clone, Copy)]
pub struct AdaptorActions;

impl Actions for AdaptorActions {
    fn deploy(&self, plugin: Arc<Plugin>, ctx: CallContext, spec: ResourceSpec) -> BoxFuture<'static, ActionReport> {
        Box::pin(async move { executor::execute(&plugin, &ctx, &spec, Mode::Deploy).await })
    }
}
