//! [`HookedCall`] and [`HookedToolCall`]: a model or tool call through the
//! run's hooks that, when every wrap hook hands it on, calls the service
//! below in place, as a run without hooks does: nothing boxed. A model call
//! goes to the run's own clone of the model stack.

use std::borrow::Cow;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use futures::future::BoxFuture;
use tower::Service;

use crate::context::RunContext;
use crate::error::BoxError;
use crate::hooks::{CallAbort, HookFuture, HookPort, ModelWalk, ToolAnswer, ToolFinish, ToolWalk};
use crate::request::{BoxModel, BoxTool, ModelCall, ToolInvocation, ToolOutput};
use crate::service::ToolRouter;
use crate::types::{ModelName, ModelResponse, ToolCall};

/// One model call through `hooks`: the walk down their wrap hooks when
/// first polled, then the model's own future, or the future a wrap hook
/// answers with. Once it is done, [`take_model`](Self::take_model) gives the
/// model stack back, unless a wrap hook kept it.
pub(super) struct HookedCall<'a> {
    hooks: &'a dyn HookPort,
    /// The run's context, which the call carries.
    ctx: &'a RunContext,
    /// The agent's model, whose name a call to it borrows for its errors.
    model_name: &'a ModelName,
    state: State<'a>,
}

enum State<'a> {
    /// Not polled yet.
    Start(ModelCall, BoxModel),
    /// The model stack, ready or not, and its call once it was ready.
    Model {
        model: BoxModel,
        call: Option<ModelCall>,
        called: Option<<BoxModel as Service<ModelCall>>::Future>,
        /// The model's name, for its errors, when its answer goes to the
        /// hooks' [`HookPort::model_answer`]: the agent's, borrowed, unless
        /// a wrap hook sent the call to another.
        guarded: Option<Cow<'a, ModelName>>,
    },
    Hooked(BoxFuture<'a, Result<ModelResponse, BoxError>>),
    Taken,
}

impl Calling {
    /// The invocation of a call still waiting, leaving it taken.
    fn take_invocation(&mut self) -> ToolInvocation {
        match std::mem::replace(self, Calling::Taken) {
            Calling::Waiting(invocation) => invocation,
            _ => unreachable!("taken only while waiting"),
        }
    }
}

impl<'a> HookedCall<'a> {
    /// `call` in `ctx`'s run to `model` (the agent's, named `model_name`)
    /// through `hooks`.
    pub(super) fn new(
        hooks: &'a dyn HookPort,
        ctx: &'a RunContext,
        call: ModelCall,
        model: BoxModel,
        model_name: &'a ModelName,
    ) -> Self {
        Self {
            hooks,
            ctx,
            model_name,
            state: State::Start(call, model),
        }
    }

    /// The model stack, unless a wrap hook took it (or the call never
    /// started).
    pub(super) fn take_model(&mut self) -> Option<BoxModel> {
        match std::mem::replace(&mut self.state, State::Taken) {
            State::Model { model, .. } | State::Start(_, model) => Some(model),
            State::Hooked(_) | State::Taken => None,
        }
    }
}

impl Future for HookedCall<'_> {
    type Output = Result<ModelResponse, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if matches!(this.state, State::Start(..)) {
            let State::Start(call, model) = std::mem::replace(&mut this.state, State::Taken) else {
                unreachable!("checked above");
            };
            this.state = match this.hooks.walk_model(call, model, this.ctx) {
                ModelWalk::Service {
                    service,
                    call,
                    guarded,
                } => State::Model {
                    guarded: guarded.then(|| {
                        let named = &call.request.model;
                        // The agent's own name, shared by the request as a rule.
                        let same = std::ptr::eq(named.as_str(), this.model_name.as_str())
                            || named == this.model_name;
                        if same {
                            Cow::Borrowed(this.model_name)
                        } else {
                            Cow::Owned(named.clone())
                        }
                    }),
                    model: service,
                    call: Some(call),
                    called: None,
                },
                ModelWalk::Future(future) => State::Hooked(future),
            };
        }
        match &mut this.state {
            State::Hooked(future) => future.as_mut().poll(cx),
            State::Model {
                model,
                call,
                called,
                guarded,
            } => {
                if called.is_none() {
                    if let Err(err) = ready!(model.poll_ready(cx)) {
                        return Poll::Ready(Err(err));
                    }
                    let call = call.take().expect("HookedCall polled after completion");
                    *called = Some(model.call(call));
                }
                let fut = called.as_mut().expect("called above");
                let Some(name) = guarded else {
                    return fut.as_mut().poll(cx);
                };
                let answer = match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
                    Ok(Poll::Pending) => return Poll::Pending,
                    // A response goes out as it came.
                    Ok(Poll::Ready(Ok(response))) => return Poll::Ready(Ok(response)),
                    Ok(Poll::Ready(answer)) => Ok(answer),
                    Err(panic) => Err(panic),
                };
                Poll::Ready(this.hooks.model_answer(answer, name))
            }
            State::Start(..) | State::Taken => panic!("HookedCall polled after completion"),
        }
    }
}

/// One tool call through `hooks`, as [`HookedCall`] a model call: the walk
/// when first polled, then the tool stack's own future (the router's, when
/// no tool layer wraps it), or the future a wrap hook answers with. No
/// bigger than a call straight to the tool stack: a step's future, which
/// holds either, does not grow.
pub(super) struct HookedToolCall<'a> {
    hooks: &'a dyn HookPort,
    ctx: &'a RunContext,
    /// The call, for the tool's name in its errors.
    call: &'a ToolCall,
    /// The tool stack, cloned only for a wrap hook that calls it.
    tools: &'a Arc<BoxTool>,
    /// The router, when the tool stack is the router alone.
    router: Option<&'a ToolRouter>,
    /// Whether the tool stack may stream its progress.
    streams: bool,
    state: ToolState<'a>,
}

enum ToolState<'a> {
    /// Not polled yet.
    Start(ToolInvocation),
    Tool {
        /// The tool stack every wrap hook handed the call on to; `None`:
        /// the router, called from a borrow.
        stack: Option<BoxTool>,
        calling: Calling,
        finish: ToolFinish,
    },
    Hooked(HookFuture<'a, ToolOutput>),
    Done,
}

/// A call below the wrap hooks: waiting for its service, or called.
enum Calling {
    Waiting(ToolInvocation),
    Routed(<ToolRouter as Service<ToolInvocation>>::Future),
    Called(<BoxTool as Service<ToolInvocation>>::Future),
    Taken,
}

impl<'a> HookedToolCall<'a> {
    /// `invocation` of `call` in `ctx`'s run, to `tools` through `hooks`;
    /// `router` is `tools` unwrapped, when no layer wraps it; `streams`,
    /// whether `tools` may stream progress.
    pub(super) fn new(
        hooks: &'a dyn HookPort,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        invocation: ToolInvocation,
        tools: &'a Arc<BoxTool>,
        router: Option<&'a ToolRouter>,
        streams: bool,
    ) -> Self {
        Self {
            hooks,
            ctx,
            call,
            tools,
            router,
            streams,
            state: ToolState::Start(invocation),
        }
    }
}

impl Future for HookedToolCall<'_> {
    type Output = Result<ToolOutput, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if matches!(this.state, ToolState::Start(..)) {
            let ToolState::Start(invocation) = std::mem::replace(&mut this.state, ToolState::Done)
            else {
                unreachable!("checked above");
            };
            this.state = match this
                .hooks
                .walk_tool(invocation, this.tools, this.streams, this.ctx)
            {
                ToolWalk::Service {
                    service,
                    invocation,
                    finish,
                } => {
                    // What every wrap hook handed on is the agent's own tool
                    // stack: the router itself, when nothing wraps it.
                    let mut stack = match this.router {
                        Some(_) => None,
                        None => Some(service.unwrap_or_else(|| BoxTool::clone(this.tools))),
                    };
                    // Called at once if it is ready, as a call without
                    // hooks is: the invocation goes from the walk to the
                    // tool without being parked on the way.
                    let calling = match call_now(&mut stack, this.router, invocation, cx) {
                        Ok(calling) => calling,
                        Err(err) => {
                            let answer = ToolAnswer::Failed(err);
                            let call = this.call;
                            return Poll::Ready(
                                this.hooks.finish_tool(answer, call, this.ctx, &finish),
                            );
                        }
                    };
                    ToolState::Tool {
                        stack,
                        calling,
                        finish,
                    }
                }
                ToolWalk::Future(future) => ToolState::Hooked(future),
            };
        }
        let (stack, calling, finish) = match &mut this.state {
            ToolState::Hooked(future) => return Pin::new(future).poll(cx),
            ToolState::Tool {
                stack,
                calling,
                finish,
            } => (stack, calling, &*finish),
            ToolState::Start(..) | ToolState::Done => {
                panic!("HookedToolCall polled after completion")
            }
        };
        let abort = finish.abort.as_deref();
        let answer = match abort.and_then(CallAbort::failed) {
            Some(err) => ToolAnswer::Failed(err),
            None => match poll_tool(stack, this.router, calling, finish.guarded(), cx) {
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
            answer => this.hooks.finish_tool(answer, this.call, this.ctx, finish),
        };
        this.state = ToolState::Done;
        Poll::Ready(result)
    }
}

/// The call of the tool stack (`stack`, or `router`) with
/// `invocation` when it is ready at once; the invocation waiting for it
/// otherwise.
fn call_now(
    stack: &mut Option<BoxTool>,
    router: Option<&ToolRouter>,
    invocation: ToolInvocation,
    cx: &mut Context<'_>,
) -> Result<Calling, BoxError> {
    match (stack.as_mut(), router) {
        (Some(tools), _) => match tools.poll_ready(cx) {
            Poll::Ready(Ok(())) => Ok(Calling::Called(tools.call(invocation))),
            Poll::Ready(Err(err)) => Err(err),
            Poll::Pending => Ok(Calling::Waiting(invocation)),
        },
        // The router is always ready, and routes from a borrow.
        (None, Some(router)) => Ok(Calling::Routed(router.route(invocation))),
        (None, None) => unreachable!("the router stands for the tool stack only when set"),
    }
}

/// Drives the tool stack (`stack`, or `router`, always ready) to readiness,
/// calls it and polls its future, its panic caught when `guarded`.
fn poll_tool(
    stack: &mut Option<BoxTool>,
    router: Option<&ToolRouter>,
    calling: &mut Calling,
    guarded: bool,
    cx: &mut Context<'_>,
) -> Poll<ToolAnswer> {
    if matches!(calling, Calling::Waiting(_)) {
        let called = match (stack.as_mut(), router) {
            (Some(tools), _) => {
                if let Err(err) = ready!(tools.poll_ready(cx)) {
                    return Poll::Ready(ToolAnswer::Failed(err));
                }
                Calling::Called(tools.call(calling.take_invocation()))
            }
            (None, Some(router)) => Calling::Routed(router.route(calling.take_invocation())),
            (None, None) => unreachable!("the router stands for the tool stack only when set"),
        };
        *calling = called;
    }
    let mut poll = |cx: &mut Context<'_>| match calling {
        Calling::Routed(fut) => Pin::new(fut).poll(cx),
        Calling::Called(fut) => fut.as_mut().poll(cx),
        Calling::Waiting(_) | Calling::Taken => panic!("HookedToolCall polled after completion"),
    };
    if !guarded {
        return poll(cx).map(|answer| ToolAnswer::Answered(Ok(answer)));
    }
    match catch_unwind(AssertUnwindSafe(|| poll(cx))) {
        Ok(Poll::Pending) => Poll::Pending,
        Ok(Poll::Ready(answer)) => Poll::Ready(ToolAnswer::Answered(Ok(answer))),
        Err(panic) => Poll::Ready(ToolAnswer::Answered(Err(panic))),
    }
}
