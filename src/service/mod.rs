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
pub mod http;
#[cfg(feature = "openai")]
pub mod openai;
mod router;
mod scripted;
mod tool_fn;

pub use agent::{definition, handle, handoff};
pub use agent::{Agent, AgentBuilder, AgentFuture, Approver};
pub use agent::{AgentDefinition, DefinitionError, HandoffDefinition, Registry};
pub use agent::{AgentExt, RunFuture};
pub use agent::{Finished, Handoff, HandoffInput, LateMessages, RunHandle, RunSender, Unsent};
pub use agent_tool::AgentTool;
#[cfg(feature = "openai")]
pub use anthropic::AnthropicMessages;
#[cfg(feature = "openai")]
pub use openai::OpenAiChat;
pub use router::{RouterFuture, RunTools, ToolDef, ToolRouter, ToolSource, ToolTraits};
pub use scripted::{ScriptedFuture, ScriptedModel, ScriptedTurn};
pub use tool_fn::{tool_fn, tool_fn_ctx, tool_sync, FnTool};

pub use crate::request::{box_model, box_tool, BoxAgent, BoxModel, BoxTool};
