//! [`AgentExt`]: an agent's verbs on any run service, layered or not.

use tower::util::Oneshot;
use tower::{Service, ServiceExt};

use crate::error::AgentError;
use crate::request::RunRequest;
use crate::types::AgentRun;

/// `run` and `run_with` for every run service: an [`Agent`](crate::Agent)
/// wrapped in a [`LifecycleLayer`](crate::LifecycleLayer) or in any other
/// layer keeps the verbs of the bare agent.
///
/// Implemented for every `Service<RunRequest, Response = AgentRun, Error =
/// AgentError> + Clone`. Each call runs on a clone, so the service itself
/// stays usable; the future is tower's [`Oneshot`], which waits for the
/// service to be ready, then calls it.
///
/// ```
/// use tower::Layer;
/// use tower_agent::prelude::*;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), AgentError> {
/// let model = ScriptedModel::new([ScriptedTurn::text("Hello!"), ScriptedTurn::text("Again!")]);
/// let agent = Agent::builder("assistant").model(model).build()?;
/// let agent = LifecycleLayer::new(MiddlewareStack::new()).layer(agent);
///
/// assert_eq!(agent.run("Hi").await?.output, "Hello!");
/// let thread = RunContext::builder().thread_id("thread-1").build();
/// let run = agent.run_with(RunRequest::new("Hi again").context(thread)).await?;
/// assert_eq!(run.output, "Again!");
/// # Ok(()) }
/// ```
pub trait AgentExt:
    Service<RunRequest, Response = AgentRun, Error = AgentError> + Clone + Sized
{
    /// Runs on a user message, in a fresh root context.
    fn run(&self, input: impl Into<String>) -> Oneshot<Self, RunRequest> {
        self.clone().oneshot(RunRequest::new(input))
    }

    /// Runs `request`: its input, history, context and stream.
    fn run_with(&self, request: RunRequest) -> Oneshot<Self, RunRequest> {
        self.clone().oneshot(request)
    }
}

impl<S> AgentExt for S where S: Service<RunRequest, Response = AgentRun, Error = AgentError> + Clone {}
