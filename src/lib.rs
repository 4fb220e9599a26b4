#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_auto_cfg))]

#[macro_use]
mod macros;

mod approvals;

pub mod context;
pub mod error;
pub mod event;
pub mod future;
pub mod hooks;
pub mod layers;
pub mod lifecycle;
pub mod memory;
pub mod pii;
pub mod prelude;
pub mod request;
pub mod service;
pub mod stores;
pub mod tokens;
pub mod types;

#[cfg(feature = "mcp")]
pub mod mcp;
#[cfg(feature = "server")]
pub mod serve;

pub use context::RunContext;
pub use error::{
    tripwire, tripwire_with, AgentError, BoxError, ErrorKind, ProviderError, RateLimited,
};
pub use lifecycle::{
    from_fn, LifecycleLayer, Middleware, MiddlewareStack, ModelMiddleware, Runtime, ToolMiddleware,
};
pub use request::{
    DeltaSink, ModelCall, ModelCallParts, RunInput, RunRequest, ToolInvocation, ToolOutput,
};
pub use service::{
    tool_fn, tool_fn_ctx, tool_sync, Agent, AgentBuilder, AgentExt, AgentTool, BoxAgent, BoxModel,
    BoxTool, FnTool, ScriptedModel, ScriptedTurn, ToolDef, ToolRouter,
};
pub use service::{
    AgentDefinition, Finished, Handoff, HandoffInput, LateMessages, RunHandle, RunSender, Unsent,
};
#[cfg(feature = "openai")]
pub use service::{AnthropicMessages, OpenAiChat};
pub use types::{AgentRun, Message, Usage};
