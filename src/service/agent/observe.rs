//! What a person and a program see of a run: the run, each model call and
//! each tool call emit their `*Started` and `*Completed` [`AgentEvent`]s and
//! `tracing` events, exactly once each, on every way out.
//!
//! An observer opens when the thing starts and closes with its result. One
//! dropped while still open (an early return, a panic unwinding, the run's
//! future dropped, a sibling tool call failing) closes itself: as
//! `TIMEOUT` once the run's deadline passed, `CANCELLED` otherwise, or as
//! `INTERNAL` while a panic unwinds. So `*Started` and
//! `*Completed` always balance.
//!
//! The `tracing` events use the OpenTelemetry GenAI names of the spans they
//! sit in (`invoke_agent`, `chat`, `execute_tool`): the run's start and end
//! and every model and tool call at `INFO`, failures at `WARN`, the start of
//! each call at `DEBUG`. Without a subscriber that wants them they cost a
//! level check; the clock is read only when `INFO` events are enabled.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tracing::{field, Level, Span};

use crate::context::RunContext;
use crate::error::{AgentError, ErrorKind};
use crate::event::AgentEvent;
use crate::request::ToolOutput;
use crate::types::{AgentRun, ModelName, ModelResponse, ToolCall, Usage};

pin_project! {
    /// A future polled inside `span`, which it borrows (from the observer
    /// that owns it) rather than holding a clone as `Instrumented` does.
    pub(super) struct InSpan<'a, F> {
        span: &'a Span,
        #[pin]
        fut: F,
    }
}

impl<'a, F> InSpan<'a, F> {
    pub(super) fn new(span: &'a Span, fut: F) -> Self {
        Self { span, fut }
    }
}

impl<F: Future> Future for InSpan<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _entered = this.span.enter();
        this.fut.poll(cx)
    }
}

/// The target of the crate's `tracing` events: `RUST_LOG=tower_agent=debug`.
const TARGET: &str = "tower_agent";

/// When the thing started, if anyone will read how long it took.
fn clock() -> Option<Instant> {
    tracing::enabled!(target: TARGET, Level::INFO).then(Instant::now)
}

/// Milliseconds since `started`, to the microsecond.
fn millis(started: Option<Instant>) -> Option<f64> {
    started.map(|s| s.elapsed().as_micros() as f64 / 1000.0)
}

/// What an observer keeps for `tracing`: its span and its clock, on the
/// heap, and only when a subscriber wants either. Every suspended run holds
/// two observers; without a subscriber they hold a null pointer each.
struct Traced {
    span: Span,
    started: Option<Instant>,
}

/// The span of observers that keep none.
static NO_SPAN: Span = Span::none();

impl Traced {
    fn keep(span: Span) -> Option<Box<Traced>> {
        let started = clock();
        if span.is_none() && started.is_none() {
            return None;
        }
        Some(Box::new(Traced { span, started }))
    }
}

/// The span of `traced`, or the empty one.
fn span_of(traced: &Option<Box<Traced>>) -> &Span {
    traced.as_ref().map_or(&NO_SPAN, |t| &t.span)
}

/// When the observed thing started, if anyone reads how long it took.
fn started_of(traced: &Option<Box<Traced>>) -> Option<Instant> {
    traced.as_ref().and_then(|t| t.started)
}

/// A model name, unless empty (the service picks the model).
fn named(model: &ModelName) -> Option<&str> {
    (!model.is_empty()).then(|| model.as_str())
}

/// The code of something of `ctx`'s run that ended without a result: the
/// run's deadline, once it passed (the run ends with `TIMEOUT`, whichever
/// of its futures saw it first), a cancellation otherwise.
fn dropped_code(ctx: &RunContext) -> &'static str {
    if std::thread::panicking() {
        ErrorKind::Other.code()
    } else if ctx.remaining() == Some(std::time::Duration::ZERO) {
        ErrorKind::Timeout.code()
    } else {
        ErrorKind::Cancelled.code()
    }
}

/// Brackets a run: `RunStarted` … `RunCompleted`.
///
/// It keeps no reference to the run: its holder passes the run's context
/// and agent name, and, if the run ends without a result (its future
/// dropped), calls [`dropped`](Self::dropped).
pub(super) struct RunObserver {
    traced: Option<Box<Traced>>,
}

impl RunObserver {
    /// Opens the run's `invoke_agent` span and says the run started.
    pub(super) fn open(ctx: &RunContext, agent: &Arc<str>) -> Self {
        let span = tracing::info_span!(
            "invoke_agent",
            "gen_ai.operation.name" = "invoke_agent",
            "gen_ai.agent.name" = %agent,
            "gen_ai.conversation.id" = ctx.thread_id(),
            run_id = %ctx.run_id(),
        );
        ctx.emit(|| AgentEvent::RunStarted {
            run_id: ctx.run_id().clone(),
            parent_run_id: ctx.parent_run_id().cloned(),
            agent: agent.clone(),
        });
        tracing::info!(
            target: TARGET,
            parent: &span,
            {
                "gen_ai.agent.name" = %agent,
                run_id = %ctx.run_id(),
                parent_run_id = ctx.parent_run_id().map(|id| &**id),
                "gen_ai.conversation.id" = ctx.thread_id(),
            },
            "run started"
        );
        Self {
            traced: Traced::keep(span),
        }
    }

    /// The run's span.
    pub(super) fn span(&self) -> &Span {
        span_of(&self.traced)
    }

    /// Says how the run ended.
    pub(super) fn close(
        self,
        ctx: &RunContext,
        agent: &Arc<str>,
        result: &Result<AgentRun, AgentError>,
    ) {
        match result {
            Ok(run) => {
                ctx.emit(|| AgentEvent::RunCompleted {
                    run_id: run.run_id.clone(),
                    status: run.status.as_str(),
                    usage: run.usage,
                    error: None,
                });
                tracing::info!(
                    target: TARGET,
                    parent: self.span(),
                    {
                        "gen_ai.agent.name" = %agent,
                        run_id = %run.run_id,
                        status = run.status.as_str(),
                        turns = run.counters.turns,
                        tool_calls = run.counters.tool_calls,
                        "gen_ai.usage.input_tokens" = run.usage.input_tokens,
                        "gen_ai.usage.output_tokens" = run.usage.output_tokens,
                        duration_ms = millis(started_of(&self.traced)),
                    },
                    "run completed"
                );
            }
            Err(err) => self.failed(ctx, agent, err.code(), Some(err)),
        }
    }

    /// Says the run ended without a result: cancelled, or failed while a
    /// panic unwinds.
    pub(super) fn dropped(self, ctx: &RunContext, agent: &Arc<str>) {
        self.failed(ctx, agent, dropped_code(ctx), None);
    }

    fn failed(
        &self,
        ctx: &RunContext,
        agent: &Arc<str>,
        code: &'static str,
        err: Option<&AgentError>,
    ) {
        let usage = ctx.usage();
        ctx.emit(|| AgentEvent::RunCompleted {
            run_id: ctx.run_id().clone(),
            status: "failed",
            usage,
            error: Some(code),
        });
        tracing::warn!(
            target: TARGET,
            parent: self.span(),
            {
                "gen_ai.agent.name" = %agent,
                run_id = %ctx.run_id(),
                status = "failed",
                "error.type" = code,
                error = err.map(field::display),
                "gen_ai.usage.input_tokens" = usage.input_tokens,
                "gen_ai.usage.output_tokens" = usage.output_tokens,
                duration_ms = millis(started_of(&self.traced)),
            },
            "run failed"
        );
    }
}

/// Brackets one model call: `ModelCallStarted` … `ModelCallCompleted`.
pub(super) struct ModelCallObserver<'a> {
    ctx: &'a RunContext,
    turn: u32,
    model: &'a ModelName,
    traced: Option<Box<Traced>>,
    open: bool,
}

impl<'a> ModelCallObserver<'a> {
    /// Opens the call's `chat` span and says the call started.
    pub(super) fn open(
        ctx: &'a RunContext,
        agent: &Arc<str>,
        model: &'a ModelName,
        turn: u32,
    ) -> Self {
        let span = tracing::info_span!(
            "chat",
            "gen_ai.operation.name" = "chat",
            "gen_ai.agent.name" = %agent,
            "gen_ai.request.model" = %model,
            "gen_ai.response.model" = field::Empty,
            "gen_ai.usage.input_tokens" = field::Empty,
            "gen_ai.usage.output_tokens" = field::Empty,
            "gen_ai.response.finish_reasons" = field::Empty,
        );
        ctx.emit(|| AgentEvent::ModelCallStarted {
            run_id: ctx.run_id().clone(),
            iteration: turn,
            model: model.clone(),
        });
        tracing::debug!(
            target: TARGET,
            parent: &span,
            {
                "gen_ai.request.model" = named(model),
                turn,
            },
            "model call started"
        );
        Self {
            ctx,
            turn,
            model,
            traced: Traced::keep(span),
            open: true,
        }
    }

    /// The call's span.
    pub(super) fn span(&self) -> &Span {
        span_of(&self.traced)
    }

    /// The turn of the call.
    pub(super) fn turn(&self) -> u32 {
        self.turn
    }

    /// Records what came back on the span.
    pub(super) fn record(&self, response: &ModelResponse) {
        let Some(traced) = &self.traced else {
            return;
        };
        let span = &traced.span;
        span.record("gen_ai.response.model", response.model.as_str());
        span.record("gen_ai.usage.input_tokens", response.usage.input_tokens);
        span.record("gen_ai.usage.output_tokens", response.usage.output_tokens);
        span.record(
            "gen_ai.response.finish_reasons",
            field::debug(&response.finish_reason),
        );
    }

    /// Says the call came back with `response`.
    pub(super) fn completed(mut self, response: &ModelResponse) {
        self.open = false;
        let ctx = self.ctx;
        ctx.emit(|| AgentEvent::ModelCallCompleted {
            run_id: ctx.run_id().clone(),
            iteration: self.turn,
            model: response.model.clone(),
            usage: response.usage,
            finish_reason: Some(response.finish_reason.clone()),
            error: None,
        });
        tracing::info!(
            target: TARGET,
            parent: self.span(),
            {
                "gen_ai.request.model" = named(self.model),
                "gen_ai.response.model" = %response.model,
                "gen_ai.usage.input_tokens" = response.usage.input_tokens,
                "gen_ai.usage.output_tokens" = response.usage.output_tokens,
                "gen_ai.response.finish_reasons" = ?response.finish_reason,
                turn = self.turn,
                duration_ms = millis(started_of(&self.traced)),
            },
            "model call completed"
        );
    }

    /// Says the call failed with `err`.
    pub(super) fn failed(mut self, err: &AgentError) {
        self.open = false;
        self.fail(err.code(), Some(err));
    }

    fn fail(&self, code: &'static str, err: Option<&AgentError>) {
        let ctx = self.ctx;
        ctx.emit(|| AgentEvent::ModelCallCompleted {
            run_id: ctx.run_id().clone(),
            iteration: self.turn,
            model: self.model.clone(),
            usage: Usage::default(),
            finish_reason: None,
            error: Some(code),
        });
        tracing::warn!(
            target: TARGET,
            parent: self.span(),
            {
                "gen_ai.request.model" = named(self.model),
                turn = self.turn,
                "error.type" = code,
                error = err.map(field::display),
                duration_ms = millis(started_of(&self.traced)),
            },
            "model call failed"
        );
    }
}

impl Drop for ModelCallObserver<'_> {
    fn drop(&mut self) {
        if self.open {
            self.fail(dropped_code(self.ctx), None);
        }
    }
}

/// Brackets one tool call: `ToolCallStarted` … `ToolCallCompleted`.
pub(super) struct ToolCallObserver<'a> {
    ctx: &'a RunContext,
    call: &'a ToolCall,
    span: Span,
    started: Option<Instant>,
    open: bool,
}

impl<'a> ToolCallObserver<'a> {
    /// Opens the call's `execute_tool` span and says the call started.
    pub(super) fn open(ctx: &'a RunContext, agent: &Arc<str>, call: &'a ToolCall) -> Self {
        let span = tracing::info_span!(
            "execute_tool",
            "gen_ai.operation.name" = "execute_tool",
            "gen_ai.tool.name" = %call.name,
            "gen_ai.tool.call.id" = %call.id,
            "gen_ai.agent.name" = %agent,
        );
        ctx.emit(|| AgentEvent::ToolCallStarted {
            run_id: ctx.run_id().clone(),
            call_id: call.id.clone(),
            tool: call.name.clone(),
        });
        tracing::debug!(
            target: TARGET,
            parent: &span,
            {
                "gen_ai.tool.name" = %call.name,
                "gen_ai.tool.call.id" = %call.id,
            },
            "tool call started"
        );
        Self {
            ctx,
            call,
            span,
            started: clock(),
            open: true,
        }
    }

    /// The call's span.
    pub(super) fn span(&self) -> &Span {
        &self.span
    }

    /// Says the call has its result; `panic` is the tool's panic message
    /// when the result stands for a panic.
    pub(super) fn completed(mut self, output: &ToolOutput, panic: Option<String>) {
        self.open = false;
        let (ctx, call) = (self.ctx, self.call);
        let duration_ms = millis(self.started);
        match &panic {
            Some(message) => tracing::warn!(
                target: TARGET,
                parent: &self.span,
                {
                    "gen_ai.tool.name" = %call.name,
                    "gen_ai.tool.call.id" = %call.id,
                    panic = %message,
                    duration_ms,
                },
                "tool call panicked"
            ),
            None => tracing::info!(
                target: TARGET,
                parent: &self.span,
                {
                    "gen_ai.tool.name" = %call.name,
                    "gen_ai.tool.call.id" = %call.id,
                    is_error = output.is_error,
                    duration_ms,
                },
                "tool call completed"
            ),
        }
        ctx.emit(|| AgentEvent::ToolCallCompleted {
            run_id: ctx.run_id().clone(),
            call_id: call.id.clone(),
            tool: call.name.clone(),
            is_error: output.is_error,
            error: None,
            panic,
        });
    }

    /// Says the call ended without a result, failing the run with `err`.
    pub(super) fn failed(mut self, err: &AgentError) {
        self.open = false;
        self.fail(err.code(), Some(err));
    }

    fn fail(&self, code: &'static str, err: Option<&AgentError>) {
        let (ctx, call) = (self.ctx, self.call);
        ctx.emit(|| AgentEvent::ToolCallCompleted {
            run_id: ctx.run_id().clone(),
            call_id: call.id.clone(),
            tool: call.name.clone(),
            is_error: true,
            error: Some(code),
            panic: None,
        });
        tracing::warn!(
            target: TARGET,
            parent: &self.span,
            {
                "gen_ai.tool.name" = %call.name,
                "gen_ai.tool.call.id" = %call.id,
                "error.type" = code,
                error = err.map(field::display),
                duration_ms = millis(self.started),
            },
            "tool call failed"
        );
    }
}

impl Drop for ToolCallObserver<'_> {
    fn drop(&mut self) {
        if self.open {
            self.fail(dropped_code(self.ctx), None);
        }
    }
}
