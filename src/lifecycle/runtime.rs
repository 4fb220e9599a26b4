//! Placement levels: a [`Runtime`]'s middleware (every run of every agent it
//! serves, and [`Runtime::invoke_tool`]), and one run's ([`RunMiddleware`]).

use std::fmt;
use std::sync::Arc;

use tower::{Service, ServiceExt};

use super::call_chain::tool_call;
use super::stack::CompiledStack;
use super::wrap::ToolCallee;
use super::{LifecycleLayer, MiddlewareStack};
use crate::error::{AgentError, BoxError};
use crate::request::{box_tool, RunRequest, ToolInvocation, ToolOutput};
use crate::service::Agent;
use crate::types::AgentRun;

/// Middleware shared by every agent a runtime serves, outside each agent's
/// own, and by the tool calls made outside a run with
/// [`invoke_tool`](Self::invoke_tool).
///
/// ```
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_agent::lifecycle::{HookPoint, LoggingMiddleware, MiddlewareStack, Runtime};
/// use tower_agent::{Agent, RunRequest, ScriptedModel, ScriptedTurn};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::AgentError> {
/// let audit = LoggingMiddleware::named("audit");
/// let runtime = Runtime::new(MiddlewareStack::new().push(audit.clone()));
///
/// let model = ScriptedModel::new([ScriptedTurn::text("Hello!"), ScriptedTurn::text("Hi again")]);
/// let agent = Agent::builder("support").model(model).build()?;
///
/// // A plain agent, run by the runtime:
/// let run = runtime.run(agent.clone(), RunRequest::new("hi")).await?;
/// assert_eq!(run.output, "Hello!");
///
/// // An agent with middleware of its own: the runtime's wrap them.
/// let support = ServiceBuilder::new()
///     .layer(runtime.layer(MiddlewareStack::new().push(LoggingMiddleware::named("agent"))))
///     .service(agent);
/// let run = support.oneshot(RunRequest::new("hi")).await?;
/// assert_eq!(run.output, "Hi again");
/// assert_eq!(audit.counts().get(HookPoint::AfterAgent), 2);
/// # Ok(()) }
/// ```
///
/// # Clone
///
/// Clones share the middleware.
#[derive(Clone)]
pub struct Runtime {
    stack: Arc<CompiledStack>,
}

impl Runtime {
    /// A runtime running `stack` around every run it serves.
    pub fn new(stack: MiddlewareStack) -> Self {
        Self {
            stack: stack.compile(),
        }
    }

    /// A lifecycle layer for one agent: the runtime's middleware, then
    /// `agent`'s. A nested agent built with the same runtime's layer does not
    /// run the runtime's middleware twice: its run inherits them.
    pub fn layer(&self, agent: MiddlewareStack) -> LifecycleLayer {
        LifecycleLayer::with_runtime(self.stack.clone(), agent.compile())
    }

    /// Runs `request` on a plain `agent` with the runtime's middleware (and
    /// the run's, from the request). An agent with middleware of its own is
    /// built with [`layer`](Self::layer) and called as the service it is.
    ///
    /// # Errors
    ///
    /// The run's [`AgentError`].
    pub async fn run(&self, agent: Agent, request: RunRequest) -> Result<AgentRun, AgentError> {
        use tower::Layer;
        self.layer(MiddlewareStack::new())
            .layer(agent)
            .oneshot(request)
            .await
    }

    /// Calls a tool outside a run, through the runtime's tool middleware
    /// (wrap and delta hooks).
    ///
    /// A failing tool comes back as an error result, as the model would
    /// read it: a panic too, which reads only that the tool failed; its
    /// message goes to the trace.
    ///
    /// # Errors
    ///
    /// An error a middleware raises, a [`tripwire`](crate::tripwire) among
    /// them.
    pub async fn invoke_tool<S>(
        &self,
        tools: S,
        invocation: ToolInvocation,
    ) -> Result<ToolOutput, AgentError>
    where
        S: Service<ToolInvocation, Response = ToolOutput> + Clone + Send + Sync + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        let (ctx, call) = (invocation.context.clone(), ToolCallee::of(&invocation.call));
        let result = tool_call(self.stack.clone(), invocation, box_tool(tools), None).await;
        // Noted where the panic became the result; no run takes it here.
        if let Some(message) = ctx.take_tool_panic(call.call_id()) {
            tracing::warn!(
                "gen_ai.tool.name" = call.tool(),
                "gen_ai.tool.call.id" = call.call_id(),
                panic = %message,
                "tool call panicked"
            );
        }
        result.map_err(AgentError::classify)
    }
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("middleware", &self.stack)
            .finish()
    }
}

/// The middleware of one run, carried in the request's extensions. The
/// lifecycle layer places them inside the agent's. Pass them again to a
/// resumed run: middleware is code, a checkpoint does not carry it.
///
/// ```
/// use tower_agent::lifecycle::{LoggingMiddleware, MiddlewareStack, RunRequestExt};
/// use tower_agent::RunRequest;
///
/// let request = RunRequest::new("hi")
///     .with_middleware(MiddlewareStack::new().push(LoggingMiddleware::named("audit")));
/// assert!(request.extensions.get::<tower_agent::lifecycle::RunMiddleware>().is_some());
/// ```
#[derive(Clone)]
pub struct RunMiddleware {
    pub(crate) stack: Arc<CompiledStack>,
}

impl RunMiddleware {
    /// The run-level middleware `stack`.
    pub fn new(stack: MiddlewareStack) -> Self {
        Self {
            stack: stack.compile(),
        }
    }
}

impl From<MiddlewareStack> for RunMiddleware {
    fn from(stack: MiddlewareStack) -> Self {
        Self::new(stack)
    }
}

impl fmt::Debug for RunMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RunMiddleware").field(&self.stack).finish()
    }
}

/// Adds middleware to one [`RunRequest`].
pub trait RunRequestExt {
    /// Runs `stack` in this run only, inside the agent's middleware.
    fn with_middleware(self, stack: MiddlewareStack) -> Self;
}

impl RunRequestExt for RunRequest {
    fn with_middleware(mut self, stack: MiddlewareStack) -> Self {
        self.extensions.insert(RunMiddleware::new(stack));
        self
    }
}
