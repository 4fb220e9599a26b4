//! [`RunHooks`]: the hook points the run loop calls.
//!
//! The [`Agent`](crate::Agent) loop knows nothing of middleware. At each hook
//! point it asks the [`RunContext`] for the installed `RunHooks` and, when
//! there are some, calls them; with none installed, a hook point costs one
//! branch. The lifecycle layer implements this trait over a stack of
//! middleware and installs it; nested runs inherit it.
//!
//! Each hook point returns a [`HookFuture`]: a value already there (no
//! allocation) or a boxed future. A run is closed once, by
//! [`on_error`](RunHooks::on_error) (when it failed) and
//! [`end_run`](RunHooks::end_run): by the lifecycle layer that brackets it,
//! or by the loop for a run nothing brackets (see
//! [`RunContext::mark_bracketed`]).
//!
//! Implement it yourself only to replace the lifecycle adapter.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use serde_json::Value;

use crate::context::RunContext;
use crate::error::{AgentError, BoxError};
use crate::request::{ModelCall, ToolInvocation, ToolOutput};
use crate::service::{BoxModel, BoxTool};
use crate::types::{AgentRun, ApprovalDecision, History, Message, ModelResponse, ToolCall};

/// The future of a hook point: a value already there, or a boxed future.
///
/// A hook point with nothing to do answers [`HookFuture::ok`], which costs no
/// allocation; only hooks that really wait are boxed.
#[must_use = "futures do nothing unless polled"]
pub struct HookFuture<'a, T> {
    kind: HookKind<'a, T>,
}

enum HookKind<'a, T> {
    Ready(Option<Result<T, BoxError>>),
    Boxed(BoxFuture<'a, Result<T, BoxError>>),
}

impl<'a, T> HookFuture<'a, T> {
    /// A hook point that is already done with `result`.
    pub fn ready(result: Result<T, BoxError>) -> Self {
        Self {
            kind: HookKind::Ready(Some(result)),
        }
    }

    /// A hook point that is already done with `value`.
    pub fn ok(value: T) -> Self {
        Self::ready(Ok(value))
    }

    /// A hook point that waits for `future`.
    pub fn new<F>(future: F) -> Self
    where
        F: Future<Output = Result<T, BoxError>> + Send + 'a,
    {
        Self::boxed(Box::pin(future))
    }

    /// A hook point that waits for an already boxed future.
    pub fn boxed(future: BoxFuture<'a, Result<T, BoxError>>) -> Self {
        Self {
            kind: HookKind::Boxed(future),
        }
    }

    /// Whether the value is already there (nothing was boxed).
    pub fn is_ready(&self) -> bool {
        matches!(self.kind, HookKind::Ready(_))
    }
}

// Nothing is pinned structurally: the boxed future is pinned on the heap.
impl<T> Unpin for HookFuture<'_, T> {}

impl<T> Future for HookFuture<'_, T> {
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().kind {
            HookKind::Ready(value) => {
                Poll::Ready(value.take().expect("HookFuture polled after completion"))
            }
            HookKind::Boxed(future) => future.as_mut().poll(cx),
        }
    }
}

impl<T> fmt::Debug for HookFuture<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HookFuture")
            .field("ready", &self.is_ready())
            .finish()
    }
}

impl<'a, T> From<BoxFuture<'a, Result<T, BoxError>>> for HookFuture<'a, T> {
    fn from(future: BoxFuture<'a, Result<T, BoxError>>) -> Self {
        Self::boxed(future)
    }
}

/// How a run starts, as [`RunHooks::start_run`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunStart {
    /// A resumed run (from a checkpoint).
    pub resumed: bool,
    /// Whether the run starts on a thread with earlier messages.
    pub has_history: bool,
}

/// What `before_tool` decides about a call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolDecision {
    /// No opinion: the tool's own settings decide.
    #[default]
    Continue,
    /// Run it without asking, even if the tool asks for approval.
    Allow,
    /// Ask for approval even if the tool would not.
    Ask,
    /// Pause the run with the call waiting for a decision.
    Defer,
    /// Refuse it; the model reads the reason.
    Deny {
        /// Why.
        reason: String,
    },
}

impl ToolDecision {
    /// `continue`, `allow`, `ask`, `defer` or `deny`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ToolDecision::Continue => "continue",
            ToolDecision::Allow => "allow",
            ToolDecision::Ask => "ask",
            ToolDecision::Defer => "defer",
            ToolDecision::Deny { .. } => "deny",
        }
    }
}

/// A decision about a tool call with optional new arguments: what
/// `before_tool` returns.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolVerdict {
    /// The decision.
    pub decision: ToolDecision,
    /// Arguments to use instead of the model's; validated against the tool's
    /// schema again.
    pub updated_arguments: Option<Value>,
    /// Who decided (a middleware's name), for the log.
    pub decided_by: Option<String>,
}

impl ToolVerdict {
    /// No opinion.
    pub fn proceed() -> Self {
        Self::default()
    }

    /// A verdict with `decision`.
    pub fn decision(decision: ToolDecision) -> Self {
        Self {
            decision,
            ..Self::default()
        }
    }

    /// Refuse with a reason.
    pub fn deny(reason: impl Into<String>) -> Self {
        Self::decision(ToolDecision::Deny {
            reason: reason.into(),
        })
    }

    /// Replace the arguments.
    pub fn with_arguments(mut self, arguments: Value) -> Self {
        self.updated_arguments = Some(arguments);
        self
    }
}

/// A decision about a call that asks for approval, and who made it: what
/// [`RunHooks::decide_approval`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalVerdict {
    /// The decision, bound to the call's id and arguments.
    pub decision: ApprovalDecision,
    /// Who decided (a middleware's name), for the log.
    pub decided_by: Option<String>,
}

/// How a run ended, as the hooks that close it see it.
#[derive(Debug, Clone, Copy)]
pub enum RunOutcome<'a> {
    /// The run returned: completed, stopped or paused.
    Finished(&'a AgentRun),
    /// The run failed.
    Failed(&'a AgentError),
}

impl<'a> RunOutcome<'a> {
    /// The outcome of `result`.
    pub fn of(result: &'a Result<AgentRun, AgentError>) -> Self {
        match result {
            Ok(run) => RunOutcome::Finished(run),
            Err(err) => RunOutcome::Failed(err),
        }
    }

    /// `completed`, `stopped`, `paused` or `failed`.
    pub fn status(&self) -> &'static str {
        match self {
            RunOutcome::Finished(run) => run.status.as_str(),
            RunOutcome::Failed(_) => "failed",
        }
    }

    /// The run's result, unless it failed.
    pub fn run(&self) -> Option<&'a AgentRun> {
        match self {
            RunOutcome::Finished(run) => Some(run),
            RunOutcome::Failed(_) => None,
        }
    }

    /// The error of a failed run.
    pub fn error(&self) -> Option<&'a AgentError> {
        match self {
            RunOutcome::Finished(_) => None,
            RunOutcome::Failed(err) => Some(err),
        }
    }
}

/// A compaction that ran, as `after_compaction` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compaction {
    /// Who compacted (a middleware's or a layer's name).
    pub by: String,
    /// How many messages there were before.
    pub messages_before: usize,
    /// How many there are after.
    pub messages_after: usize,
    /// The summary that replaced the older messages, if one did.
    pub summary: Option<String>,
}

/// One tool call of a step and its result, as `after_tool_batch` sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallResult {
    /// The call (with the arguments it ran with).
    pub call: ToolCall,
    /// What it answered.
    pub output: ToolOutput,
}

/// Something a person should know about; hooks cannot change it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Notification {
    /// A call asks for approval.
    ApprovalRequested {
        /// The call.
        call: ToolCall,
    },
    /// The run paused with calls waiting for decisions.
    Paused {
        /// The waiting calls.
        pending: Vec<ToolCall>,
    },
}

/// The hook points of a run. See the [module docs](self).
///
/// Each method returns a boxed future; the run calls them only when hooks are
/// installed.
pub trait RunHooks: Send + Sync + 'static {
    /// Whether the run must hold each turn's streamed text until
    /// `after_model` ran, then send the final text in one piece.
    fn holds_stream(&self) -> bool;

    /// A run starts, new or resumed, before its first model call. Returns
    /// texts to add after the system prompt, for this run only.
    fn start_run<'a>(&'a self, ctx: &'a RunContext, start: RunStart)
        -> HookFuture<'a, Vec<String>>;

    /// A new run's input, before any model call: the input guard. `messages`
    /// are what the first turn starts from (system prompt and history).
    /// Returns texts to add after the input, kept in the transcript.
    fn before_run<'a>(
        &'a self,
        ctx: &'a RunContext,
        input: &'a mut Message,
        messages: &'a [Message],
    ) -> HookFuture<'a, Vec<String>>;

    /// Before each model turn; may change the messages from then on.
    fn before_model<'a>(
        &'a self,
        ctx: &'a RunContext,
        messages: &'a mut History,
    ) -> HookFuture<'a, ()>;

    /// Around each model call: the wrap middleware, ending in `next`.
    fn call_model<'a>(&'a self, call: ModelCall, next: BoxModel) -> HookFuture<'a, ModelResponse>;

    /// After each answer, before the run uses it; may change its content or
    /// its tool calls.
    fn after_model<'a>(
        &'a self,
        ctx: &'a RunContext,
        response: &'a mut ModelResponse,
    ) -> HookFuture<'a, ()>;

    /// Before each tool call is decided.
    fn before_tool<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        resumed: bool,
    ) -> HookFuture<'a, ToolVerdict>;

    /// A call asks for approval: `Some` decides it (and names who did),
    /// `None` leaves it to the agent's approver.
    fn decide_approval<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
    ) -> HookFuture<'a, Option<ApprovalVerdict>>;

    /// Around each tool call that passed approval: the wrap middleware,
    /// ending in `next`.
    fn call_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: BoxTool,
    ) -> HookFuture<'a, ToolOutput>;

    /// After each tool call; may change the result.
    fn after_tool<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        output: &'a mut ToolOutput,
    ) -> HookFuture<'a, ()>;

    /// Every call of a step has its result, before the next model call.
    fn after_tool_batch<'a>(
        &'a self,
        ctx: &'a RunContext,
        results: &'a [ToolCallResult],
    ) -> HookFuture<'a, ()>;

    /// The agent would stop with `output`. `Some(text)` keeps it going with
    /// `text` as a user message. `continuations` counts how often in a row
    /// that happened.
    fn before_stop<'a>(
        &'a self,
        ctx: &'a RunContext,
        output: &'a Message,
        continuations: u32,
    ) -> HookFuture<'a, Option<String>>;

    /// A run would move from model `from` to model `to`; `false` blocks it.
    fn before_model_switch<'a>(
        &'a self,
        ctx: &'a RunContext,
        from: &'a str,
        to: &'a str,
    ) -> HookFuture<'a, bool>;

    /// Tells the hooks something a person should know.
    fn on_notification<'a>(
        &'a self,
        ctx: &'a RunContext,
        notification: &'a Notification,
    ) -> HookFuture<'a, ()>;

    /// The run failed with `error`; called before [`end_run`](Self::end_run).
    /// Errors are ignored: they cannot replace the run's error.
    fn on_error<'a>(&'a self, ctx: &'a RunContext, error: &'a AgentError) -> HookFuture<'a, ()> {
        let _ = (ctx, error);
        HookFuture::ok(())
    }

    /// The run ended. Called once per run, by the lifecycle layer that
    /// brackets it or, for a run nothing brackets (a nested run that
    /// inherited its parent's hooks), by the run loop. Errors are logged, the
    /// caller keeps the run's result.
    fn end_run<'a>(&'a self, ctx: &'a RunContext, outcome: RunOutcome<'a>) -> HookFuture<'a, ()> {
        let _ = (ctx, outcome);
        HookFuture::ok(())
    }

    /// A compaction of `messages` is about to run; `false` skips it. Called
    /// by whatever compacts (a middleware or a layer), not by the loop.
    fn before_compaction<'a>(
        &'a self,
        ctx: &'a RunContext,
        messages: &'a History,
    ) -> HookFuture<'a, bool> {
        let _ = (ctx, messages);
        HookFuture::ok(true)
    }

    /// A compaction ran.
    fn after_compaction<'a>(
        &'a self,
        ctx: &'a RunContext,
        compaction: &'a Compaction,
    ) -> HookFuture<'a, ()> {
        let _ = (ctx, compaction);
        HookFuture::ok(())
    }
}
