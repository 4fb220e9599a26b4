//! [`BareToolCall`]: a tool call without hooks, in one future that races
//! the run's cancellation and deadline, catches the tool's panic and
//! polls inside the call's span, all in its own `poll`.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tower::Service;
use tracing::Span;

use crate::context::{Guard, RunContext};
use crate::error::{AgentError, BoxError};
use crate::request::{BoxTool, ToolInvocation, ToolOutput};
use crate::service::ToolRouter;
use crate::types::ToolCall;

/// What a tool call came to: its answer, or the panic it ended in.
pub(super) type Caught = Result<Result<ToolOutput, BoxError>, Box<dyn std::any::Any + Send>>;

/// A tool call without hooks: builds the invocation at its first poll,
/// asks the tool stack (the tool the router picks, when no layer wraps the
/// router) to be ready and calls it, keeping the invocation boxed only while
/// the tool is not ready. So a call holds the tool's future and a few
/// references, not the invocation moved through the wrappers a race, a span
/// and a panic guard would each make of it.
pub(super) struct BareToolCall<'a> {
    guard: Guard<'a>,
    call: &'a ToolCall,
    approved: bool,
    idempotent: bool,
    /// The router itself when no tool layer wraps it; `tools` otherwise.
    router: Option<&'a ToolRouter>,
    tools: &'a BoxTool,
    span: &'a Span,
    state: Calling,
}

/// The call of a tool: not made yet, waiting for the tool, or made.
pub(super) enum Calling {
    /// Not polled yet.
    Start,
    /// The tool, not ready yet when first asked, with the invocation it
    /// gets once it is (rare: on the heap).
    Waiting(BoxTool, Option<Box<ToolInvocation>>),
    /// The tool's future.
    Called(<BoxTool as Service<ToolInvocation>>::Future),
}

impl<'a> BareToolCall<'a> {
    /// `call` in the run `guard` guards, to `router`, or to `tools`
    /// without one.
    pub(super) fn new(
        guard: Guard<'a>,
        call: &'a ToolCall,
        (approved, idempotent): (bool, bool),
        router: Option<&'a ToolRouter>,
        tools: &'a BoxTool,
        span: &'a Span,
    ) -> Self {
        Self {
            guard,
            call,
            approved,
            idempotent,
            router,
            tools,
            span,
            state: Calling::Start,
        }
    }
}

impl Future for BareToolCall<'_> {
    type Output = Result<Caught, AgentError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let ctx = this.guard.ctx();
        let (call, flags, router, tools) = (
            this.call,
            (this.approved, this.idempotent),
            this.router,
            this.tools,
        );
        let state = &mut this.state;
        poll_caught(&mut this.guard, this.span, cx, |cx| {
            let make = || invocation(call, ctx, flags);
            // A tool that fails to get ready answers with its failure.
            poll_tool(state, cx, make, router, || tools.clone()).map(|answer| answer?)
        })
    }
}

/// What a tool call's future comes to: `work` polled inside the call's
/// `span`, raced against the run's cancellation and deadline by `guard`,
/// its panic caught.
pub(super) fn poll_caught(
    guard: &mut Guard<'_>,
    span: &Span,
    cx: &mut Context<'_>,
    work: impl FnOnce(&mut Context<'_>) -> Poll<Result<ToolOutput, BoxError>>,
) -> Poll<Result<Caught, AgentError>> {
    guard.poll(cx, |cx| {
        let _entered = span.enter();
        match catch_unwind(AssertUnwindSafe(|| work(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(answer)) => Poll::Ready(Ok(answer)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    })
}

/// The invocation of `call` in the run of `ctx`, with whether it was
/// approved and whether the tool is idempotent (`flags`).
pub(super) fn invocation(
    call: &ToolCall,
    ctx: &RunContext,
    (approved, idempotent): (bool, bool),
) -> ToolInvocation {
    let mut invocation = ToolInvocation::new(call.clone(), ctx.clone());
    (invocation.approved, invocation.idempotent) = (approved, idempotent);
    invocation
}

/// Picks the tool (an answer of the router's own when it refuses the
/// call; `tool` when there is no router), drives it to readiness, calls it
/// with the invocation `make` builds, and polls its future. The outer
/// `Err`: the tool failed to get ready.
pub(super) fn poll_tool(
    state: &mut Calling,
    cx: &mut Context<'_>,
    make: impl FnOnce() -> ToolInvocation,
    router: Option<&ToolRouter>,
    tool: impl FnOnce() -> BoxTool,
) -> Poll<Result<Result<ToolOutput, BoxError>, BoxError>> {
    if let Calling::Start = state {
        let invocation = make();
        let mut tool = match router {
            Some(router) => match router.check(&invocation) {
                Ok(tool) => tool,
                Err(refused) => return Poll::Ready(Ok(Ok(refused))),
            },
            None => tool(),
        };
        match tool.poll_ready(cx) {
            Poll::Ready(Ok(())) => *state = Calling::Called(tool.call(invocation)),
            Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
            Poll::Pending => {
                *state = Calling::Waiting(tool, Some(Box::new(invocation)));
                return Poll::Pending;
            }
        }
    }
    if let Calling::Waiting(tool, invocation) = state {
        ready!(tool.poll_ready(cx))?;
        let invocation = invocation.take().expect("taken once the tool is ready");
        *state = Calling::Called(tool.call(*invocation));
    }
    match state {
        Calling::Called(fut) => fut.as_mut().poll(cx).map(Ok),
        Calling::Start | Calling::Waiting(..) => unreachable!("called above"),
    }
}
