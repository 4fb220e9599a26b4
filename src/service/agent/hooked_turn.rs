//! [`HookedCall`] and [`HookedToolCall`]: a model or tool call through the
//! run's hooks that, when every wrap hook hands it on, calls the service
//! below in place, as a run without hooks does: nothing boxed. A model call
//! goes to the run's own clone of the model stack.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures::future::BoxFuture;
use tower::Service;

use crate::context::RunContext;
use crate::error::BoxError;
use crate::hooks::{CallAbort, HookFuture, HookPort, ModelWalk, ToolAnswer, ToolFinish, ToolWalk};
use crate::request::{BoxModel, BoxTool, ModelCall, ToolInvocation, ToolOutput};
use crate::service::ToolRouter;
use crate::types::{ModelName, ModelResponse};

/// One model call through `hooks`: the walk down their wrap hooks when
/// first polled, then the model's own future, or the future a wrap hook
/// answers with. Once it is done, [`take_model`](Self::take_model) gives the
/// model stack back, unless a wrap hook kept it.
pub(super) struct HookedCall<'a> {
    hooks: &'a dyn HookPort,
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
        /// hooks' [`HookPort::model_answer`].
        guarded: Option<ModelName>,
    },
    Hooked(BoxFuture<'a, Result<ModelResponse, BoxError>>),
    Taken,
}

impl<'a> HookedCall<'a> {
    /// `call` to `model` through `hooks`.
    pub(super) fn new(hooks: &'a dyn HookPort, call: ModelCall, model: BoxModel) -> Self {
        Self {
            hooks,
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
            this.state = match this.hooks.walk_model(call, model) {
                ModelWalk::Service {
                    service,
                    call,
                    guarded,
                } => State::Model {
                    guarded: guarded.then(|| call.request.model.clone()),
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
/// no tool layer wraps it), or the future a wrap hook answers with.
pub(super) struct HookedToolCall<'a> {
    hooks: &'a dyn HookPort,
    ctx: &'a RunContext,
    /// The tool's name, for its errors.
    name: &'a str,
    /// The router, when the tool stack is the router alone.
    router: Option<&'a ToolRouter>,
    state: ToolState<'a>,
}

enum ToolState<'a> {
    /// Not polled yet.
    Start(ToolInvocation, BoxTool),
    Tool {
        below: Below,
        invocation: Option<ToolInvocation>,
        finish: ToolFinish,
    },
    Hooked(HookFuture<'a, ToolOutput>),
    Done,
}

/// The service below the wrap hooks, and its call once it was ready.
enum Below {
    Router(
        ToolRouter,
        Option<<ToolRouter as Service<ToolInvocation>>::Future>,
    ),
    Stack(
        BoxTool,
        Option<<BoxTool as Service<ToolInvocation>>::Future>,
    ),
}

impl<'a> HookedToolCall<'a> {
    /// `invocation` of tool `name` in `ctx`'s run, to `tools` through
    /// `hooks`; `router` is `tools` unwrapped, when no layer wraps it.
    pub(super) fn new(
        hooks: &'a dyn HookPort,
        ctx: &'a RunContext,
        name: &'a str,
        invocation: ToolInvocation,
        tools: BoxTool,
        router: Option<&'a ToolRouter>,
    ) -> Self {
        Self {
            hooks,
            ctx,
            name,
            router,
            state: ToolState::Start(invocation, tools),
        }
    }
}

impl Future for HookedToolCall<'_> {
    type Output = Result<ToolOutput, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if matches!(this.state, ToolState::Start(..)) {
            let ToolState::Start(invocation, tools) =
                std::mem::replace(&mut this.state, ToolState::Done)
            else {
                unreachable!("checked above");
            };
            this.state = match this.hooks.walk_tool(invocation, tools) {
                ToolWalk::Service {
                    service,
                    invocation,
                    finish,
                } => ToolState::Tool {
                    // What every wrap hook handed on is the agent's own tool
                    // stack: the router itself, when nothing wraps it.
                    below: match this.router {
                        Some(router) => Below::Router(router.clone(), None),
                        None => Below::Stack(service, None),
                    },
                    invocation: Some(invocation),
                    finish,
                },
                ToolWalk::Future(future) => ToolState::Hooked(future),
            };
        }
        let (below, invocation, finish) = match &mut this.state {
            ToolState::Hooked(future) => return Pin::new(future).poll(cx),
            ToolState::Tool {
                below,
                invocation,
                finish,
            } => (below, invocation, &*finish),
            ToolState::Start(..) | ToolState::Done => {
                panic!("HookedToolCall polled after completion")
            }
        };
        let abort = finish.abort.as_deref();
        let failed = abort.and_then(CallAbort::failed);
        let answer = match failed {
            Some(err) => ToolAnswer::Failed(err),
            None => {
                if let Some(abort) = abort {
                    abort.register(cx.waker());
                }
                let polled = match below {
                    Below::Router(router, called) => {
                        poll_tool(router, called, invocation, finish.guarded, cx)
                    }
                    Below::Stack(tools, called) => {
                        poll_tool(tools, called, invocation, finish.guarded, cx)
                    }
                };
                match polled {
                    Poll::Ready(answer) => answer,
                    Poll::Pending => match abort.and_then(CallAbort::failed) {
                        Some(err) => ToolAnswer::Failed(err),
                        None => return Poll::Pending,
                    },
                }
            }
        };
        let result = this.hooks.finish_tool(answer, this.name, this.ctx, finish);
        this.state = ToolState::Done;
        Poll::Ready(result)
    }
}

/// Drives `service` to readiness, calls it with `invocation` and polls its
/// future, its panic caught when `guarded`.
fn poll_tool<S>(
    service: &mut S,
    called: &mut Option<S::Future>,
    invocation: &mut Option<ToolInvocation>,
    guarded: bool,
    cx: &mut Context<'_>,
) -> Poll<ToolAnswer>
where
    S: Service<ToolInvocation, Response = ToolOutput, Error = BoxError>,
    S::Future: Unpin,
{
    if called.is_none() {
        if let Err(err) = ready!(service.poll_ready(cx)) {
            return Poll::Ready(ToolAnswer::Failed(err));
        }
        let invocation = invocation
            .take()
            .expect("HookedToolCall polled after completion");
        *called = Some(service.call(invocation));
    }
    let fut = called.as_mut().expect("called above");
    if !guarded {
        return Pin::new(fut)
            .poll(cx)
            .map(|answer| ToolAnswer::Answered(Ok(answer)));
    }
    match catch_unwind(AssertUnwindSafe(|| Pin::new(&mut *fut).poll(cx))) {
        Ok(Poll::Pending) => Poll::Pending,
        Ok(Poll::Ready(answer)) => Poll::Ready(ToolAnswer::Answered(Ok(answer))),
        Err(panic) => Poll::Ready(ToolAnswer::Answered(Err(panic))),
    }
}
