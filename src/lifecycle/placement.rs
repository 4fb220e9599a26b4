//! The levels a lifecycle layer places in a run ([`AgentLevels`]), and the
//! mark that keeps a runtime's middleware from running twice in one run
//! tree.

use std::sync::Arc;

use super::stack::CompiledStack;
use crate::context::RunContext;

/// What one lifecycle layer (or an agent's own middleware) places in a run:
/// a runtime's middleware, the agent's, and built-ins nearest the model.
#[derive(Clone)]
pub(crate) struct AgentLevels {
    pub(crate) runtime: Option<Arc<CompiledStack>>,
    pub(crate) agent: Arc<CompiledStack>,
    pub(crate) builtins: Arc<CompiledStack>,
}

impl AgentLevels {
    /// The runtime's middleware, unless `ctx` or a run it is nested in
    /// already has them; then marks `ctx` as served by them.
    pub(crate) fn claim_runtime(&self, ctx: &RunContext) -> Option<&Arc<CompiledStack>> {
        self.runtime.as_ref().filter(|rt| {
            let id = runtime_id(rt);
            if runtime_active(ctx, id) {
                return false;
            }
            ctx.with_state(|s| s.insert(RuntimeMark(id)));
            true
        })
    }

    /// Whether none of these middleware can ever do anything.
    pub(crate) fn inert(&self) -> bool {
        self.runtime.as_ref().is_none_or(|rt| rt.inert())
            && self.agent.inert()
            && self.builtins.inert()
    }

    /// What these bring to a run handed over to their agent: the agent
    /// level (after the runtime's, unless that runtime already serves the
    /// run) and the built-ins.
    pub(crate) fn handed(&self, ctx: &RunContext) -> (Arc<CompiledStack>, Arc<CompiledStack>) {
        let agent = match self.claim_runtime(ctx) {
            Some(runtime) => CompiledStack::compose(&[runtime, &self.agent]),
            None => self.agent.clone(),
        };
        (agent, self.builtins.clone())
    }
}

/// Marks a run (and so its nested runs) as served by a runtime's middleware.
#[derive(Clone)]
struct RuntimeMark(usize);

fn runtime_id(stack: &Arc<CompiledStack>) -> usize {
    Arc::as_ptr(stack) as *const () as usize
}

/// Whether `ctx` or a run it is nested in already has this runtime's
/// middleware: a nested agent of the same runtime does not run them twice.
fn runtime_active(ctx: &RunContext, id: usize) -> bool {
    let mut current = Some(ctx);
    while let Some(ctx) = current {
        if ctx.with_state(|s| s.get::<RuntimeMark>().is_some_and(|m| m.0 == id)) {
            return true;
        }
        current = ctx.parent();
    }
    false
}
