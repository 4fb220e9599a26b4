//! [`HookedCall`]: a model call through the run's hooks that, when every
//! wrap hook hands it on, calls the run's own clone of the model stack in
//! place, as a run without hooks does: nothing boxed.

use std::borrow::Cow;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures::future::BoxFuture;
use tower::Service;

use crate::context::RunContext;
use crate::error::BoxError;
use crate::hooks::{HookPort, ModelWalk};
use crate::request::{BoxModel, ModelCall};
use crate::types::{ModelName, ModelResponse};

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
