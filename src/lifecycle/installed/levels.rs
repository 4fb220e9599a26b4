//! [`Levels`]: the placement levels a run's installed hooks are composed from.

use std::sync::Arc;

use crate::lifecycle::stack::CompiledStack;

/// The levels of a run's installed hooks, composed in this order (the first
/// outermost). `agent` and `agent_builtins` belong to the agent running the
/// run; a handoff replaces them, the others stay.
#[derive(Clone)]
pub(crate) struct Levels {
    pub(crate) runtime: Arc<CompiledStack>,
    pub(crate) agent: Arc<CompiledStack>,
    pub(crate) run: Arc<CompiledStack>,
    pub(crate) builtins: Arc<CompiledStack>,
    /// The built-ins of the agent's own middleware
    /// ([`AgentBuilder::middleware`](crate::AgentBuilder::middleware)).
    pub(crate) agent_builtins: Arc<CompiledStack>,
}

impl Levels {
    pub(super) fn compose(&self) -> Arc<CompiledStack> {
        CompiledStack::compose(&[
            &self.runtime,
            &self.agent,
            &self.run,
            &self.builtins,
            &self.agent_builtins,
        ])
    }
}
