//! [`AgentEvent`]s and the sinks that receive them.
//!
//! A run emits events through its [`RunContext`](crate::RunContext): the run,
//! each model call and each tool call start and complete, every middleware
//! hook is bracketed, and layers report retries, fallbacks and cache hits.
//! Nested runs share their parent's sink, so one sink sees the whole tree.
//!
//! Building an event costs nothing when the sink is disabled: the context
//! takes a closure and calls it only if [`EventSink::enabled`].
//!
//! ```
//! use tower_agent::event::{AgentEvent, CollectingSink};
//! use tower_agent::RunContext;
//!
//! let sink = CollectingSink::new();
//! let ctx = RunContext::builder().events(sink.clone()).build();
//! ctx.log_event("audit", serde_json::json!({"user": 7}));
//! assert!(matches!(&sink.events()[0], AgentEvent::Custom { name, .. } if name == "audit"));
//! ```

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::types::{Cost, FinishReason, ModelName, Usage};

/// Something that happened in a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentEvent {
    /// A run started (new or resumed).
    RunStarted {
        /// The run.
        run_id: Arc<str>,
        /// The run whose tool call started it.
        parent_run_id: Option<Arc<str>>,
        /// The agent.
        agent: Arc<str>,
    },
    /// A run ended.
    RunCompleted {
        /// The run.
        run_id: Arc<str>,
        /// `completed`, `stopped`, `paused` or `failed`.
        status: &'static str,
        /// The run's own usage.
        usage: Usage,
        /// The error code of a failed run.
        error: Option<&'static str>,
    },
    /// The run sends a model call down its model stack.
    ModelCallStarted {
        /// The run.
        run_id: Arc<str>,
        /// The turn, from 1.
        iteration: u32,
        /// The model named in the request.
        model: ModelName,
    },
    /// A model call came back.
    ModelCallCompleted {
        /// The run.
        run_id: Arc<str>,
        /// The turn, from 1.
        iteration: u32,
        /// The model that answered.
        model: ModelName,
        /// Its usage.
        usage: Usage,
        /// Why it stopped, or `None` when it failed.
        finish_reason: Option<FinishReason>,
        /// The error code of a failed call.
        error: Option<&'static str>,
    },
    /// A tool call is sent down the tool stack.
    ToolCallStarted {
        /// The run.
        run_id: Arc<str>,
        /// The call's id.
        call_id: String,
        /// The tool.
        tool: String,
    },
    /// A tool call came back.
    ToolCallCompleted {
        /// The run.
        run_id: Arc<str>,
        /// The call's id.
        call_id: String,
        /// The tool.
        tool: String,
        /// Whether the model reads an error.
        is_error: bool,
        /// The error code when the call ended without a result and the run
        /// fails with that error (`CANCELLED`, `TIMEOUT`,
        /// `GUARDRAIL_TRIPPED`, …); `None` when the call has its result.
        error: Option<&'static str>,
        /// The tool's panic message when it panicked; the model reads only
        /// that the tool failed (see
        /// [`AgentBuilder::show_tool_panics`](crate::AgentBuilder::show_tool_panics)).
        panic: Option<String>,
    },
    /// A decision about a tool call: who made it and what it was.
    ToolDecision {
        /// The run.
        run_id: Arc<str>,
        /// The call's id.
        call_id: String,
        /// `allow`, `deny`, `ask`, `ask_unless_allowed`, `defer`,
        /// `approved`, `declined`, or `rewrite` when a `before_tool` hook
        /// changed the arguments.
        decision: &'static str,
        /// The middleware, `approver`, `resume`, `sticky` (a standing
        /// approval), `agent` or `nobody`.
        decided_by: String,
    },
    /// A tool policy decided a call: by the rule that matched it, or by the
    /// run's permission mode when none did.
    PermissionDecision {
        /// The run.
        run_id: Arc<str>,
        /// The call's id.
        call_id: String,
        /// The tool called.
        tool: String,
        /// `allow`, `ask`, `deny`, `ask_unless_allowed` or `continue`.
        decision: &'static str,
        /// The rule that decided; `None` when the mode did.
        rule: Option<String>,
        /// The run's permission mode: `default`, `ask`, `auto` or `dont_ask`.
        mode: &'static str,
        /// The policy (the middleware's name).
        policy: String,
    },
    /// A middleware hook started.
    MiddlewareStarted {
        /// The run.
        run_id: Arc<str>,
        /// The middleware's name.
        middleware: Arc<str>,
        /// The hook.
        hook: &'static str,
    },
    /// A middleware hook ended; always follows its `MiddlewareStarted`.
    MiddlewareCompleted {
        /// The run.
        run_id: Arc<str>,
        /// The middleware's name.
        middleware: Arc<str>,
        /// The hook.
        hook: &'static str,
        /// `ok`, `error`, `panic`, or `cancelled` when the invocation was
        /// dropped before it ended (a sibling tool call failed, the run was
        /// dropped).
        outcome: &'static str,
    },
    /// A fail-open middleware's error, logged instead of failing the run.
    MiddlewareFailedOpen {
        /// The run.
        run_id: Arc<str>,
        /// The middleware's name.
        middleware: Arc<str>,
        /// The hook.
        hook: &'static str,
        /// The error's text.
        error: String,
    },
    /// A call failed and will be tried again.
    RetryAttempt {
        /// The run.
        run_id: Arc<str>,
        /// The attempt that failed, from 1.
        attempt: u32,
        /// The error's code.
        code: &'static str,
        /// The error's text.
        error: String,
        /// How long the retry waits.
        delay: Duration,
    },
    /// A fallback moved a call from one model to the next.
    FallbackUsed {
        /// The run.
        run_id: Arc<str>,
        /// The model that failed.
        from: ModelName,
        /// The model tried next.
        to: ModelName,
        /// The failure's code.
        code: &'static str,
    },
    /// A model call was answered from the cache.
    CacheHit {
        /// The run.
        run_id: Arc<str>,
        /// The model the request named.
        model: ModelName,
    },
    /// A call waited for rate-limit capacity.
    RateLimitWait {
        /// The run.
        run_id: Arc<str>,
        /// The rate-limit key.
        key: String,
        /// How long it waited.
        waited: Duration,
    },
    /// PII was masked in a model request.
    PiiMasked {
        /// The run.
        run_id: Arc<str>,
        /// How many values were replaced.
        count: usize,
    },
    /// A shared store (the cache, a quota, a budget ledger, the checkpoint
    /// store) could not answer; the layer went on as its fail policy says.
    StoreFailed {
        /// The run.
        run_id: Arc<str>,
        /// Which store: `cache`, `quota`, `budget` or `checkpoint`.
        store: &'static str,
        /// What it was asked: `get`, `put`, `reserve`, `settle` or `save`.
        operation: &'static str,
        /// The store's error.
        error: String,
        /// Whether the call went on without the store (fail open) or
        /// failed with its error (fail closed).
        failed_open: bool,
    },
    /// The run paused with tool calls waiting for a decision.
    RunPaused {
        /// The run.
        run_id: Arc<str>,
        /// The waiting calls' ids.
        pending: Vec<String>,
    },
    /// A model call's usage was priced as it was recorded (the run has a
    /// price table that knows the model).
    CostRecorded {
        /// The run that made the call.
        run_id: Arc<str>,
        /// The model that answered.
        model: ModelName,
        /// Its usage.
        usage: Usage,
        /// Its price.
        cost: Cost,
    },
    /// The run was handed over to another agent: the model called a
    /// `transfer_to_<name>` tool ([`Handoff`](crate::Handoff)). From the
    /// next turn on, `to` runs it.
    Handoff {
        /// The run.
        run_id: Arc<str>,
        /// The agent that handed it over.
        from: Arc<str>,
        /// The agent that runs it now.
        to: Arc<str>,
        /// The handoff call's id.
        call_id: String,
        /// The reason the model gave, if any.
        reason: Option<Value>,
    },
    /// A handoff the model asked for did not happen: its arguments did not
    /// fit, another handoff of the turn came first, or `before_model_switch`
    /// blocked the move to the target's model. The model reads `reason`.
    HandoffRefused {
        /// The run.
        run_id: Arc<str>,
        /// The agent that asked.
        from: Arc<str>,
        /// The agent it asked for.
        to: Arc<str>,
        /// The handoff call's id.
        call_id: String,
        /// Why, as the model reads it.
        reason: String,
    },
    /// A message queued into the running run
    /// ([`RunHandle::send`](crate::RunHandle::send)) passed `before_run` and
    /// joined the conversation, before the next model call.
    QueuedMessage {
        /// The run.
        run_id: Arc<str>,
        /// The message's text.
        text: String,
    },
    /// A custom entry, from [`RunContext::log_event`](crate::RunContext::log_event).
    Custom {
        /// The run.
        run_id: Arc<str>,
        /// The event's name.
        name: String,
        /// Its data.
        data: Value,
    },
}

/// Receives a run's events.
///
/// Implemented for closures `Fn(AgentEvent)`, [`CollectingSink`],
/// [`ChannelSink`] and [`NoopSink`].
pub trait EventSink: Send + Sync + 'static {
    /// Takes one event. Called inline on the run's task: keep it quick.
    fn emit(&self, event: AgentEvent);

    /// Whether events are wanted at all; when `false`, the run does not build
    /// them.
    fn enabled(&self) -> bool {
        true
    }
}

impl<F> EventSink for F
where
    F: Fn(AgentEvent) + Send + Sync + 'static,
{
    fn emit(&self, event: AgentEvent) {
        self(event)
    }
}

/// A sink that drops everything; the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopSink;

impl EventSink for NoopSink {
    fn emit(&self, _event: AgentEvent) {}

    fn enabled(&self) -> bool {
        false
    }
}

/// A sink that keeps every event in memory.
///
/// # Clone
///
/// Clones share the same list.
#[derive(Clone, Default)]
pub struct CollectingSink {
    events: Arc<Mutex<Vec<AgentEvent>>>,
}

impl CollectingSink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the events so far.
    pub fn events(&self) -> Vec<AgentEvent> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Takes the events so far, leaving the sink empty.
    pub fn take(&self) -> Vec<AgentEvent> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl fmt::Debug for CollectingSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let len = self.events.lock().map_or(0, |e| e.len());
        f.debug_struct("CollectingSink").field("len", &len).finish()
    }
}

impl EventSink for CollectingSink {
    fn emit(&self, event: AgentEvent) {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event);
    }
}

/// A sink that sends every event into an unbounded tokio channel.
#[derive(Debug, Clone)]
pub struct ChannelSink {
    tx: tokio::sync::mpsc::UnboundedSender<AgentEvent>,
}

impl ChannelSink {
    /// A sink and the receiver of its events.
    pub fn new() -> (Self, tokio::sync::mpsc::UnboundedReceiver<AgentEvent>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (Self { tx }, rx)
    }
}

impl EventSink for ChannelSink {
    fn emit(&self, event: AgentEvent) {
        // A dropped receiver means nobody listens any more.
        let _ = self.tx.send(event);
    }

    fn enabled(&self) -> bool {
        !self.tx.is_closed()
    }
}
