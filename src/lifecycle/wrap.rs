//! Wrap hooks: what `wrap_model`/`wrap_tool` return ([`Wrapped`]), the
//! wrap-only traits [`ModelMiddleware`] and [`ToolMiddleware`], and the
//! requests a wrap hook wraps ([`WrapRequest`]).

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use super::attribute::{attribute, name_tripwire};
use super::edit_watch::watcher;
use super::inline_bytes::{same_bytes, Builder, InlineBytes};
use super::{HookPoint, Middleware, Next};
use crate::context::RunContext;
use crate::error::{panic_message, AgentError, BoxError, ToolPanicked};
use crate::request::{tool_failure, ModelCall, ToolInvocation, ToolOutput};
use crate::types::{History, ModelName, ModelResponse, ToolCall};

/// What a wrap hook ([`Middleware::wrap_model`], [`Middleware::wrap_tool`])
/// returns: the future of its answer, or the call handed on unchanged.
///
/// - [`Wrapped::new`]: the hook's own future (boxed once), bracketed by
///   `MiddlewareStarted`/`MiddlewareCompleted` events.
/// - [`Wrapped::next`]: nothing to do this time; the call goes on to the
///   rest of the stack with no event and no allocation.
///
/// The default bodies return a third, crate-internal value meaning "not
/// overridden", which the stack learns once and then skips.
#[must_use = "a wrap hook does nothing unless the stack runs it"]
pub struct Wrapped<'a, Req: WrapRequest>(pub(crate) WrappedKind<'a, Req>);

pub(crate) enum WrappedKind<'a, Req: WrapRequest> {
    NotOverridden(Req, Next<Req>),
    Next(Req, Next<Req>),
    Future(BoxFuture<'a, Result<Req::Response, BoxError>>),
}

impl<'a, Req: WrapRequest> Wrapped<'a, Req> {
    /// The hook's answer is `future`'s.
    pub fn new<F>(future: F) -> Self
    where
        F: Future<Output = Result<Req::Response, BoxError>> + Send + 'a,
    {
        Wrapped(WrappedKind::Future(Box::pin(future)))
    }

    /// Hands `req` (changed or not) on to `next`, without a future of its
    /// own: no event, no allocation.
    pub fn next(req: Req, next: Next<Req>) -> Self {
        Wrapped(WrappedKind::Next(req, next))
    }

    pub(crate) fn not_overridden(req: Req, next: Next<Req>) -> Self {
        Wrapped(WrappedKind::NotOverridden(req, next))
    }
}

impl<'a, Req: WrapRequest> From<BoxFuture<'a, Result<Req::Response, BoxError>>>
    for Wrapped<'a, Req>
{
    fn from(future: BoxFuture<'a, Result<Req::Response, BoxError>>) -> Self {
        Wrapped(WrappedKind::Future(future))
    }
}

impl<Req: WrapRequest> fmt::Debug for Wrapped<'_, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            WrappedKind::NotOverridden(..) | WrappedKind::Next(..) => "Wrapped::Next",
            WrappedKind::Future(_) => "Wrapped::Future",
        })
    }
}

/// A wrap-only middleware around each model call: proceed
/// (`next.run(call)` once), short-circuit (answer without it), retry (call
/// it in a loop, cloning `next`), or fall back (call it, then answer
/// something else on error).
///
/// Push it with [`MiddlewareStack::push_model`](super::MiddlewareStack::push_model),
/// or make it a tower layer with [`WrapModelLayer`](super::WrapModelLayer).
/// A type with lifecycle hooks too implements [`Middleware::wrap_model`]
/// instead, and is pushed once.
///
/// ```
/// use futures::future::BoxFuture;
/// use tower_agent::lifecycle::{ModelMiddleware, ModelNext};
/// use tower_agent::types::ModelResponse;
/// use tower_agent::{BoxError, ModelCall};
///
/// /// Tries the call once more when it fails.
/// struct RetryOnce;
///
/// impl ModelMiddleware for RetryOnce {
///     fn name(&self) -> &str {
///         "retry-once"
///     }
///
///     fn wrap_model<'a>(&'a self, call: ModelCall, next: ModelNext) -> BoxFuture<'a, Result<ModelResponse, BoxError>> {
///         Box::pin(async move {
///             match next.clone().run(call.clone()).await {
///                 Ok(response) => Ok(response),
///                 Err(_) => next.run(call).await,
///             }
///         })
///     }
/// }
/// ```
pub trait ModelMiddleware: Send + Sync + 'static {
    /// The name events and tripwires carry.
    fn name(&self) -> &str;

    /// Whether the run must hold each turn's text until `after_model` ran:
    /// set it when the middleware retries or blocks answers whose text would
    /// otherwise already have streamed.
    fn holds_stream(&self) -> bool {
        false
    }

    /// Wraps one model call.
    fn wrap_model<'a>(
        &'a self,
        call: ModelCall,
        next: ModelNext,
    ) -> BoxFuture<'a, Result<ModelResponse, BoxError>>;
}

/// A wrap-only middleware around each tool call that passed approval:
/// change the arguments, retry, or answer for the tool. Arguments it changes
/// are validated against the tool's schema again, and the layers inside see
/// `approved == false`: an approval never carries over to new arguments.
///
/// Push it with [`MiddlewareStack::push_tool`](super::MiddlewareStack::push_tool),
/// or make it a tower layer with [`WrapToolLayer`](super::WrapToolLayer).
pub trait ToolMiddleware: Send + Sync + 'static {
    /// The name events and tripwires carry.
    fn name(&self) -> &str;

    /// Wraps one tool call.
    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> BoxFuture<'a, Result<ToolOutput, BoxError>>;
}

/// A wrap-only model middleware in the one list of a stack.
pub(crate) struct ModelOnly(pub(crate) Arc<dyn ModelMiddleware>);

impl Middleware for ModelOnly {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn holds_stream(&self) -> bool {
        self.0.holds_stream()
    }

    fn wrap_model<'a>(&'a self, call: ModelCall, next: ModelNext) -> Wrapped<'a, ModelCall> {
        self.0.wrap_model(call, next).into()
    }
}

/// A wrap-only tool middleware in the one list of a stack.
pub(crate) struct ToolOnly(pub(crate) Arc<dyn ToolMiddleware>);

impl Middleware for ToolOnly {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> Wrapped<'a, ToolInvocation> {
        self.0.wrap_tool(invocation, next).into()
    }
}

/// The `next` of a model wrap hook.
pub type ModelNext = Next<ModelCall>;

/// The `next` of a tool wrap hook.
pub type ToolNext = Next<ToolInvocation>;

pub(crate) mod sealed {
    pub(crate) use crate::lifecycle::tool_snapshot::ToolSnapshot;

    use super::*;

    /// What the wrap chain needs of a request, out of the public surface.
    #[allow(unreachable_pub)]
    pub trait Plumbing: Send + Sized + 'static {
        /// What a middleware was handed, to compare with what it hands on.
        type Snapshot: Clone + Send + Sync + 'static;
        /// The name of what is called (read only on an error).
        type Name: fmt::Display + Send + 'static;
        /// What is called: `model` or `tool`.
        const KIND: &'static str;
        /// Whether [`recover`](Self::recover) turns a failure into an answer
        /// (and needs the run's context for it).
        const RECOVERS: bool;

        fn wrap_hook() -> HookPoint;
        /// Calls `mw`'s wrap hook for this request.
        fn wrap<'a>(mw: &'a dyn Middleware, req: Self, next: Next<Self>) -> Wrapped<'a, Self>
        where
            Self: WrapRequest;
        fn snapshot(&self) -> Self::Snapshot;
        /// Called on the request middleware `by` hands to `next`, with what
        /// it was handed itself: `true` when it is handed on unchanged.
        fn reconcile(&mut self, by: &Arc<str>, received: &Self::Snapshot) -> bool;
        fn callee(&self) -> Self::Name;
        /// What the panic of the service below a chain becomes: a model's
        /// an error naming it, a tool's a [`ToolPanicked`] (its message
        /// the model reads only if told to).
        fn panicked(name: &Self::Name, payload: &(dyn Any + Send)) -> BoxError;
        /// What an error of the service below a lifecycle chain becomes: a
        /// tool's failure is an error result the middleware (and the model)
        /// read.
        fn recover(
            ctx: &RunContext,
            name: &Self::Name,
            err: BoxError,
        ) -> Result<<Self as WrapRequest>::Response, BoxError>
        where
            Self: WrapRequest;
        /// What the error of a middleware in a lifecycle chain becomes.
        fn middleware_error(err: BoxError, name: &str) -> BoxError;
    }
}

/// A request a wrap hook can wrap: [`ModelCall`] or [`ToolInvocation`].
/// Sealed.
pub trait WrapRequest: sealed::Plumbing {
    /// What the call answers.
    type Response: Send + 'static;

    /// The run's context.
    fn context(&self) -> &RunContext;
}

impl WrapRequest for ModelCall {
    type Response = ModelResponse;

    fn context(&self) -> &RunContext {
        &self.context
    }
}

impl sealed::Plumbing for ModelCall {
    type Snapshot = History;
    type Name = ModelName;
    const KIND: &'static str = "model";
    const RECOVERS: bool = false;

    fn wrap_hook() -> HookPoint {
        HookPoint::WrapModel
    }

    fn wrap<'a>(mw: &'a dyn Middleware, req: Self, next: ModelNext) -> Wrapped<'a, Self> {
        mw.wrap_model(req, next)
    }

    fn snapshot(&self) -> History {
        self.request.messages.clone()
    }

    /// Tells a prompt-cache guard, if the run has one, that `by` changed the
    /// messages.
    fn reconcile(&mut self, by: &Arc<str>, received: &History) -> bool {
        if History::ptr_eq(received, &self.request.messages) {
            return true;
        }
        if let Some(watch) = watcher(&self.context) {
            watch.record(by, received.clone(), &self.request.messages);
        }
        false
    }

    fn callee(&self) -> ModelName {
        self.request.model.clone()
    }

    fn panicked(name: &ModelName, payload: &(dyn Any + Send)) -> BoxError {
        format!("`model:{name}` panicked: {}", panic_message(payload)).into()
    }

    fn recover(_: &RunContext, _: &ModelName, err: BoxError) -> Result<ModelResponse, BoxError> {
        // Retry and fallback middleware must see the model's failures.
        Err(err)
    }

    fn middleware_error(err: BoxError, name: &str) -> BoxError {
        name_tripwire(err, name, HookPoint::WrapModel.as_str())
    }
}

impl WrapRequest for ToolInvocation {
    type Response = ToolOutput;

    fn context(&self) -> &RunContext {
        &self.context
    }
}

impl sealed::Plumbing for ToolInvocation {
    type Snapshot = sealed::ToolSnapshot;
    type Name = ToolCallee;
    const KIND: &'static str = "tool";
    const RECOVERS: bool = true;

    fn wrap_hook() -> HookPoint {
        HookPoint::WrapTool
    }

    fn wrap<'a>(mw: &'a dyn Middleware, req: Self, next: ToolNext) -> Wrapped<'a, Self> {
        mw.wrap_tool(req, next)
    }

    fn snapshot(&self) -> sealed::ToolSnapshot {
        sealed::ToolSnapshot::of(&self.call.arguments, &self.args)
    }

    /// Keeps the argument text and the parsed arguments in step, whichever
    /// the middleware changed, and withdraws the approval when they changed.
    fn reconcile(&mut self, _by: &Arc<str>, received: &sealed::ToolSnapshot) -> bool {
        let text_changed = !same_bytes(self.call.arguments.as_bytes(), received.text());
        let args_changed = !received.same_args(&self.args);
        if !text_changed && !args_changed {
            return true;
        }
        if text_changed && !args_changed {
            self.args = serde_json::from_str(&self.call.arguments).unwrap_or(Value::Null);
        } else if args_changed && !text_changed {
            self.call.arguments = self.args.to_string();
        }
        let changed = !received.same_args(&self.args)
            || (self.args.is_null() && self.call.arguments.as_bytes() != received.text());
        if changed {
            self.approved = false;
        }
        false
    }

    fn callee(&self) -> ToolCallee {
        ToolCallee::of(&self.call)
    }

    fn panicked(name: &ToolCallee, payload: &(dyn Any + Send)) -> BoxError {
        Box::new(ToolPanicked::new(name.tool(), payload))
    }

    fn recover(ctx: &RunContext, name: &ToolCallee, err: BoxError) -> Result<ToolOutput, BoxError> {
        let err = AgentError::classify(err);
        tool_failure(ctx, name.tool(), name.call_id(), err).map_err(Into::into)
    }

    fn middleware_error(err: BoxError, name: &str) -> BoxError {
        Box::new(attribute(err, name, HookPoint::WrapTool))
    }
}

/// The tool call below the wrap hooks, as the chain names it in its errors
/// and its results: the tool's name and the call's id, in one copy, inline
/// when short. Public only to name it in the wrap chain's sealed plumbing;
/// unreachable outside the crate.
#[allow(unreachable_pub)]
#[derive(Clone, Debug)]
pub struct ToolCallee {
    /// The name, then the id.
    packed: InlineBytes,
    /// Where the name ends and the id starts.
    name_end: usize,
}

impl ToolCallee {
    pub(crate) fn of(call: &ToolCall) -> Self {
        let mut packed = Builder::new();
        packed.extend(call.name.as_bytes());
        let name_end = packed.len();
        packed.extend(call.id.as_bytes());
        Self {
            packed: packed.finish(),
            name_end,
        }
    }

    /// The tool's name.
    pub(crate) fn tool(&self) -> &str {
        // Cut where two whole strings were joined: each part is UTF-8.
        std::str::from_utf8(&self.packed.as_bytes()[..self.name_end]).unwrap_or_default()
    }

    /// The call's id.
    pub(crate) fn call_id(&self) -> &str {
        std::str::from_utf8(&self.packed.as_bytes()[self.name_end..]).unwrap_or_default()
    }
}

/// The tool's name.
impl fmt::Display for ToolCallee {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.tool())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callee_keeps_the_name_and_the_id_apart() {
        let long = "n".repeat(100);
        for (name, id) in [("search", "call_1"), ("", "x"), (&long, "call_é")] {
            let callee = ToolCallee::of(&ToolCall::new(id, name, "{}"));
            assert_eq!((callee.tool(), callee.call_id()), (name, id));
            assert_eq!(callee.to_string(), name);
        }
    }
}
