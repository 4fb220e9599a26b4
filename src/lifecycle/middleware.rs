//! The [`Middleware`] trait: every hook of a run, each with a no-op default
//! the stack recognises, and the [`Hook`] a hook returns.

use std::fmt;
use std::future::Future;

use futures::future::BoxFuture;

use super::wrap::{ModelNext, ToolNext, Wrapped};
use crate::context::RunContext;
use crate::error::{AgentError, BoxError};
use crate::hooks::{Compaction, Notification, RunOutcome, RunStart, ToolCallResult, ToolVerdict};
use crate::request::{ModelCall, ToolInvocation, ToolOutput};
use crate::types::{ApprovalDecision, History, Message, ModelDelta, ModelResponse, ToolCall};

/// What a hook returns: nothing to do, a result already there, or a future.
///
/// - [`Hook::skip`]: the hook has nothing to do here (what every default
///   does). The stack treats it as if the hook were not there: no events,
///   no value.
/// - [`Hook::ok`] / [`Hook::ready`]: a synchronous hook, done. Costs no
///   allocation.
/// - [`Hook::new`]: an async hook; its future is boxed.
///
/// ```
/// use tower_agent::lifecycle::Hook;
///
/// let done: Hook<'_, u32> = Hook::ok(3);
/// assert!(done.is_ready());
/// let later: Hook<'_, u32> = Hook::new(async { Ok(3) });
/// assert!(!later.is_ready() && !later.is_skip());
/// ```
#[must_use = "a hook does nothing unless the stack runs it"]
pub struct Hook<'a, T>(pub(crate) HookKind<'a, T>);

pub(crate) enum HookKind<'a, T> {
    /// What the trait's default bodies return: the hook is not overridden.
    /// The stack learns it once and never calls the hook again.
    NotOverridden,
    Skip,
    Ready(Result<T, BoxError>),
    Pending(BoxFuture<'a, Result<T, BoxError>>),
}

impl<'a, T> Hook<'a, T> {
    /// Nothing to do this time: no events, no value. The hook is still
    /// asked the next time.
    pub fn skip() -> Self {
        Hook(HookKind::Skip)
    }

    /// What a hook the middleware does not override answers (the trait's
    /// default bodies). A wrapper that forwards a hook to an inner
    /// middleware forwards this too.
    pub(crate) fn not_overridden() -> Self {
        Hook(HookKind::NotOverridden)
    }

    /// Done with `value`.
    pub fn ok(value: T) -> Self {
        Hook(HookKind::Ready(Ok(value)))
    }

    /// Done with `result`.
    pub fn ready(result: Result<T, BoxError>) -> Self {
        Hook(HookKind::Ready(result))
    }

    /// Failed with `error` (a [`tripwire`](crate::tripwire) among others).
    pub fn err(error: impl Into<BoxError>) -> Self {
        Hook(HookKind::Ready(Err(error.into())))
    }

    /// An async hook: the stack awaits `future`.
    pub fn new<F>(future: F) -> Self
    where
        F: Future<Output = Result<T, BoxError>> + Send + 'a,
    {
        Hook(HookKind::Pending(Box::pin(future)))
    }

    /// Whether this is [`Hook::skip`], or the answer of a hook that is not
    /// overridden.
    pub fn is_skip(&self) -> bool {
        matches!(self.0, HookKind::Skip | HookKind::NotOverridden)
    }

    /// Whether the result is already there.
    pub fn is_ready(&self) -> bool {
        matches!(self.0, HookKind::Ready(_))
    }

    /// Runs the hook: `None` for [`Hook::skip`]. For tests of a middleware
    /// on its own; in a run the stack does this.
    pub async fn run(self) -> Option<Result<T, BoxError>> {
        match self.0 {
            HookKind::Skip | HookKind::NotOverridden => None,
            HookKind::Ready(result) => Some(result),
            HookKind::Pending(future) => Some(future.await),
        }
    }
}

impl<T> fmt::Debug for Hook<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            HookKind::Skip | HookKind::NotOverridden => "Hook::Skip",
            HookKind::Ready(_) => "Hook::Ready",
            HookKind::Pending(_) => "Hook::Pending",
        })
    }
}

impl<'a, T, E: Into<BoxError>> From<Result<T, E>> for Hook<'a, T> {
    fn from(result: Result<T, E>) -> Self {
        Hook::ready(result.map_err(Into::into))
    }
}

/// What a middleware's error does to the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailPolicy {
    /// Its error fails the run (the default; what a guard wants).
    #[default]
    Closed,
    /// Its error, or its panic, is logged as a
    /// [`MiddlewareFailedOpen`](crate::event::AgentEvent::MiddlewareFailedOpen)
    /// event and the run goes on as if the hook had no opinion: for
    /// observers that must never fail a run. A [`tripwire`](crate::tripwire)
    /// is a decision, not a failure: it still ends the run.
    Open,
}

/// Lifecycle hooks around a run. Every hook has a no-op default; see the
/// [module docs](super) for when each runs, the order, the events and
/// errors.
///
/// Values a hook may change are passed `&mut`; a hook that decides returns a
/// typed value. Every hook returns a [`Hook`]: its `Err` short-circuits the
/// stack and fails the run (unless the middleware is
/// [`FailPolicy::Open`]); a [`tripwire`](crate::tripwire) ends it with
/// `GUARDRAIL_TRIPPED`, naming this middleware and the hook.
///
/// # Which hooks run
///
/// Override the hooks you need; nothing else is declared. The default bodies
/// answer "not overridden", which the stack learns the first time it meets
/// that hook point and from then on skips at no cost: no call, no event, no
/// allocation, no boxed future. Every hook you override runs, in every
/// build. A wrapper that forwards every hook to an inner middleware returns
/// what the inner one returns, so it forwards "not overridden" too.
///
/// The wrap hooks ([`wrap_model`](Self::wrap_model),
/// [`wrap_tool`](Self::wrap_tool)) belong to the same trait: a type with
/// lifecycle hooks and wrap hooks is pushed once, with one name.
///
/// ```
/// use tower_agent::lifecycle::{Hook, Middleware};
/// use tower_agent::types::History;
/// use tower_agent::RunContext;
///
/// struct Reminder;
///
/// impl Middleware for Reminder {
///     fn name(&self) -> &str {
///         "reminder"
///     }
///
///     fn before_model<'a>(&'a self, ctx: &'a RunContext, messages: &'a mut History) -> Hook<'a, ()> {
///         if ctx.iteration() == 5 {
///             messages.push(tower_agent::Message::user("Wrap up soon."));
///         }
///         Hook::ok(())
///     }
/// }
/// ```
///
/// For the common cases, the closures of
/// [`MiddlewareStack`](super::MiddlewareStack) need no type and no
/// lifetimes: `MiddlewareStack::new().before_model("reminder", |ctx, messages| { .. })`.
#[allow(unused_variables)]
pub trait Middleware: Send + Sync + 'static {
    /// The name events, tripwires and stops carry.
    fn name(&self) -> &str;

    /// Whether the run must hold each turn's streamed text until
    /// `after_model` ran, then send the final text in one piece.
    fn holds_stream(&self) -> bool {
        false
    }

    /// Whether its errors fail the run (the default) or are only logged.
    fn fail_policy(&self) -> FailPolicy {
        FailPolicy::Closed
    }

    #[doc(alias = "on_agent_start")]
    #[doc(alias = "start_run")]
    /// A run starts, new or resumed, before its input guard and its first
    /// model call. `Some(text)` adds `text` right after the system prompt,
    /// for this run only (it is not kept in the transcript).
    fn before_agent<'a>(
        &'a self,
        ctx: &'a RunContext,
        start: RunStart,
    ) -> Hook<'a, Option<String>> {
        Hook::not_overridden()
    }

    #[doc(alias = "input_guardrail")]
    /// A new run's input, before any model call: the input guard. `messages`
    /// are what the first turn starts from (system prompt and history).
    /// `Some(text)` adds `text` after the input as a system message, kept in
    /// the transcript.
    fn before_run<'a>(
        &'a self,
        ctx: &'a RunContext,
        input: &'a mut Message,
        messages: &'a History,
    ) -> Hook<'a, Option<String>> {
        Hook::not_overridden()
    }

    #[doc(alias = "on_llm_start")]
    #[doc(alias = "beforeModelCall")]
    /// Before each model turn; may change the messages from then on. After
    /// an edit, the run checks that every tool call still has its result.
    fn before_model<'a>(&'a self, ctx: &'a RunContext, messages: &'a mut History) -> Hook<'a, ()> {
        Hook::not_overridden()
    }

    /// Each streamed delta of a model call, in a run that streams; may change
    /// it. Synchronous and without events: it is on the token hot path. An
    /// `Err` aborts the model call.
    ///
    /// The default answers with an error the stack reads as "not
    /// overridden"; a wrapper forwarding this hook returns the inner
    /// middleware's answer as it is.
    fn on_model_delta(&self, ctx: &RunContext, delta: &mut ModelDelta) -> Result<(), BoxError> {
        Err(not_overridden())
    }

    #[doc(alias = "wrap_model_call")]
    /// Around each model call: change the call, call
    /// [`next.run(call)`](super::Next::run) 0..N times (proceed, retry, fall
    /// back), or answer without it. Return [`Wrapped::new`] with the future;
    /// [`Wrapped::next`] proceeds without waiting for anything of its own.
    /// The stack's wrap hooks also see the model calls of nested runs, and
    /// each invocation is bracketed by `MiddlewareStarted`/`Completed`.
    fn wrap_model<'a>(&'a self, call: ModelCall, next: ModelNext) -> Wrapped<'a, ModelCall> {
        Wrapped::not_overridden(call, next)
    }

    #[doc(alias = "on_llm_end")]
    /// After each answer, before the run uses it: may replace its content or
    /// its tool calls (an empty list makes it the final answer).
    fn after_model<'a>(
        &'a self,
        ctx: &'a RunContext,
        response: &'a mut ModelResponse,
    ) -> Hook<'a, ()> {
        Hook::not_overridden()
    }

    #[doc(alias = "on_tool_start")]
    #[doc(alias = "beforeToolCall")]
    /// Before each tool call is decided, and again for a waiting call when a
    /// paused run resumes (`resumed`). `call` carries the arguments as the
    /// middleware before this one left them. See [`ToolVerdict`] and the
    /// module docs for how verdicts merge.
    fn before_tool<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        resumed: bool,
    ) -> Hook<'a, ToolVerdict> {
        Hook::not_overridden()
    }

    /// Each delta a tool streams (its progress); may change it. Synchronous,
    /// without events. An `Err` aborts the tool call.
    fn on_tool_delta(
        &self,
        ctx: &RunContext,
        call: &ToolCall,
        delta: &mut ModelDelta,
    ) -> Result<(), BoxError> {
        Err(not_overridden())
    }

    #[doc(alias = "wrap_tool_call")]
    /// Around each tool call that passed approval: change the arguments
    /// (validated again; the approval is withdrawn), retry, or answer for
    /// the tool. See [`wrap_model`](Self::wrap_model).
    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> Wrapped<'a, ToolInvocation> {
        Wrapped::not_overridden(invocation, next)
    }

    #[doc(alias = "on_tool_end")]
    #[doc(alias = "afterToolCall")]
    /// After each tool call; may change the result the model reads.
    fn after_tool<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        output: &'a mut ToolOutput,
    ) -> Hook<'a, ()> {
        Hook::not_overridden()
    }

    /// Every call of a step has its result, before the next model call: may
    /// [`add_context`](RunContext::add_context) or [`stop`](RunContext::stop).
    fn after_tool_batch<'a>(
        &'a self,
        ctx: &'a RunContext,
        results: &'a [ToolCallResult<'a>],
    ) -> Hook<'a, ()> {
        Hook::not_overridden()
    }

    /// The agent would stop with `output`. `Some(text)` keeps it going with
    /// `text` as a user message; `continuations` counts how often in a row
    /// that happened. Not asked once the run used all its turns.
    fn before_stop<'a>(
        &'a self,
        ctx: &'a RunContext,
        output: &'a Message,
        continuations: u32,
    ) -> Hook<'a, Option<String>> {
        Hook::not_overridden()
    }

    /// A compaction of `messages` is about to run: `false` skips it.
    fn before_compaction<'a>(
        &'a self,
        ctx: &'a RunContext,
        messages: &'a History,
    ) -> Hook<'a, bool> {
        Hook::not_overridden()
    }

    /// A compaction ran.
    fn after_compaction<'a>(
        &'a self,
        ctx: &'a RunContext,
        compaction: &'a Compaction,
    ) -> Hook<'a, ()> {
        Hook::not_overridden()
    }

    /// The run would move from model `from` to model `to`: `false` blocks it.
    fn before_model_switch<'a>(
        &'a self,
        ctx: &'a RunContext,
        from: &'a str,
        to: &'a str,
    ) -> Hook<'a, bool> {
        Hook::not_overridden()
    }

    /// A call asks for approval: `Some` decides it as a person would, before
    /// the agent's approver is asked. Bind the decision to the call with
    /// [`ApprovalDecision::approve`] / [`decline`](ApprovalDecision::decline).
    fn decide_approval<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
    ) -> Hook<'a, Option<ApprovalDecision>> {
        Hook::not_overridden()
    }

    /// Something a person should know (an approval asked, a pause). Cannot
    /// change what happens.
    fn on_notification<'a>(
        &'a self,
        ctx: &'a RunContext,
        notification: &'a Notification,
    ) -> Hook<'a, ()> {
        Hook::not_overridden()
    }

    /// The run failed with `error`. Every middleware's `on_error` runs; their
    /// own errors are ignored (logged), and the run keeps its error.
    fn on_error<'a>(&'a self, ctx: &'a RunContext, error: &'a AgentError) -> Hook<'a, ()> {
        Hook::not_overridden()
    }

    #[doc(alias = "after_run")]
    #[doc(alias = "afterRun")]
    #[doc(alias = "on_agent_end")]
    /// The run ended: completed, stopped, paused (with the result) or failed
    /// (with the error). Its error is logged, the next `after_agent` still
    /// runs and the caller keeps the run's result.
    fn after_agent<'a>(&'a self, ctx: &'a RunContext, outcome: RunOutcome<'a>) -> Hook<'a, ()> {
        Hook::not_overridden()
    }
}

/// The error the default delta hooks answer: "not overridden". A zero-sized
/// type, so boxing it allocates nothing.
#[derive(Debug)]
pub(crate) struct NotOverridden;

impl fmt::Display for NotOverridden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the hook is not overridden")
    }
}

impl std::error::Error for NotOverridden {}

fn not_overridden() -> BoxError {
    Box::new(NotOverridden)
}
