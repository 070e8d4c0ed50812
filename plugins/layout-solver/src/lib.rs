//! `layout-solver`, orc's first-party cluster solver: given a cluster template (already
//! restricted to the cluster's services), a size, the nodes the environment offers and the
//! cluster's current layout, it returns a layout that `orc_cluster::check_layout` accepts,
//! changing the current one as little as the constraints allow and placing every service on as
//! many nodes as its `count.max` allows — or names the constraint that cannot be met.
//!
//! This file converts between the guest SDK's types and `orc-cluster`'s; the algorithm is in
//! [`solve`].

pub mod solve;

use orc_cluster::{Layout, Template};
use orc_sdk::{Error, LayoutRequest, Placement, SolveError, Solver};

use crate::solve::Failure;

/// The solver plugin.
#[derive(Debug)]
pub struct LayoutSolver;

orc_sdk::export!(solver: LayoutSolver);

impl Solver for LayoutSolver {
    type Template = Template;

    fn solve(request: LayoutRequest<Template>) -> Result<Vec<Placement>, SolveError> {
        let template = request.template;
        template.validate().map_err(|e| Error::invalid(format!("invalid template: {e}")))?;
        let nodes: Vec<orc_cluster::NodeInfo> = request
            .nodes
            .into_iter()
            .map(|n| orc_cluster::NodeInfo {
                name: n.name,
                labels: n.labels,
                facts: n.facts,
            })
            .collect();
        let existing: Layout = request.existing.into_iter().map(|p| (p.node, p.services)).collect();
        match solve::solve(&template, request.size, &nodes, &existing) {
            Ok(layout) => Ok(layout
                .0
                .into_iter()
                .map(|(node, services)| Placement::new(node, services))
                .collect()),
            Err(Failure::NoLayout { constraint, message }) => Err(SolveError::no_valid_layout(constraint, message)),
            Err(Failure::Invalid(message)) => Err(Error::invalid(message).into()),
            Err(Failure::Failed(message)) => Err(Error::permanent(message).into()),
        }
    }
}
