//! What becomes of the hooks of a run handed over to another agent
//! ([`HookPort::hand_over`]): the runtime's and the run's stay, the agent's
//! are replaced by the new agent's.

use std::sync::Arc;

use super::InstalledHooks;
use crate::context::RunContext;
use crate::hooks::{AgentMiddleware, HookPort};
use crate::lifecycle::placement::AgentLevels;
use crate::lifecycle::stack::CompiledStack;

impl InstalledHooks {
    /// The hand-over of [`HookPort::hand_over`].
    pub(super) fn hand_over_here(
        self: Arc<Self>,
        ctx: &RunContext,
        to: Option<&AgentMiddleware>,
    ) -> Option<Arc<dyn HookPort>> {
        let here = ctx.depth();
        if self.depth != here {
            // Inherited from the run this one is nested in: those stay, the
            // new agent's middleware go inside them.
            let outer: Arc<dyn HookPort> = self;
            return Some(match to {
                Some(to) => to.0.frame(ctx, Some(outer)),
                None => outer,
            });
        }
        let mut levels = self.levels.clone();
        levels.agent = CompiledStack::empty();
        levels.agent_builtins = CompiledStack::empty();
        let outer = match self.outer.as_ref().filter(|o| o.depth() == here) {
            // An inner frame of this run (a second lifecycle layer, or the
            // agent's own middleware inside a runtime's layer): the new
            // agent's middleware go where the outermost frame had the agent's.
            Some(outer) => outer.clone().hand_over(ctx, to),
            None => {
                if let Some(handed) = to.and_then(|to| to.0.levels().downcast_ref::<AgentLevels>())
                {
                    let (agent, builtins) = handed.handed(ctx);
                    levels.agent = agent;
                    levels.agent_builtins = builtins;
                }
                self.outer.clone()
            }
        };
        let empty = [
            &levels.runtime,
            &levels.agent,
            &levels.run,
            &levels.builtins,
            &levels.agent_builtins,
        ]
        .iter()
        .all(|s| s.is_empty());
        if empty {
            return outer;
        }
        Some(Arc::new(InstalledHooks::inside(ctx, outer, levels)))
    }
}
