//! [`AgentExt`]: an agent's verbs on any run service, layered or not.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower::util::Oneshot;
use tower::{Service, ServiceExt};

use super::handle::RunHandle;
use super::inbox::Inbox;
use crate::error::{AgentError, BoxError};
use crate::request::RunRequest;
use crate::types::AgentRun;

/// `run` and `run_with` for every run service: an [`Agent`](crate::Agent)
/// wrapped in a [`LifecycleLayer`](crate::LifecycleLayer), in tower's own
/// layers (`ConcurrencyLimitLayer`, `BufferLayer`, …) or in any other layer
/// keeps the verbs of the bare agent.
///
/// Implemented for every `Service<RunRequest, Response = AgentRun> + Clone`
/// whose error is `Into<BoxError>`. Each call runs on a clone, so the
/// service itself stays usable. The future waits for the service to be
/// ready, calls it, and answers with an [`AgentError`]: an error of a
/// tower layer is classified as the run loop classifies it (see
/// [`AgentError::classify`]).
///
/// ```
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
pub trait AgentExt: Service<RunRequest, Response = AgentRun> + Clone + Sized
where
    Self::Error: Into<BoxError>,
{
    /// Runs on a user message, in a fresh root context.
    fn run(&self, input: impl Into<String>) -> RunFuture<Self> {
        self.run_with(RunRequest::new(input))
    }

    /// Runs `request`: its input, history, context and stream.
    fn run_with(&self, request: RunRequest) -> RunFuture<Self> {
        RunFuture {
            inner: self.clone().oneshot(request),
        }
    }

    /// Starts `request` with a [`RunHandle`]: send it user messages while
    /// the run goes on, cancel it, await its result. See
    /// [`handle`](super::handle).
    fn start(&self, mut request: RunRequest) -> RunHandle
    where
        Self: Send + 'static,
        Self::Future: Send + 'static,
    {
        let inbox = Inbox::default();
        request.extensions.insert(inbox.clone());
        let ctx = request.context.clone();
        RunHandle::new(inbox, ctx, Box::pin(self.run_with(request)))
    }
}

impl<S> AgentExt for S
where
    S: Service<RunRequest, Response = AgentRun> + Clone,
    S::Error: Into<BoxError>,
{
}

pin_project! {
    /// The future of [`AgentExt::run`] and [`AgentExt::run_with`].
    pub struct RunFuture<S>
    where
        S: Service<RunRequest>,
    {
        #[pin]
        inner: Oneshot<S, RunRequest>,
    }
}

impl<S: Service<RunRequest>> fmt::Debug for RunFuture<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RunFuture")
    }
}

impl<S> Future for RunFuture<S>
where
    S: Service<RunRequest, Response = AgentRun>,
    S::Error: Into<BoxError>,
{
    type Output = Result<AgentRun, AgentError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project()
            .inner
            .poll(cx)
            .map_err(|err| AgentError::classify(err.into()))
    }
}
