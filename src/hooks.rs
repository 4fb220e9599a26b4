//! [`RunHooks`]: the hook points the run loop calls.
//!
//! The [`Agent`](crate::Agent) loop knows nothing of middleware. At each hook
//! point it asks the [`RunContext`] for the installed `RunHooks` and, when
//! there are some, calls them; with none installed, a hook point costs one
//! branch. The lifecycle layer implements this trait over a stack of
//! middleware and installs it; nested runs inherit it.
//!
//! Implement it yourself only to replace the lifecycle adapter.

use futures::future::BoxFuture;
use serde_json::Value;

use crate::context::RunContext;
use crate::error::BoxError;
use crate::request::{ModelCall, ToolInvocation, ToolOutput};
use crate::service::{BoxModel, BoxTool};
use crate::types::{ApprovalDecision, History, Message, ModelResponse, ToolCall};

/// The future of a hook point.
pub type HookFuture<'a, T> = BoxFuture<'a, Result<T, BoxError>>;

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

    /// A call asks for approval: `Some` decides it, `None` leaves it to the
    /// agent's approver.
    fn decide_approval<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
    ) -> HookFuture<'a, Option<ApprovalDecision>>;

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
}
