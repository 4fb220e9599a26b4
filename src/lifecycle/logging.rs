//! [`LoggingMiddleware`]: counts how often each hook fires.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{FailPolicy, Hook, HookPoint, Middleware};
use crate::context::RunContext;
use crate::error::{AgentError, BoxError};
use crate::hooks::{Compaction, Notification, RunOutcome, RunStart, ToolCallResult, ToolVerdict};
use crate::request::ToolOutput;
use crate::types::{ApprovalDecision, History, Message, ModelDelta, ModelResponse, ToolCall};

/// An observer that counts how often each lifecycle hook fires, in every run
/// it is part of (nested runs included). It changes nothing, emits no events
/// of its own (the stack already brackets each hook) and fails open.
///
/// ```
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_agent::lifecycle::{HookPoint, LifecycleLayer, LoggingMiddleware, MiddlewareStack};
/// use tower_agent::{Agent, RunRequest, ScriptedModel, ScriptedTurn};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::AgentError> {
/// let logging = LoggingMiddleware::new();
/// let agent = ServiceBuilder::new()
///     .layer(LifecycleLayer::new(MiddlewareStack::new().push(logging.clone())))
///     .service(Agent::builder("a").model(ScriptedModel::new([ScriptedTurn::text("hi")])).build()?);
/// agent.oneshot(RunRequest::new("hello")).await?;
///
/// let counts = logging.counts();
/// assert_eq!(counts.get(HookPoint::BeforeModel), 1);
/// assert_eq!(counts.get(HookPoint::AfterAgent), 1);
/// assert_eq!(counts.get(HookPoint::BeforeTool), 0);
/// # Ok(()) }
/// ```
///
/// # Clone
///
/// Clones share the counts.
#[derive(Clone)]
pub struct LoggingMiddleware {
    name: Arc<str>,
    counts: Arc<[AtomicU64; HookPoint::COUNT]>,
}

impl LoggingMiddleware {
    /// A counter named `logging`.
    pub fn new() -> Self {
        Self::named("logging")
    }

    /// A counter named `name`.
    pub fn named(name: impl Into<Arc<str>>) -> Self {
        Self {
            name: name.into(),
            counts: Arc::new(std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> HookCounts {
        HookCounts {
            counts: std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed)),
        }
    }

    fn bump(&self, hook: HookPoint) {
        self.counts[hook as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn count<'a, T>(&self, hook: HookPoint, value: T) -> Hook<'a, T> {
        self.bump(hook);
        Hook::ok(value)
    }
}

impl Default for LoggingMiddleware {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for LoggingMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoggingMiddleware")
            .field("name", &self.name)
            .field("counts", &self.counts())
            .finish()
    }
}

/// How often each hook fired: see [`LoggingMiddleware::counts`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HookCounts {
    counts: [u64; HookPoint::COUNT],
}

impl HookCounts {
    /// How often `hook` fired.
    pub fn get(&self, hook: HookPoint) -> u64 {
        self.counts[hook as usize]
    }

    /// How many hook invocations in all.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The hooks that fired, with their counts.
    pub fn iter(&self) -> impl Iterator<Item = (HookPoint, u64)> + '_ {
        HookPoint::ALL
            .into_iter()
            .map(|p| (p, self.get(p)))
            .filter(|(_, n)| *n > 0)
    }
}

impl fmt::Debug for HookCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|(p, n)| (p.as_str(), n)))
            .finish()
    }
}

impl Middleware for LoggingMiddleware {
    fn name(&self) -> &str {
        &self.name
    }

    fn fail_policy(&self) -> FailPolicy {
        FailPolicy::Open
    }

    fn before_agent<'a>(&'a self, _: &'a RunContext, _: RunStart) -> Hook<'a, Option<String>> {
        self.count(HookPoint::BeforeAgent, None)
    }

    fn before_run<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a mut Message,
        _: &'a History,
    ) -> Hook<'a, Option<String>> {
        self.count(HookPoint::BeforeRun, None)
    }

    fn before_model<'a>(&'a self, _: &'a RunContext, _: &'a mut History) -> Hook<'a, ()> {
        self.count(HookPoint::BeforeModel, ())
    }

    fn on_model_delta(&self, _: &RunContext, _: &mut ModelDelta) -> Result<(), BoxError> {
        self.bump(HookPoint::OnModelDelta);
        Ok(())
    }

    fn after_model<'a>(&'a self, _: &'a RunContext, _: &'a mut ModelResponse) -> Hook<'a, ()> {
        self.count(HookPoint::AfterModel, ())
    }

    fn before_tool<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a ToolCall,
        _: bool,
    ) -> Hook<'a, ToolVerdict> {
        self.count(HookPoint::BeforeTool, ToolVerdict::default())
    }

    fn on_tool_delta(
        &self,
        _: &RunContext,
        _: &ToolCall,
        _: &mut ModelDelta,
    ) -> Result<(), BoxError> {
        self.bump(HookPoint::OnToolDelta);
        Ok(())
    }

    fn after_tool<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a ToolCall,
        _: &'a mut ToolOutput,
    ) -> Hook<'a, ()> {
        self.count(HookPoint::AfterTool, ())
    }

    fn after_tool_batch<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a [ToolCallResult<'a>],
    ) -> Hook<'a, ()> {
        self.count(HookPoint::AfterToolBatch, ())
    }

    fn before_stop<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a Message,
        _: u32,
    ) -> Hook<'a, Option<String>> {
        self.count(HookPoint::BeforeStop, None)
    }

    fn before_compaction<'a>(&'a self, _: &'a RunContext, _: &'a History) -> Hook<'a, bool> {
        self.count(HookPoint::BeforeCompaction, true)
    }

    fn after_compaction<'a>(&'a self, _: &'a RunContext, _: &'a Compaction) -> Hook<'a, ()> {
        self.count(HookPoint::AfterCompaction, ())
    }

    fn before_model_switch<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a str,
        _: &'a str,
    ) -> Hook<'a, bool> {
        self.count(HookPoint::BeforeModelSwitch, true)
    }

    fn decide_approval<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a ToolCall,
    ) -> Hook<'a, Option<ApprovalDecision>> {
        self.count(HookPoint::DecideApproval, None)
    }

    fn on_notification<'a>(&'a self, _: &'a RunContext, _: &'a Notification) -> Hook<'a, ()> {
        self.count(HookPoint::OnNotification, ())
    }

    fn on_error<'a>(&'a self, _: &'a RunContext, _: &'a AgentError) -> Hook<'a, ()> {
        self.count(HookPoint::OnError, ())
    }

    fn after_agent<'a>(&'a self, _: &'a RunContext, _: RunOutcome<'a>) -> Hook<'a, ()> {
        self.count(HookPoint::AfterAgent, ())
    }
}
