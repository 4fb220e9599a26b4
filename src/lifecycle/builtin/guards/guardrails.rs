//! [`GuardrailsMiddleware`]: [`Guard`]s on a run's input, the model's
//! output and the tools' arguments and results, each failing open or
//! closed as it says.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

pub use super::checks::OutputWindow;
use super::checks::{Config, Guards};
use super::guard::{Guard, GuardTarget};
use super::output::stream_output;
use super::parallel::{self, PendingInput};
use super::stream::DEFAULT_MAX_HOLD;
use crate::context::RunContext;
use crate::error::AgentError;
use crate::hooks::ToolVerdict;
use crate::lifecycle::{Hook, Middleware, ModelNext, Wrapped};
use crate::request::{ModelCall, ToolOutput};
use crate::types::{History, Message, ModelResponse, ToolCall};

/// Guards on a run's input, the model's output and the tools: each a
/// [`Guard`] that passes, blocks (the run ends with a tripwire naming the
/// guard, `info.guard`, `info.target`) or rewrites what it checks.
///
/// - **Input** (`before_run`): the run's input, before any model call; with
///   [`run_in_parallel`](Self::run_in_parallel), beside the first model
///   call instead, which a trip cancels.
/// - **Output**: the model's answer. By default segment by segment as it
///   streams (`wrap_model`), releasing each checked segment: what reaches
///   the sink equals the guarded full text for any chunking, and after a
///   block nothing past the last released point does; the answer the run
///   keeps is the guarded text. Or the whole answer at once
///   ([`OutputWindow::Turn`], `after_model`, holding the stream).
/// - **Tools**: the arguments before the tool runs (`before_tool`; a
///   rewrite must be JSON and is validated against the tool's schema), the
///   result after it (`after_tool`).
///
/// Several guards on one target run in order, each on what the one before
/// left. Each guard fails open or closed as its
/// [`fail_policy`](Guard::fail_policy) says; a `guard_failed` event
/// (`outcome`: `failed_open` or `failed_closed`) says which happened.
/// Give it to one agent with
/// [`AgentBuilder::middleware`](crate::AgentBuilder::middleware).
///
/// ```
/// use regex::Regex;
/// use tower_agent::lifecycle::builtin::guards::{
///     guard_fn, DetectorGuard, GuardVerdict, GuardrailsMiddleware, PiiGuard, RegexGuard,
/// };
/// use tower_agent::types::ModelDelta;
/// use tower_agent::{Agent, AgentError, DeltaSink, RunRequest, ScriptedModel, ScriptedTurn};
/// use std::sync::{Arc, Mutex};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), AgentError> {
/// let guards = GuardrailsMiddleware::new()
///     .input(DetectorGuard::heuristic())
///     .input(guard_fn("no-refunds", |_ctx, _target, text| {
///         if text.contains("refund") {
///             GuardVerdict::Block { reason: "refunds go to a person".into(), info: None }
///         } else {
///             GuardVerdict::Pass
///         }
///     }))
///     .output(PiiGuard::new())
///     .output(RegexGuard::new("codes", Regex::new(r"\b\d{4}\b").unwrap()).redact("[code]"));
/// let model = ScriptedModel::new([
///     ScriptedTurn::text("Write to ann@example.com. Your code is 4711.").chunk_chars(4),
/// ]);
/// let agent = Agent::builder("support").model(model).middleware(guards).build()?;
///
/// let seen = Arc::new(Mutex::new(String::new()));
/// let into = seen.clone();
/// let sink = DeltaSink::new(move |d| if let ModelDelta::Text { text } = d { into.lock().unwrap().push_str(text) });
/// let run = agent.run_with(RunRequest::new("How do I reach you?").stream(sink)).await?;
/// assert_eq!(run.output, "Write to [REDACTED_EMAIL]. Your code is [code].");
/// assert_eq!(*seen.lock().unwrap(), run.output);
///
/// let err = agent.run("I want a refund").await.unwrap_err();
/// assert!(matches!(err, AgentError::Tripwire { info: Some(info), .. } if info["guard"] == "no-refunds"));
/// # Ok(()) }
/// ```
///
/// # Clone
///
/// Cheap: clones share the guards.
#[derive(Clone)]
pub struct GuardrailsMiddleware {
    config: Arc<Config>,
}

impl fmt::Debug for GuardrailsMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |g: &Guards| g.iter().map(|g| g.name().to_owned()).collect::<Vec<_>>();
        let c = &self.config;
        f.debug_struct("GuardrailsMiddleware")
            .field("name", &c.name)
            .field("input", &names(&c.input))
            .field("output", &names(&c.output))
            .field("tool_arguments", &names(&c.tool_arguments))
            .field("tool_results", &names(&c.tool_results))
            .field("parallel", &c.parallel)
            .field("window", &c.window)
            .finish()
    }
}

impl Default for GuardrailsMiddleware {
    fn default() -> Self {
        Self::new()
    }
}

fn with(guards: &Guards, guard: Arc<dyn Guard>) -> Guards {
    guards.iter().cloned().chain([guard]).collect()
}

impl GuardrailsMiddleware {
    /// No guards yet, named `guardrails`; the output checked segment by
    /// segment, at most 1 KiB held.
    pub fn new() -> Self {
        let none: Guards = Arc::new([]);
        Self {
            config: Arc::new(Config {
                name: Arc::from("guardrails"),
                input: none.clone(),
                output: none.clone(),
                tool_arguments: none.clone(),
                tool_results: none,
                parallel: false,
                window: OutputWindow::Segments {
                    max_hold: DEFAULT_MAX_HOLD,
                },
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Config)) -> Self {
        let c = &*self.config;
        let mut config = Config {
            name: c.name.clone(),
            input: c.input.clone(),
            output: c.output.clone(),
            tool_arguments: c.tool_arguments.clone(),
            tool_results: c.tool_results.clone(),
            parallel: c.parallel,
            window: c.window,
        };
        f(&mut config);
        self.config = Arc::new(config);
        self
    }

    /// The name events and tripwires carry as the middleware.
    pub fn named(self, name: impl Into<Arc<str>>) -> Self {
        let name = name.into();
        self.edit(|c| c.name = name)
    }

    /// Adds a guard on the run's input.
    pub fn input(self, guard: impl Guard) -> Self {
        self.edit(|c| c.input = with(&c.input, Arc::new(guard)))
    }

    /// Adds a guard on the model's answers.
    pub fn output(self, guard: impl Guard) -> Self {
        self.edit(|c| c.output = with(&c.output, Arc::new(guard)))
    }

    /// Adds a guard on every tool call: its arguments and its result.
    pub fn tool(self, guard: impl Guard) -> Self {
        let guard: Arc<dyn Guard> = Arc::new(guard);
        self.edit(|c| {
            c.tool_arguments = with(&c.tool_arguments, guard.clone());
            c.tool_results = with(&c.tool_results, guard);
        })
    }

    /// Adds a guard on tool calls' arguments only.
    pub fn tool_arguments(self, guard: impl Guard) -> Self {
        self.edit(|c| c.tool_arguments = with(&c.tool_arguments, Arc::new(guard)))
    }

    /// Adds a guard on tool results only.
    pub fn tool_results(self, guard: impl Guard) -> Self {
        self.edit(|c| c.tool_results = with(&c.tool_results, Arc::new(guard)))
    }

    /// Runs the input guards beside the first model call instead of before
    /// it (default `false`), as the OpenAI Agents SDK's `run_in_parallel`
    /// does: the answer arrives sooner when the input is fine. On a trip
    /// the model call is cancelled and the run fails with the tripwire;
    /// whatever usage the call reported is still counted, and nothing it
    /// produced reaches the sink (its deltas are held until the guards
    /// passed). In parallel an input guard can only pass or block: a
    /// rewrite cannot reach a call already under way, and fails the run
    /// with a configuration error.
    ///
    /// ```
    /// use tower_agent::lifecycle::builtin::guards::{GuardrailsMiddleware, JudgeGuard};
    /// use tower_agent::service::box_model;
    /// use tower_agent::types::{ModelDelta, Usage};
    /// use tower_agent::{Agent, DeltaSink, RunContext, RunRequest, ScriptedModel, ScriptedTurn};
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let judge = ScriptedModel::new([
    ///     ScriptedTurn::text(r#"{"allow": false, "reason": "off topic"}"#).usage(Usage::new(20, 3)),
    /// ]);
    /// let guards = GuardrailsMiddleware::new()
    ///     .input(JudgeGuard::new(box_model(judge), "Questions about our shop only."))
    ///     .run_in_parallel(true);
    /// let model = ScriptedModel::new([ScriptedTurn::text("Here is a poem.").usage(Usage::new(9, 4))]);
    /// let agent = Agent::builder("shop").model(model.clone()).middleware(guards).build().unwrap();
    ///
    /// let deltas = Arc::new(AtomicUsize::new(0));
    /// let counted = deltas.clone();
    /// let sink = DeltaSink::new(move |_: &ModelDelta| { counted.fetch_add(1, Ordering::Relaxed); });
    /// let ctx = RunContext::new();
    /// let err = agent
    ///     .run_with(RunRequest::new("Write me a poem").stream(sink).context(ctx.clone()))
    ///     .await
    ///     .unwrap_err();
    /// assert_eq!(err.code(), "GUARDRAIL_TRIPPED");
    /// assert_eq!(model.requests().len(), 1, "the model call ran beside the guard");
    /// assert_eq!(deltas.load(Ordering::Relaxed), 0, "and none of it was sent");
    /// assert_eq!(ctx.total_usage(), Usage::new(29, 7), "both calls are counted");
    /// # }
    /// ```
    pub fn run_in_parallel(self, parallel: bool) -> Self {
        self.edit(|c| c.parallel = parallel)
    }

    /// How the output guards see a streamed answer.
    pub fn output_window(self, window: OutputWindow) -> Self {
        let window = match window {
            OutputWindow::Segments { max_hold } => OutputWindow::Segments {
                max_hold: max_hold.max(1),
            },
            OutputWindow::Turn => OutputWindow::Turn,
        };
        self.edit(|c| c.window = window)
    }

    fn segments(&self) -> Option<usize> {
        match self.config.window {
            OutputWindow::Segments { max_hold } if !self.config.output.is_empty() => Some(max_hold),
            _ => None,
        }
    }
}

impl Middleware for GuardrailsMiddleware {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn holds_stream(&self) -> bool {
        self.config.window == OutputWindow::Turn && !self.config.output.is_empty()
    }

    fn before_run<'a>(
        &'a self,
        ctx: &'a RunContext,
        input: &'a mut Message,
        _messages: &'a History,
    ) -> Hook<'a, Option<String>> {
        let config = &self.config;
        if config.input.is_empty() {
            return Hook::skip();
        }
        if config.parallel {
            PendingInput::start(ctx, config.clone(), input.text().into_owned());
            return Hook::ok(None);
        }
        Hook::new(async move {
            let text = input.text().into_owned();
            match config
                .check(ctx, &config.input, GuardTarget::Input, &text)
                .await
            {
                Ok(None) => {}
                Ok(Some(rewritten)) => input.set_text(rewritten),
                Err(stop) => return Err(stop.into_error(GuardTarget::Input, None)),
            }
            Ok(None)
        })
    }

    fn wrap_model<'a>(&'a self, call: ModelCall, next: ModelNext) -> Wrapped<'a, ModelCall> {
        let pending = if self.config.parallel {
            PendingInput::take(&call.context)
        } else {
            None
        };
        let segments = self.segments();
        if pending.is_none() && segments.is_none() {
            return Wrapped::next(call, next);
        }
        let config = self.config.clone();
        Wrapped::new(async move {
            let mut call = call;
            let ctx = call.context.clone();
            let hold = pending.as_ref().map(|_| parallel::Hold::install(&mut call));
            let answer = async {
                match segments {
                    Some(max_hold) => stream_output(&config, call, next, max_hold).await,
                    None => next.run(call).await,
                }
            };
            match (pending, hold) {
                (Some(pending), Some(hold)) => {
                    parallel::race(&ctx, &config, pending, hold, answer).await
                }
                _ => answer.await,
            }
        })
    }

    fn after_model<'a>(
        &'a self,
        ctx: &'a RunContext,
        response: &'a mut ModelResponse,
    ) -> Hook<'a, ()> {
        let config = &self.config;
        if config.window != OutputWindow::Turn || config.output.is_empty() {
            return Hook::skip();
        }
        Hook::new(async move {
            let text = response.message.text().into_owned();
            if text.is_empty() {
                return Ok(());
            }
            match config
                .check(ctx, &config.output, GuardTarget::Output, &text)
                .await
            {
                Ok(None) => Ok(()),
                Ok(Some(rewritten)) => {
                    response.message.set_text(rewritten);
                    Ok(())
                }
                Err(stop) => Err(stop.into_error(GuardTarget::Output, Some(0))),
            }
        })
    }

    fn before_tool<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        _resumed: bool,
    ) -> Hook<'a, ToolVerdict> {
        let config = &self.config;
        if config.tool_arguments.is_empty() {
            return Hook::skip();
        }
        Hook::new(async move {
            let target = GuardTarget::ToolArguments { tool: &call.name };
            match config.check(ctx, &config.tool_arguments, target, &call.arguments).await {
                Ok(None) => Ok(ToolVerdict::proceed()),
                Ok(Some(rewritten)) => match serde_json::from_str::<Value>(&rewritten) {
                    Ok(args) => Ok(ToolVerdict::proceed().with_arguments(args)),
                    Err(err) => Err(AgentError::Config(format!(
                        "a guard rewrote the arguments of tool `{}` into text that is not JSON: {err}",
                        call.name
                    ))
                    .into()),
                },
                Err(stop) => Err(stop.into_error(target, None)),
            }
        })
    }

    fn after_tool<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        output: &'a mut ToolOutput,
    ) -> Hook<'a, ()> {
        let config = &self.config;
        if config.tool_results.is_empty() {
            return Hook::skip();
        }
        Hook::new(async move {
            let target = GuardTarget::ToolResult { tool: &call.name };
            match config
                .check(ctx, &config.tool_results, target, &output.content)
                .await
            {
                Ok(None) => Ok(()),
                Ok(Some(rewritten)) => {
                    output.content = rewritten;
                    Ok(())
                }
                Err(stop) => Err(stop.into_error(target, None)),
            }
        })
    }
}
