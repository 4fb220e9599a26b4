//! [`HookedToolCall`]: a tool call through the run's hooks, in one future
//! that races the run's cancellation and deadline, catches the tool's panic
//! and polls inside the call's span, as a [`BareToolCall`] does; when every
//! wrap hook hands the call on, the tool stack is called in place.
//!
//! [`BareToolCall`]: super::bare_tool::BareToolCall

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tracing::Span;

use super::bare_tool::{invocation, poll_caught, poll_tool, Calling, Caught};
use crate::context::{Guard, RunContext};
use crate::error::{AgentError, BoxError};
use crate::hooks::{CallAbort, HookFuture, HookPort, ToolAnswer, ToolFinish, ToolWalk};
use crate::request::{BoxTool, ToolInvocation, ToolOutput};
use crate::service::ToolRouter;
use crate::types::ToolCall;

/// One tool call through `hooks`: builds the invocation and walks the wrap
/// hooks at its first poll, then calls the tool stack (the tool the router
/// picks, when no layer wraps the router) in place, keeping the invocation
/// boxed only while the tool is not ready; or polls the future a wrap hook
/// answers with. So a call holds the tool's future and a few references,
/// not the invocation moved through the wrappers a race, a span and a panic
/// guard would each make of it.
pub(super) struct HookedToolCall<'a> {
    hooks: &'a dyn HookPort,
    guard: Guard<'a>,
    call: &'a ToolCall,
    /// Whether the call was approved, and whether the tool is idempotent.
    flags: (bool, bool),
    /// Whether the tool stack may stream its progress.
    streams: bool,
    /// The tool stack, cloned only for a wrap hook that calls it.
    tools: &'a Arc<BoxTool>,
    /// The router, when the tool stack is the router alone.
    router: Option<&'a ToolRouter>,
    span: &'a Span,
    state: ToolState<'a>,
}

enum ToolState<'a> {
    /// Not polled yet.
    Start,
    /// Every wrap hook handed the call on: the tool stack's call, and what
    /// becomes of its answer.
    Tool {
        calling: Calling,
        finish: ToolFinish,
    },
    /// A wrap hook answers with a future of its own.
    Hooked(HookFuture<'a, ToolOutput>),
    Done,
}

impl<'a> HookedToolCall<'a> {
    /// `call` in the run `guard` guards, through `hooks`, to `tools`, or to
    /// `router` when it stands for them; `streams`, whether `tools` may
    /// stream progress.
    pub(super) fn new(
        hooks: &'a dyn HookPort,
        guard: Guard<'a>,
        call: &'a ToolCall,
        (approved, idempotent, streams): (bool, bool, bool),
        (tools, router): (&'a Arc<BoxTool>, Option<&'a ToolRouter>),
        span: &'a Span,
    ) -> Self {
        Self {
            hooks,
            guard,
            call,
            flags: (approved, idempotent),
            streams,
            tools,
            router,
            span,
            state: ToolState::Start,
        }
    }
}

impl Future for HookedToolCall<'_> {
    type Output = Result<Caught, AgentError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let ctx = this.guard.ctx();
        let call = Parts {
            hooks: this.hooks,
            ctx,
            call: this.call,
            flags: this.flags,
            streams: this.streams,
            tools: this.tools,
            router: this.router,
        };
        let state = &mut this.state;
        poll_caught(&mut this.guard, this.span, cx, |cx| call.poll(state, cx))
    }
}

/// What a [`HookedToolCall`] borrows, apart from its state.
struct Parts<'a> {
    hooks: &'a dyn HookPort,
    ctx: &'a RunContext,
    call: &'a ToolCall,
    flags: (bool, bool),
    streams: bool,
    tools: &'a Arc<BoxTool>,
    router: Option<&'a ToolRouter>,
}

impl<'a> Parts<'a> {
    fn poll(
        &self,
        state: &mut ToolState<'a>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<ToolOutput, BoxError>> {
        // What the walk handed on, for the tool's call in this same poll.
        let mut walked = None;
        if let ToolState::Start = state {
            let invocation = invocation(self.call, self.ctx, self.flags);
            *state = match self
                .hooks
                .walk_tool(invocation, self.tools, self.streams, self.ctx)
            {
                ToolWalk::Service {
                    service,
                    invocation,
                    finish,
                } => {
                    walked = Some((service, invocation));
                    ToolState::Tool {
                        calling: Calling::Start,
                        finish,
                    }
                }
                ToolWalk::Future(future) => ToolState::Hooked(future),
            };
        }
        let (calling, finish) = match state {
            ToolState::Hooked(future) => return Pin::new(future).poll(cx),
            ToolState::Tool { calling, finish } => (calling, &*finish),
            ToolState::Start | ToolState::Done => {
                panic!("HookedToolCall polled after completion")
            }
        };
        let abort = finish.abort.as_deref();
        let answer = match abort.and_then(CallAbort::failed) {
            Some(err) => ToolAnswer::Failed(err),
            None => match self.poll_tool(calling, walked, finish.guarded(), cx) {
                Poll::Ready(answer) => answer,
                Poll::Pending => {
                    // Woken when a delta hook fails from now on; one that
                    // failed before the waker was in is read here. A tool
                    // that answers at once never registers it.
                    if let Some(abort) = abort {
                        abort.register(cx.waker());
                    }
                    match abort.and_then(CallAbort::failed) {
                        Some(err) => ToolAnswer::Failed(err),
                        None => return Poll::Pending,
                    }
                }
            },
        };
        let result = match answer {
            // An output, and no delta hook failed: it goes out as it came,
            // as `finish_tool` would let it.
            ToolAnswer::Answered(Ok(Ok(output))) if abort.is_none_or(|a| !a.has_failed()) => {
                Ok(output)
            }
            answer => self.hooks.finish_tool(answer, self.call, self.ctx, finish),
        };
        *state = ToolState::Done;
        Poll::Ready(result)
    }

    /// Calls the tool below the wrap hooks (`walked` holds what the walk
    /// handed on, at the first poll) once it is ready, and polls its
    /// future, its panic caught when `guarded`.
    fn poll_tool(
        &self,
        calling: &mut Calling,
        walked: Option<(Option<BoxTool>, ToolInvocation)>,
        guarded: bool,
        cx: &mut Context<'_>,
    ) -> Poll<ToolAnswer> {
        let (mut service, mut invocation) = match walked {
            Some((service, invocation)) => (service, Some(invocation)),
            None => (None, None),
        };
        let mut poll = |cx: &mut Context<'_>| {
            // What the walk handed on is the router itself, when it stands
            // for the tool stack: it routes from a borrow.
            let make = || invocation.take().expect("what the walk handed on");
            let tool = || service.take().unwrap_or_else(|| BoxTool::clone(self.tools));
            poll_tool(calling, cx, make, self.router, tool).map(|answer| match answer {
                Ok(answer) => ToolAnswer::Answered(Ok(answer)),
                Err(err) => not_ready(err, self.router.is_some()),
            })
        };
        if !guarded {
            return poll(cx);
        }
        match catch_unwind(AssertUnwindSafe(|| poll(cx))) {
            Ok(poll) => poll,
            Err(panic) => Poll::Ready(ToolAnswer::Answered(Err(panic))),
        }
    }
}

/// What a tool that fails to get ready answers: a tool stack's failure
/// fails the call; a tool the router picked answers with its failure, as
/// the router's own future would.
fn not_ready(err: BoxError, routed: bool) -> ToolAnswer {
    if routed {
        ToolAnswer::Answered(Ok(Err(err)))
    } else {
        ToolAnswer::Failed(err)
    }
}
