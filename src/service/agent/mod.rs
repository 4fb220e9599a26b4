//! The [`Agent`]: the run loop as a `Service<RunRequest>`.

mod bare_tool;
pub mod definition;
mod ext;
pub mod handle;
pub mod handoff;
mod hooked_tool;
mod hooked_turn;
mod inbox;
mod limits;
mod observe;
mod output;
mod run;
mod state;
mod tools;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde_json::Value;
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceExt};

use super::{box_model, box_tool, BoxModel, BoxTool, RunTools, ToolDef, ToolRouter};
use crate::context::RunContext;
use crate::error::{AgentError, BoxError};
use crate::hooks::AgentMiddleware;
use crate::request::{ModelCall, RunRequest, ToolInvocation, ToolOutput};
use crate::types::{
    AgentRun, ApprovalDecision, History, Message, ModelName, ModelResponse, ModelSettings,
    ToolCall, ToolSpec,
};

pub use definition::{AgentDefinition, DefinitionError, HandoffDefinition, Registry};
pub use ext::{AgentExt, RunFuture};
pub use handle::{Finished, LateMessages, RunHandle, RunSender, Unsent};
pub use handoff::{Handoff, HandoffInput};
use limits::ToolLimits;
pub(crate) use output::OutputSchema;

/// Decides a call that asks for approval when no hook did: the person in the
/// loop. `None` leaves it undecided (the call is declined).
pub type Approver =
    dyn Fn(ToolCall, RunContext) -> BoxFuture<'static, Option<ApprovalDecision>> + Send + Sync;

pub(crate) type ToolFlags = super::ToolTraits;

pub(crate) struct Config {
    pub(crate) name: Arc<str>,
    pub(crate) instructions: Option<String>,
    /// The system prompt as a history of its own, which the conversations
    /// of the agent's new runs continue: one copy of it for all of them.
    pub(crate) prompt: Option<History>,
    pub(crate) model: BoxModel,
    pub(crate) model_name: ModelName,
    /// Shared, so a walk down the wrap hooks can lend it without cloning
    /// the boxed stack.
    pub(crate) tools: Arc<BoxTool>,
    /// The router itself when no tool layer wraps it: a run without hooks
    /// calls it directly, with no boxed clone and no boxed future per call.
    pub(crate) router: Option<ToolRouter>,
    /// Whether a tool may stream its progress (any may, behind a tool
    /// layer): only then does a tool call get the delta hooks' sink.
    pub(crate) tools_stream: bool,
    pub(crate) specs: Arc<[ToolSpec]>,
    pub(crate) flags: RunTools,
    /// Whether a tool declares approval or idempotence: without one, a
    /// call's traits are not looked up.
    pub(crate) flagged: bool,
    pub(crate) max_turns: u32,
    pub(crate) parallel_tool_calls: bool,
    pub(crate) settings: Arc<ModelSettings>,
    pub(crate) output: Option<OutputSchema>,
    pub(crate) approver: Option<Arc<Approver>>,
    pub(crate) limits: ToolLimits,
    /// The agents the run may be handed over to.
    pub(crate) handoffs: Vec<Handoff>,
}

/// An agent: instructions, a model service, tools and limits, run as a
/// `Service<RunRequest, Response = AgentRun>`.
///
/// The loop goes model → the turn's tool calls → model … until a final
/// answer, a [`stop`](RunContext::stop), cancellation, or `max_turns`. Tool
/// calls of one turn run concurrently (unless turned off) and their results
/// are appended in the order the model made the calls.
///
/// ```
/// use tower_agent::{tool_sync, Agent, BoxError, ScriptedModel, ScriptedTurn, ToolRouter};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::AgentError> {
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Sum { a: i64, b: i64 }
///
/// let model = ScriptedModel::new([
///     ScriptedTurn::tool_call("add", r#"{"a": 2, "b": 3}"#),
///     ScriptedTurn::text("2 + 3 = 5"),
/// ]);
/// let agent = Agent::builder("calculator")
///     .instructions("You add numbers.")
///     .model(model)
///     .tools(ToolRouter::new().tool(tool_sync("add", "Adds", |s: Sum| Ok::<_, BoxError>(s.a + s.b))))
///     .build()?;
///
/// let run = agent.run("What is 2 + 3?").await?;
/// assert_eq!(run.output, "2 + 3 = 5");
/// assert_eq!(run.counters.tool_calls, 1);
/// # Ok(()) }
/// ```
///
/// # Clone
///
/// Cheap: the configuration is shared.
#[derive(Clone)]
pub struct Agent {
    config: Arc<Config>,
    /// What `.middleware(..)` set: the agent brackets each run with it.
    middleware: Option<AgentMiddleware>,
}

impl Agent {
    /// A builder for an agent called `name`.
    pub fn builder(name: impl Into<Arc<str>>) -> AgentBuilder {
        AgentBuilder {
            name: name.into(),
            instructions: None,
            model: None,
            model_name: None,
            tools: ToolRouter::new(),
            tool_stack: None,
            max_turns: 10,
            parallel_tool_calls: true,
            settings: ModelSettings::default(),
            output: None,
            output_retries: 2,
            approver: None,
            middleware: None,
            limits: ToolLimits::default(),
            handoffs: Vec::new(),
        }
    }

    /// The agent's name.
    pub fn name(&self) -> &Arc<str> {
        &self.config.name
    }

    /// The tools the model sees, the handoff tools among them.
    pub fn tool_specs(&self) -> &Arc<[ToolSpec]> {
        &self.config.specs
    }

    /// The agents this one may hand the run over to.
    pub fn handoffs(&self) -> &[Handoff] {
        &self.config.handoffs
    }

    /// Runs the agent on a user message, in a fresh root context.
    ///
    /// # Errors
    ///
    /// See [`AgentError`].
    pub async fn run(&self, input: impl Into<String>) -> Result<AgentRun, AgentError> {
        self.clone().oneshot(RunRequest::new(input)).await
    }

    /// Runs `request`: its input, history, context and stream.
    ///
    /// A layered agent has the same verbs through [`AgentExt`].
    ///
    /// # Errors
    ///
    /// See [`AgentError`].
    pub async fn run_with(&self, request: RunRequest) -> Result<AgentRun, AgentError> {
        self.clone().oneshot(request).await
    }

    /// Starts `request` with a [`RunHandle`] that takes user messages while
    /// the run goes on. See [`handle`].
    pub fn start(&self, request: RunRequest) -> RunHandle {
        AgentExt::start(self, request)
    }
}

impl fmt::Debug for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.config.name)
            .field("model", &self.config.model_name)
            .field(
                "tools",
                &self
                    .config
                    .specs
                    .iter()
                    .map(|s| &s.name)
                    .collect::<Vec<_>>(),
            )
            .field(
                "handoffs",
                &self
                    .config
                    .handoffs
                    .iter()
                    .map(|h| h.target().name())
                    .collect::<Vec<_>>(),
            )
            .field("max_turns", &self.config.max_turns)
            .finish_non_exhaustive()
    }
}

/// The future of an [`Agent`] run.
pub struct AgentFuture {
    inner: BoxFuture<'static, Result<AgentRun, AgentError>>,
}

impl fmt::Debug for AgentFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AgentFuture")
    }
}

impl Future for AgentFuture {
    type Output = Result<AgentRun, AgentError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl Service<RunRequest> for Agent {
    type Response = AgentRun;
    type Error = AgentError;
    type Future = AgentFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), AgentError>> {
        // The model and tool services are driven to readiness per call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: RunRequest) -> AgentFuture {
        let inner = match &self.middleware {
            None => Box::pin(run::run(self.config.clone(), request)),
            Some(middleware) => {
                let bare = Agent {
                    config: self.config.clone(),
                    middleware: None,
                };
                middleware.run(request, BoxCloneSyncService::new(bare.map_err(Into::into)))
            }
        };
        AgentFuture { inner }
    }
}

type ToolStack = Box<dyn FnOnce(BoxTool) -> BoxTool + Send>;

/// Builds an [`Agent`]. See [`Agent::builder`].
pub struct AgentBuilder {
    name: Arc<str>,
    instructions: Option<String>,
    model: Option<BoxModel>,
    model_name: Option<String>,
    tools: ToolRouter,
    tool_stack: Option<ToolStack>,
    max_turns: u32,
    parallel_tool_calls: bool,
    settings: ModelSettings,
    output: Option<Value>,
    output_retries: u32,
    approver: Option<Arc<Approver>>,
    middleware: Option<AgentMiddleware>,
    limits: ToolLimits,
    handoffs: Vec<Handoff>,
}

impl fmt::Debug for AgentBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentBuilder")
            .field("name", &self.name)
            .field("tools", &self.tools)
            .field("max_turns", &self.max_turns)
            .finish_non_exhaustive()
    }
}

impl AgentBuilder {
    /// The system prompt.
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = Some(instructions.into());
        self
    }

    /// The model service: any `Service<ModelCall>`, usually a provider
    /// wrapped in layers with `ServiceBuilder`.
    pub fn model<S>(mut self, model: S) -> Self
    where
        S: Service<ModelCall, Response = ModelResponse> + Clone + Send + Sync + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        self.model = Some(box_model(model));
        self
    }

    /// The model name put in each request (default: empty, which the
    /// service fills in).
    pub fn model_name(mut self, name: impl Into<String>) -> Self {
        self.model_name = Some(name.into());
        self
    }

    /// The tools (replacing any added before).
    pub fn tools(mut self, tools: ToolRouter) -> Self {
        self.tools = tools;
        self
    }

    /// Adds one tool, replacing one of the same name: a function tool
    /// ([`tool_fn`](crate::tool_fn), [`tool_sync`](crate::tool_sync)), an
    /// [`AgentTool`](crate::AgentTool) or any [`ToolDef`].
    pub fn tool(mut self, tool: impl Into<ToolDef>) -> Self {
        self.tools = self.tools.tool(tool);
        self
    }

    /// The most bytes of arguments a tool call may send (default 1 MiB).
    /// A call with more is not made: the model reads an error result that
    /// gives the size and the limit.
    pub fn max_tool_argument_bytes(mut self, bytes: usize) -> Self {
        self.limits.max_argument_bytes = bytes;
        self
    }

    /// The most bytes of a tool result written into the conversation
    /// (default 256 KiB). A longer result is cut at a character boundary and
    /// followed by a note saying how many bytes were left out. Hooks and
    /// events see the whole result.
    pub fn max_tool_result_bytes(mut self, bytes: usize) -> Self {
        self.limits.max_result_bytes = bytes;
        self
    }

    /// Whether the model reads a tool's panic message (default `false`: it
    /// reads that the tool failed, named; the message goes to the
    /// `ToolCallCompleted` event and the trace). The same below the wrap
    /// hooks of the agent's middleware: their `next.run` answers the error
    /// result the model will read. Below a tower tool layer
    /// (`tool_layer(from_fn(..))`, `WrapToolLayer`), `next.run` fails with
    /// a [`ToolPanicked`](crate::error::ToolPanicked) instead, whose
    /// display leaves the message out.
    pub fn show_tool_panics(mut self, show: bool) -> Self {
        self.limits.show_panics = show;
        self
    }

    /// Wraps the tool router in `layer` (timeouts, retries, limits, …).
    /// Called again, the new layer goes outside the earlier ones.
    pub fn tool_layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<BoxTool> + Send + 'static,
        L::Service: Service<ToolInvocation, Response = ToolOutput> + Clone + Send + Sync + 'static,
        <L::Service as Service<ToolInvocation>>::Error: Into<BoxError>,
        <L::Service as Service<ToolInvocation>>::Future: Send + 'static,
    {
        let earlier = self.tool_stack.take();
        self.tool_stack = Some(Box::new(move |tools: BoxTool| {
            let tools = match earlier {
                Some(earlier) => earlier(tools),
                None => tools,
            };
            box_tool(layer.layer(tools))
        }));
        self
    }

    /// The most model turns a run may take (default 10).
    pub fn max_turns(mut self, max_turns: u32) -> Self {
        self.max_turns = max_turns;
        self
    }

    /// Whether a turn's tool calls run concurrently (default `true`).
    pub fn parallel_tool_calls(mut self, parallel: bool) -> Self {
        self.parallel_tool_calls = parallel;
        self
    }

    /// Sampling and shape settings of every request.
    pub fn settings(mut self, settings: ModelSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Asks for a final answer in JSON matching `schema`. The answer is
    /// parsed and validated; a mismatch goes back to the model with the
    /// validation error, up to [`output_retries`](Self::output_retries)
    /// times, then the run fails with `STRUCTURED_OUTPUT`.
    pub fn response_schema(mut self, schema: Value) -> Self {
        self.output = Some(schema);
        self
    }

    /// [`response_schema`](Self::response_schema) from a Rust type.
    pub fn output_type<T: JsonSchema>(self) -> Self {
        self.response_schema(super::tool_fn::parameters_schema::<T>())
    }

    /// How often a final answer that misses the schema is sent back
    /// (default 2).
    pub fn output_retries(mut self, retries: u32) -> Self {
        self.output_retries = retries;
        self
    }

    /// Runs `middleware` (a [`Middleware`](crate::lifecycle::Middleware) or
    /// a [`MiddlewareStack`](crate::lifecycle::MiddlewareStack)) in each of
    /// the agent's runs, as a [`LifecycleLayer`](crate::lifecycle::LifecycleLayer)
    /// around it would: its placement is the agent's. Called again, the new
    /// middleware go inside the earlier ones. The agent keeps its own
    /// `run`, and its nested runs see these hooks.
    pub fn middleware(mut self, middleware: impl Into<AgentMiddleware>) -> Self {
        let middleware = middleware.into();
        self.middleware = Some(match self.middleware.take() {
            Some(outer) => outer.then(middleware),
            None => middleware,
        });
        self
    }

    /// Lets the model hand the run over to another agent, with the tool
    /// `transfer_to_<name>`: an [`Agent`] or a [`Handoff`] to one. See
    /// [`handoff`].
    pub fn handoff(mut self, handoff: impl Into<Handoff>) -> Self {
        self.handoffs.push(handoff.into());
        self
    }

    /// Who decides calls that ask for approval when no hook did.
    pub fn approver<F, Fut>(mut self, approver: F) -> Self
    where
        F: Fn(ToolCall, RunContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<ApprovalDecision>> + Send + 'static,
    {
        self.approver = Some(Arc::new(move |call, ctx| Box::pin(approver(call, ctx))));
        self
    }

    /// The agent.
    ///
    /// # Errors
    ///
    /// [`AgentError::Config`] without a model, with `max_turns` of 0, with a
    /// tool size limit of 0, or with a response schema that does not compile.
    pub fn build(self) -> Result<Agent, AgentError> {
        let model = self
            .model
            .ok_or_else(|| AgentError::Config(format!("agent `{}` has no model", self.name)))?;
        if self.max_turns == 0 {
            return Err(AgentError::Config("max_turns must be at least 1".into()));
        }
        if self.limits.max_argument_bytes == 0 || self.limits.max_result_bytes == 0 {
            return Err(AgentError::Config(
                "max_tool_argument_bytes and max_tool_result_bytes must be at least 1".into(),
            ));
        }
        let mut settings = self.settings;
        let output = match self.output {
            Some(schema) => {
                let output = OutputSchema::new(&self.name, schema, self.output_retries)?;
                settings.response_format = Some(output.response_format());
                Some(output)
            }
            None => None,
        };
        let mut handoffs = Vec::with_capacity(self.handoffs.len());
        for handoff in self.handoffs {
            let name = &handoff.tool_name;
            if self.tools.get(name).is_some()
                || handoffs.iter().any(|h: &Handoff| h.tool_name == *name)
            {
                return Err(AgentError::Config(format!(
                    "agent `{}` has two tools called `{name}`: a handoff's tool name must be unique",
                    self.name
                )));
            }
            handoffs.push(handoff.compile()?);
        }
        let specs: Arc<[ToolSpec]> = if handoffs.is_empty() {
            self.tools.specs().clone()
        } else {
            self.tools
                .specs()
                .iter()
                .cloned()
                .chain(handoffs.iter().map(Handoff::spec))
                .collect()
        };
        let flags: RunTools = specs
            .iter()
            .filter_map(|s| Some((s.name.clone(), self.tools.get(&s.name)?.traits())))
            .collect();
        let flagged = flags.any(|t| t.requires_approval || t.idempotent);
        let boxed = box_tool(self.tools.clone());
        let (tools, router) = match self.tool_stack {
            Some(stack) => (stack(boxed), None),
            None => (boxed, Some(self.tools)),
        };
        let tools_stream = router.as_ref().is_none_or(ToolRouter::may_stream);
        Ok(Agent {
            config: Arc::new(Config {
                name: self.name,
                prompt: self
                    .instructions
                    .as_deref()
                    .map(|text| History::from(vec![Message::system(text)])),
                instructions: self.instructions,
                model,
                model_name: self.model_name.map(ModelName::from).unwrap_or_default(),
                tools: Arc::new(tools),
                router,
                tools_stream,
                specs,
                flags,
                flagged,
                max_turns: self.max_turns,
                parallel_tool_calls: self.parallel_tool_calls,
                settings: Arc::new(settings),
                output,
                approver: self.approver,
                limits: self.limits,
                handoffs,
            }),
            middleware: self.middleware,
        })
    }
}
