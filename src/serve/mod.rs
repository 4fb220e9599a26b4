//! Agents served over HTTP (feature `server`), on axum.
//!
//! [`AgentServer`] holds a set of named agents (any
//! `Service<RunRequest, Response = AgentRun, Error = AgentError>`) and a
//! [`CheckpointStore`] for paused runs; [`AgentServer::router`] is an axum
//! [`Router`], itself a tower service, so tower-http layers (trace, CORS,
//! compression, a request-body limit, a timeout) go on it in the usual way.
//!
//! | route | what it does |
//! | --- | --- |
//! | `POST /v1/agents/{name}/runs` | runs `{input, thread_id?, history?}`; answers the run as JSON, or with `Accept: text/event-stream` streams its events as SSE (`event:` the event type, `delta` for text, then `run` or `error`; `data:` JSON) |
//! | `POST /v1/runs/{id}/resume` | continues a paused run with `{decisions, version?}` |
//! | `GET /v1/runs/{id}` | where a run stands: `running`, `completed`, `stopped`, `paused` (with its waiting calls) or `failed` |
//! | `POST /v1/chat/completions` | the agent named by `model` answers as if it were a model, streamed or not, for any OpenAI client |
//! | `GET /` | the run viewer: a page that starts a run and shows it live |
//!
//! A paused run answers with `checkpoint: {id, version, pending}`; the
//! checkpoint waits in the store until a resume takes it (of two resumers,
//! one wins, the other gets 409). Errors are JSON `{code, message, details}`
//! with a status from the code (see [`ApiError`]); a malformed body is a 400
//! saying what was wrong. A client that disconnects cancels its run; the
//! cancellation reaches the model and tool calls, and the run's events stay
//! balanced. [`AgentServer::serve`] shuts down gracefully, letting running
//! runs finish up to a deadline.
//!
//! ```
//! use tower_agent::serve::AgentServer;
//! use tower_agent::{Agent, ScriptedModel, ScriptedTurn};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let agent = Agent::builder("greeter")
//!     .model(ScriptedModel::new([ScriptedTurn::text("Hello!")]))
//!     .build()
//!     .unwrap();
//! let app = AgentServer::new().agent("greeter", agent).router();
//!
//! let request = axum::http::Request::post("/v1/agents/greeter/runs")
//!     .header("content-type", "application/json")
//!     .body(axum::body::Body::from(r#"{"input": "Hi"}"#))
//!     .unwrap();
//! let response = app.oneshot(request).await.unwrap();
//! assert_eq!(response.status(), 200);
//! let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
//! let run: serde_json::Value = serde_json::from_slice(&body).unwrap();
//! assert_eq!(run["output"], "Hello!");
//! # }
//! ```

mod error;
mod openai;
mod routes;
mod runs;
mod viewer;

use std::collections::HashMap;
use std::fmt;
use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service};

pub use error::ApiError;

use crate::error::AgentError;
use crate::lifecycle::{MiddlewareStack, Runtime};
use crate::request::RunRequest;
use crate::stores::{CheckpointStore, InMemoryCheckpointStore};
use crate::types::AgentRun;

/// An agent as the server holds it.
pub type ServedAgent = BoxCloneSyncService<RunRequest, AgentRun, AgentError>;

pub(crate) struct Inner {
    agents: HashMap<String, ServedAgent>,
    default_agent: Option<String>,
    pub(crate) store: Arc<dyn CheckpointStore>,
    pub(crate) runs: runs::Runs,
}

/// The state the handlers share.
pub(crate) type Shared = Arc<Inner>;

impl Inner {
    pub(crate) fn agent(&self, name: &str) -> Result<ServedAgent, ApiError> {
        self.agents.get(name).cloned().ok_or_else(|| {
            let mut known: Vec<&str> = self.agents.keys().map(String::as_str).collect();
            known.sort_unstable();
            ApiError::not_found(format!(
                "no agent `{name}`; the agents are: {}",
                known.join(", ")
            ))
        })
    }

    pub(crate) fn agent_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.agents.keys().cloned().collect();
        names.sort_unstable();
        names
    }

    /// The agent a chat completion names, or the default one.
    pub(crate) fn agent_for_model(&self, model: &str) -> Result<(String, ServedAgent), ApiError> {
        if let Some(agent) = self.agents.get(model) {
            return Ok((model.to_owned(), agent.clone()));
        }
        let fallback = self.default_agent.clone().or_else(|| {
            (self.agents.len() == 1)
                .then(|| self.agents.keys().next().cloned())
                .flatten()
        });
        match fallback {
            Some(name) => Ok((name.clone(), self.agent(&name)?)),
            None => Err(self
                .agent(model)
                .err()
                .unwrap_or_else(|| ApiError::not_found(model))),
        }
    }
}

/// A set of named agents served over HTTP; see the module docs.
///
/// # Clone
///
/// Cheap: clones share the agents, the store and the table of runs.
#[derive(Clone)]
pub struct AgentServer {
    runtime: Option<Runtime>,
    agents: HashMap<String, ServedAgent>,
    default_agent: Option<String>,
    store: Arc<dyn CheckpointStore>,
    runs: runs::Runs,
}

impl Default for AgentServer {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentServer {
    /// A server with no agents and an in-memory checkpoint store.
    pub fn new() -> Self {
        Self {
            runtime: None,
            agents: HashMap::new(),
            default_agent: None,
            store: Arc::new(InMemoryCheckpointStore::new()),
            runs: runs::Runs::default(),
        }
    }

    /// A server whose agents all run inside `runtime`'s middleware: every
    /// agent given to [`agent`](Self::agent) or [`agents`](Self::agents)
    /// afterwards is wrapped in [`Runtime::layer`], so the runtime's hooks
    /// bracket each served run (and, as always, the runs nested in it).
    /// Give it agents without the runtime's layer of their own.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// use tower::ServiceExt;
    /// use tower_agent::lifecycle::{MiddlewareStack, Runtime};
    /// use tower_agent::serve::AgentServer;
    /// use tower_agent::{Agent, ScriptedModel, ScriptedTurn};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let served = Arc::new(AtomicUsize::new(0));
    /// let count = served.clone();
    /// let audit = MiddlewareStack::new().after_agent("audit", move |_ctx, _outcome| {
    ///     count.fetch_add(1, Ordering::SeqCst);
    ///     Ok(())
    /// });
    /// let agent = Agent::builder("greeter")
    ///     .model(ScriptedModel::new([ScriptedTurn::text("Hello!")]))
    ///     .build()
    ///     .unwrap();
    /// let app = AgentServer::from_runtime(Runtime::new(audit))
    ///     .agent("greeter", agent)
    ///     .router();
    ///
    /// let request = axum::http::Request::post("/v1/agents/greeter/runs")
    ///     .header("content-type", "application/json")
    ///     .body(axum::body::Body::from(r#"{"input": "Hi"}"#))
    ///     .unwrap();
    /// assert_eq!(app.oneshot(request).await.unwrap().status(), 200);
    /// assert_eq!(served.load(Ordering::SeqCst), 1);
    /// # }
    /// ```
    pub fn from_runtime(runtime: Runtime) -> Self {
        Self {
            runtime: Some(runtime),
            ..Self::new()
        }
    }

    /// Serves `agent` under `name`, replacing an agent of that name (inside
    /// the runtime's middleware, for a server [built from a
    /// runtime](Self::from_runtime)).
    pub fn agent<S>(mut self, name: impl Into<String>, agent: S) -> Self
    where
        S: Service<RunRequest, Response = AgentRun, Error = AgentError>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        let served = match &self.runtime {
            Some(runtime) => {
                BoxCloneSyncService::new(runtime.layer(MiddlewareStack::new()).layer(agent))
            }
            None => BoxCloneSyncService::new(agent),
        };
        self.agents.insert(name.into(), served);
        self
    }

    /// Serves every agent of `agents`, by name.
    pub fn agents<I, N, S>(self, agents: I) -> Self
    where
        I: IntoIterator<Item = (N, S)>,
        N: Into<String>,
        S: Service<RunRequest, Response = AgentRun, Error = AgentError>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        agents
            .into_iter()
            .fold(self, |server, (name, agent)| server.agent(name, agent))
    }

    /// The agent `/v1/chat/completions` runs when `model` names none (by
    /// default the only agent, when there is one).
    pub fn default_agent(mut self, name: impl Into<String>) -> Self {
        self.default_agent = Some(name.into());
        self
    }

    /// Where paused runs wait (default: in memory).
    pub fn checkpoints(mut self, store: impl CheckpointStore) -> Self {
        self.store = Arc::new(store);
        self
    }

    /// How many runs are going.
    pub fn runs_in_flight(&self) -> usize {
        self.runs.in_flight()
    }

    /// The routes, as an axum [`Router`] (a tower service).
    pub fn router(&self) -> Router {
        let shared: Shared = Arc::new(Inner {
            agents: self.agents.clone(),
            default_agent: self.default_agent.clone(),
            store: self.store.clone(),
            runs: self.runs.clone(),
        });
        Router::new()
            .route("/", get(viewer::page))
            .route("/v1/agents", get(viewer::agents))
            .route("/v1/agents/{name}/runs", post(routes::create_run))
            .route("/v1/runs/{id}", get(routes::get_run))
            .route("/v1/runs/{id}/resume", post(routes::resume_run))
            .route("/v1/chat/completions", post(openai::chat_completions))
            .with_state(shared)
    }

    /// Serves `app` (this server's [`router`](Self::router), with any layers)
    /// on `listener` until `shutdown` completes; then it takes no new
    /// connections, lets running runs finish for up to `grace`, cancels the
    /// ones still going (they end `CANCELLED`, their events balanced) and
    /// returns once their answers went out.
    ///
    /// # Errors
    ///
    /// What accepting connections fails with.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        app: Router,
        shutdown: impl Future<Output = ()> + Send + 'static,
        grace: Duration,
    ) -> std::io::Result<()> {
        let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
        let signal = async move {
            shutdown.await;
            let _ = stopping_tx.send(());
        };
        let runs = self.runs.clone();
        let server = axum::serve(listener, app).with_graceful_shutdown(signal);
        let deadline = async move {
            if stopping_rx.await.is_err() {
                return std::future::pending().await;
            }
            tokio::time::sleep(grace).await;
            runs.cancel_all();
            std::future::pending::<()>().await
        };
        tokio::select! {
            result = server.into_future() => result,
            () = deadline => Ok(()),
        }
    }
}

impl fmt::Debug for AgentServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut agents: Vec<&String> = self.agents.keys().collect();
        agents.sort();
        f.debug_struct("AgentServer")
            .field("agents", &agents)
            .field("default_agent", &self.default_agent)
            .finish_non_exhaustive()
    }
}
