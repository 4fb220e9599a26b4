//! The walks of [`InstalledHooks`] down a call's wrap hooks, for a caller
//! that calls the service below itself when every hook hands the call on,
//! and what the tool's answer then becomes.

use std::sync::Arc;

use super::InstalledHooks;
use crate::context::RunContext;
use crate::error::BoxError;
use crate::hooks::{HookPort, ModelWalk, ToolAnswer, ToolFinish, ToolWalk};
use crate::lifecycle::call_chain::{note_failure, tool_walk};
use crate::lifecycle::chain_run::ChainRun;
use crate::lifecycle::next::{innermost_answer, step, Step};
use crate::lifecycle::wrap::ToolCallee;
use crate::lifecycle::{HookPoint, Next};
use crate::request::{BoxModel, BoxTool, ModelCall, ToolInvocation, ToolOutput};
use crate::types::ToolCall;

impl InstalledHooks {
    /// The walk of [`HookPort::walk_model`].
    pub(super) fn walk_model_here(
        &self,
        call: ModelCall,
        next: BoxModel,
        ctx: &RunContext,
    ) -> ModelWalk<'_> {
        let streams = call.stream.is_some();
        let own = self.stack.wraps_model(streams);
        let service = |service, call, guarded| ModelWalk::Service {
            service,
            call,
            guarded,
        };
        match &self.outer {
            None if !own => service(next, call, false),
            Some(outer) if !own => outer.walk_model(call, next, ctx),
            // Delta hooks race the call, and an outer frame wraps this one.
            Some(_) => ModelWalk::Future(self.wrap_model(call, next)),
            None if streams && self.stack.has(HookPoint::OnModelDelta) => {
                ModelWalk::Future(self.wrap_model(call, next))
            }
            None if !self.stack.has(HookPoint::WrapModel) => service(next, call, true),
            None => {
                let entries = &self.stack.entries;
                let next = Next::chain(entries.clone(), next, Some(self.depth));
                match step(Some(entries), next, call, Some(ctx)) {
                    Step::Innermost(next, call, _) => service(next.into_service(), call, true),
                    step => ModelWalk::Future(match ChainRun::after(step) {
                        Ok(run) => Box::pin(run),
                        Err(err) => Box::pin(std::future::ready(Err(err))),
                    }),
                }
            }
        }
    }

    /// The walk of [`HookPort::walk_tool`].
    pub(super) fn walk_tool_here(
        &self,
        invocation: ToolInvocation,
        next: &Arc<BoxTool>,
        streams: bool,
        ctx: &RunContext,
    ) -> ToolWalk<'_> {
        let own = self.stack.wraps_tool(streams);
        match &self.outer {
            None if !own => ToolWalk::Service {
                service: None,
                invocation,
                finish: ToolFinish::plain(),
            },
            None => tool_walk(
                &self.stack,
                invocation,
                next,
                streams,
                Some(self.depth),
                ctx,
            ),
            Some(outer) if !own => outer.walk_tool(invocation, next, streams, ctx),
            Some(_) => ToolWalk::Future(self.wrap_tool(invocation, BoxTool::clone(next))),
        }
    }
}

/// [`HookPort::finish_tool`]: the answer of a tool called below a stack.
pub(super) fn finish_tool(
    answer: ToolAnswer,
    call: &ToolCall,
    ctx: &RunContext,
    finish: &ToolFinish,
) -> Result<ToolOutput, BoxError> {
    let result = match answer {
        ToolAnswer::Answered(Ok(Ok(output))) => Ok(output),
        ToolAnswer::Answered(Ok(Err(err))) if !finish.guarded() => Err(err),
        ToolAnswer::Answered(answer) => {
            innermost_answer::<ToolInvocation>(answer, &ToolCallee::of(call), Some(ctx))
        }
        ToolAnswer::Failed(err) => Err(err),
    };
    // The first error of a delta hook cuts the call, whatever it answered.
    let result = match finish.abort.as_ref().and_then(|abort| abort.take()) {
        Some(err) => Err(err),
        None => result,
    };
    if let Err(err) = &result {
        note_failure(ctx, finish.home, err);
    }
    result
}
