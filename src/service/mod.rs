//! The services: the [`Agent`] run loop, tools and the [`ToolRouter`],
//! [`AgentTool`] for nested agents, and the [`ScriptedModel`].
//!
//! A *model* is any `Service<ModelCall, Response = ModelResponse>` whose
//! error is `Into<BoxError>`; a *tool* is any
//! `Service<ToolInvocation, Response = ToolOutput>`. Compose layers around
//! them with `ServiceBuilder`, then hand them to the [`Agent`] builder, which
//! keeps them type-erased as [`BoxModel`] and [`BoxTool`].

mod agent;
mod agent_tool;
#[cfg(feature = "openai")]
pub mod anthropic;
#[cfg(feature = "openai")]
pub mod openai;
mod router;
mod scripted;
mod tool_fn;

pub use agent::{Agent, AgentBuilder, AgentFuture, Approver};
pub use agent::{AgentExt, RunFuture};
pub use agent_tool::AgentTool;
#[cfg(feature = "openai")]
pub use anthropic::AnthropicMessages;
#[cfg(feature = "openai")]
pub use openai::OpenAiChat;
pub use router::{ToolDef, ToolRouter};
pub use scripted::{ScriptedModel, ScriptedTurn};
pub use tool_fn::{tool_fn, tool_fn_ctx, tool_sync, FnTool};

use tower::util::BoxCloneSyncService;

use crate::error::BoxError;
use crate::request::{ModelCall, RunRequest, ToolInvocation, ToolOutput};
use crate::types::{AgentRun, ModelResponse};

/// A type-erased, cloneable, `Sync` model service.
pub type BoxModel = BoxCloneSyncService<ModelCall, ModelResponse, BoxError>;

/// A type-erased, cloneable, `Sync` tool service.
pub type BoxTool = BoxCloneSyncService<ToolInvocation, ToolOutput, BoxError>;

/// A type-erased, cloneable, `Sync` run service (an agent, layered or not).
pub type BoxAgent = BoxCloneSyncService<RunRequest, AgentRun, BoxError>;

/// Erases a model service's type.
pub fn box_model<S>(service: S) -> BoxModel
where
    S: tower::Service<ModelCall, Response = ModelResponse> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    use tower::ServiceExt;
    BoxCloneSyncService::new(service.map_err(Into::into))
}

/// Erases a tool service's type.
pub fn box_tool<S>(service: S) -> BoxTool
where
    S: tower::Service<ToolInvocation, Response = ToolOutput> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    use tower::ServiceExt;
    BoxCloneSyncService::new(service.map_err(Into::into))
}
