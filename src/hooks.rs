//! The data the hook points hand around, and the port the run loop calls
//! them through.
//!
//! The [`Agent`](crate::Agent) loop knows nothing of middleware. At each hook
//! point (`before_model`, `before_tool`, ...) it asks its
//! [`RunContext`] for the hooks installed in the run and, when there are
//! some, calls them; with none installed, a hook point costs one branch. The
//! lifecycle adapter ([`lifecycle`](crate::lifecycle)) installs them, and
//! nested runs inherit them. The port is internal: middleware is written
//! against [`Middleware`](crate::lifecycle::Middleware), whose hooks carry
//! the same names.
//!
//! What is public here is what the hooks see and answer ([`ToolVerdict`],
//! [`RunOutcome`], [`Compaction`], ...), [`AgentMiddleware`] (the middleware
//! an [`Agent`](crate::Agent) runs itself), and the questions whatever
//! compacts or switches models asks the run's hooks:
//! [`before_compaction`], [`after_compaction`], [`before_model_switch`].

use std::any::Any;
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

pub use crate::approvals::StickyApprovals;
use crate::context::{PortSlot, RunContext};
use crate::error::{AgentError, BoxError};
use crate::request::{
    BoxAgent, BoxModel, BoxTool, ModelCall, RunRequest, ToolInvocation, ToolOutput,
};
use crate::types::{
    AgentRun, ApprovalDecision, History, Message, ModelName, ModelResponse, ToolCall,
};

mod walk;
pub(crate) use walk::{CallAbort, ModelWalk, ToolAnswer, ToolFinish, ToolWalk};

mod hook_future;
pub(crate) use hook_future::HookFuture;

/// How a run starts, as `before_agent` sees it.
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
    /// Ask for approval unless another `before_tool` verdict allows the
    /// call: what a permission mode asks. An [`Allow`](Self::Allow) skips
    /// it; an [`Ask`](Self::Ask), a defer or a deny is stronger.
    AskUnlessAllowed,
    /// Run it without asking, even if the tool asks for approval or a
    /// permission mode would ([`AskUnlessAllowed`](Self::AskUnlessAllowed)).
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
    /// `continue`, `ask_unless_allowed`, `allow`, `ask`, `defer` or `deny`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ToolDecision::Continue => "continue",
            ToolDecision::AskUnlessAllowed => "ask_unless_allowed",
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
/// the `decide_approval` hook point answers, with who decided.
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
///
/// The call is the conversation's own, borrowed, unless a hook rewrote its
/// arguments: a step copies no call for its hooks.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallResult<'a> {
    /// The call (with the arguments it ran with).
    pub call: Cow<'a, ToolCall>,
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

/// The hook points of a run, as the loop calls them: the same names as
/// [`Middleware`](crate::lifecycle::Middleware)'s hooks. The lifecycle
/// adapter implements it over the run's middleware and installs it in the
/// run's context.
pub(crate) trait HookPort: Send + Sync + 'static {
    /// Whether the run must hold each turn's streamed text until
    /// `after_model` ran, then send the final text in one piece.
    fn holds_stream(&self) -> bool;

    /// A run starts, new or resumed. Returns texts to add after the system
    /// prompt, for this run only.
    fn before_agent<'a>(
        &'a self,
        ctx: &'a RunContext,
        start: RunStart,
    ) -> HookFuture<'a, Vec<String>>;

    /// A new run's input, before any model call. Returns texts to add after
    /// the input, kept in the transcript.
    fn before_run<'a>(
        &'a self,
        ctx: &'a RunContext,
        input: &'a mut Message,
        messages: &'a History,
    ) -> HookFuture<'a, Vec<String>>;

    /// Before each model turn.
    fn before_model<'a>(
        &'a self,
        ctx: &'a RunContext,
        messages: &'a mut History,
    ) -> HookFuture<'a, ()>;

    /// Around each model call, ending in `next`. Boxed at once: the call
    /// always waits, and the loop holds it across that wait.
    fn wrap_model(
        &self,
        call: ModelCall,
        next: BoxModel,
    ) -> BoxFuture<'_, Result<ModelResponse, BoxError>>;

    /// [`wrap_model`](Self::wrap_model) for a caller that calls the model
    /// itself when every wrap hook hands the call on: the walk down the wrap
    /// hooks happens here, at once; call it where the call would be first
    /// polled.
    /// `ctx` is the run's, which the call carries.
    fn walk_model(&self, call: ModelCall, next: BoxModel, ctx: &RunContext) -> ModelWalk<'_>;

    /// Whether a model call (one that `streams`, or not) has nothing of the
    /// hooks around it: no wrap hook, no delta hook for its stream, and its
    /// stream is not held. The loop then calls the model as a run without
    /// hooks does; only [`after_model`](Self::after_model), when a hook may
    /// read the answer, comes between the answer and the conversation.
    fn bare_model_call(&self, streams: bool) -> bool;

    /// Whether a hook may read or change a model's answer in
    /// [`after_model`](Self::after_model): without one, the loop appends
    /// the answer as it comes.
    fn reads_model_answer(&self) -> bool;

    /// Whether a tool call (to a tool stack that `streams` its progress,
    /// or not) has nothing of the hooks around it: no wrap hook, no delta
    /// hook for its stream. The loop then calls the tool stack as a run
    /// without hooks does (its `before_tool` and `after_tool` still run).
    fn bare_tool_call(&self, streams: bool) -> bool;

    /// What the answer of the model called for a guarded
    /// [`ModelWalk::Service`] becomes (`answer` caught its panic): what the
    /// future [`wrap_model`](Self::wrap_model) makes would have answered.
    /// A response goes out as it came: the caller asks only about a failure
    /// or a panic.
    fn model_answer(
        &self,
        answer: std::thread::Result<Result<ModelResponse, BoxError>>,
        model: &ModelName,
    ) -> Result<ModelResponse, BoxError>;

    /// After each answer, before the run uses it.
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

    /// A call asks for approval: `Some` decides it.
    fn decide_approval<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
    ) -> HookFuture<'a, Option<ApprovalVerdict>>;

    /// Around each tool call that passed approval, ending in `next`.
    fn wrap_tool(&self, invocation: ToolInvocation, next: BoxTool) -> HookFuture<'_, ToolOutput>;

    /// [`wrap_tool`](Self::wrap_tool) for a caller that calls the tool stack
    /// itself when every wrap hook hands the call on: the walk down the wrap
    /// hooks happens here, at once; call it where the call would be first
    /// polled. `next` is cloned only for a wrap hook that may keep it; the
    /// delta hooks get a sink on the call only when `next` `streams`.
    fn walk_tool(
        &self,
        invocation: ToolInvocation,
        next: &Arc<BoxTool>,
        streams: bool,
        ctx: &RunContext,
    ) -> ToolWalk<'_>;

    /// What a tool call of a [`ToolWalk::Service`], `call` in `ctx`'s run,
    /// answers: what the future [`wrap_tool`](Self::wrap_tool) makes would
    /// have answered.
    fn finish_tool(
        &self,
        answer: ToolAnswer,
        call: &ToolCall,
        ctx: &RunContext,
        finish: &ToolFinish,
    ) -> Result<ToolOutput, BoxError>;

    /// After each tool call.
    fn after_tool<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        output: &'a mut ToolOutput,
    ) -> HookFuture<'a, ()>;

    /// Whether a hook may read a step's results in
    /// [`after_tool_batch`](Self::after_tool_batch): without one, the loop
    /// keeps no list of them and hands it an empty one.
    fn reads_tool_batch(&self) -> bool;

    /// Every call of a step has its result.
    fn after_tool_batch<'a>(
        &'a self,
        ctx: &'a RunContext,
        results: &'a [ToolCallResult<'a>],
    ) -> HookFuture<'a, ()>;

    /// The agent would stop with `output`: `Some(text)` keeps it going.
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

    /// Something a person should know.
    fn on_notification<'a>(
        &'a self,
        ctx: &'a RunContext,
        notification: &'a Notification,
    ) -> HookFuture<'a, ()>;

    /// The run failed; called before `after_agent`. Errors are ignored.
    fn on_error<'a>(&'a self, ctx: &'a RunContext, error: &'a AgentError) -> HookFuture<'a, ()>;

    /// The run ended. Called once per run, by the lifecycle layer that
    /// brackets it or, for a run nothing brackets (a nested run that
    /// inherited its parent's hooks), by the run loop.
    fn after_agent<'a>(
        &'a self,
        ctx: &'a RunContext,
        outcome: RunOutcome<'a>,
    ) -> HookFuture<'a, ()>;

    /// A compaction of `messages` is about to run; `false` skips it.
    fn before_compaction<'a>(
        &'a self,
        ctx: &'a RunContext,
        messages: &'a History,
    ) -> HookFuture<'a, bool>;

    /// A compaction ran.
    fn after_compaction<'a>(
        &'a self,
        ctx: &'a RunContext,
        compaction: &'a Compaction,
    ) -> HookFuture<'a, ()>;

    /// The depth of the run these hooks were installed for.
    fn depth(&self) -> usize;

    /// The hooks of `ctx`'s run once it is handed over to another agent:
    /// the same, except that the agent-level middleware of the agent the run
    /// started with (or was last handed to) is replaced by `to` (the new
    /// agent's own middleware, if it has any). `None`: no hooks are left.
    fn hand_over(
        self: Arc<Self>,
        ctx: &RunContext,
        to: Option<&AgentMiddleware>,
    ) -> Option<Arc<dyn HookPort>>;
}

/// The hooks installed in `ctx`'s run (by a lifecycle layer, or inherited
/// from the run it is nested in), if any.
pub(crate) fn installed(ctx: &RunContext) -> Option<Arc<dyn HookPort>> {
    ctx.read_port_slot(|slot| slot.downcast_ref::<Installed>().map(|i| i.0.clone()))
}

/// Installs `hooks` into `ctx`'s run, replacing any.
pub(crate) fn install(ctx: &RunContext, hooks: Arc<dyn HookPort>) {
    ctx.set_port_slot(port_slot(hooks));
}

/// `hooks` as the context's port slot holds them, to install in any number
/// of runs with [`install_slot`].
pub(crate) fn port_slot(hooks: Arc<dyn HookPort>) -> PortSlot {
    Arc::new(Installed(hooks))
}

/// Installs the hooks of `slot` (made by [`port_slot`]) into `ctx`'s run,
/// replacing any.
pub(crate) fn install_slot(ctx: &RunContext, slot: &PortSlot) {
    ctx.set_port_slot(slot.clone());
}

/// What the context's port slot holds.
struct Installed(Arc<dyn HookPort>);

/// Hands `ctx`'s run over to an agent whose own middleware is `to`: the
/// runtime's and the run's middleware stay, the agent-level middleware of
/// the agent before is replaced by `to` from the next hook point on.
/// Installs the result in `ctx` (so nested runs inherit it) and returns it.
pub(crate) fn hand_over(
    ctx: &RunContext,
    to: Option<&AgentMiddleware>,
) -> Option<Arc<dyn HookPort>> {
    let next = match installed(ctx) {
        Some(port) => port.hand_over(ctx, to),
        None => to.map(|to| to.0.frame(ctx, None)),
    };
    match &next {
        Some(port) => install(ctx, port.clone()),
        None => ctx.clear_port_slot(),
    }
    next
}

/// Asks the run's hooks whether a compaction of `messages` may run:
/// `false` skips it. With no hooks installed, `true`. Whatever compacts (a
/// middleware or a layer) asks, and tells [`after_compaction`] once it did.
///
/// # Errors
///
/// A hook's error (a [`tripwire`](crate::tripwire) among them).
pub async fn before_compaction(ctx: &RunContext, messages: &History) -> Result<bool, BoxError> {
    match installed(ctx) {
        Some(hooks) => hooks.before_compaction(ctx, messages).await,
        None => Ok(true),
    }
}

/// Tells the run's hooks that a compaction ran.
///
/// # Errors
///
/// A hook's error.
pub async fn after_compaction(ctx: &RunContext, compaction: &Compaction) -> Result<(), BoxError> {
    match installed(ctx) {
        Some(hooks) => hooks.after_compaction(ctx, compaction).await,
        None => Ok(()),
    }
}

/// Asks the run's hooks whether the run may move from model `from` to model
/// `to` (a fallback would): `false` blocks it. With no hooks installed,
/// `true`.
///
/// # Errors
///
/// A hook's error.
pub async fn before_model_switch(ctx: &RunContext, from: &str, to: &str) -> Result<bool, BoxError> {
    match installed(ctx) {
        Some(hooks) => hooks.before_model_switch(ctx, from, to).await,
        None => Ok(true),
    }
}

/// Middleware an [`Agent`](crate::Agent) runs in each of its runs, set with
/// [`AgentBuilder::middleware`](crate::AgentBuilder::middleware).
///
/// Made from a [`Middleware`](crate::lifecycle::Middleware) or a
/// [`MiddlewareStack`](crate::lifecycle::MiddlewareStack) with `From`. The
/// agent brackets each run with it exactly as a
/// [`LifecycleLayer`](crate::lifecycle::LifecycleLayer) around it would, so
/// the agent keeps its own `run` and `run_with`.
///
/// # Clone
///
/// Cheap: the middleware are shared.
#[derive(Clone)]
pub struct AgentMiddleware(pub(crate) Arc<dyn RunBracket>);

impl AgentMiddleware {
    /// These middleware, then `inner`'s inside them.
    pub fn then(self, inner: AgentMiddleware) -> AgentMiddleware {
        self.0.then(&inner)
    }

    /// Runs `request` on `run`, bracketed by these middleware.
    pub(crate) fn run(
        &self,
        request: RunRequest,
        run: BoxAgent,
    ) -> BoxFuture<'static, Result<AgentRun, AgentError>> {
        self.0.clone().run(request, run)
    }
}

impl fmt::Debug for AgentMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt_names(f)
    }
}

/// What the lifecycle adapter implements for [`AgentMiddleware`].
pub(crate) trait RunBracket: Send + Sync + 'static {
    /// Runs `request` on `run`, bracketed.
    fn run(
        self: Arc<Self>,
        request: RunRequest,
        run: BoxAgent,
    ) -> BoxFuture<'static, Result<AgentRun, AgentError>>;

    /// These, then `inner`'s inside them.
    fn then(&self, inner: &AgentMiddleware) -> AgentMiddleware;

    /// The hook points of these middleware joining `ctx`'s run mid-way (a
    /// handoff to their agent), inside `outer`: no bracket of their own.
    fn frame(&self, ctx: &RunContext, outer: Option<Arc<dyn HookPort>>) -> Arc<dyn HookPort>;

    /// The concrete value, for `then`.
    fn as_any(&self) -> &dyn Any;

    /// The levels these place in a run, for a handoff to their agent.
    fn levels(&self) -> &dyn Any;

    /// The names, for `Debug`.
    fn fmt_names(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
}
