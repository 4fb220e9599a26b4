//! What a typical program imports, in one line: `use tower_agent::prelude::*;`.
//!
//! The agent and its verbs ([`AgentExt`] gives a layered agent `run` and
//! `run_with`), tools, the embedded [`ScriptedModel`], the request and
//! result types, errors and tripwires, the lifecycle middleware and the wrap
//! layers with their [`ServiceBuilderExt`] shortcuts, and the tower items
//! every stack uses ([`ServiceBuilder`], [`Layer`], [`Service`],
//! [`ServiceExt`]).
//!
//! ```
//! use std::time::Duration;
//! use tower_agent::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), AgentError> {
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Order { id: String }
//!
//! let model = ServiceBuilder::new()
//!     .call_timeout(Duration::from_secs(30))
//!     .service(ScriptedModel::new([
//!         ScriptedTurn::tool_call("order_status", r#"{"id": "A-1"}"#),
//!         ScriptedTurn::text("Order A-1 has shipped."),
//!     ]));
//! let agent = Agent::builder("support")
//!     .model(model)
//!     .tool(tool_sync("order_status", "Where an order is", |o: Order| {
//!         Ok::<_, BoxError>(format!("order {} shipped", o.id))
//!     }))
//!     .build()?;
//! let agent = LifecycleLayer::new(MiddlewareStack::new()).layer(agent);
//! assert_eq!(agent.run("Where is A-1?").await?.output, "Order A-1 has shipped.");
//! # Ok(()) }
//! ```

pub use tower::{Layer, Service, ServiceBuilder, ServiceExt};

pub use crate::context::RunContext;
pub use crate::error::{tripwire, tripwire_with, AgentError, BoxError, ErrorKind};
pub use crate::event::{AgentEvent, CollectingSink};
pub use crate::hooks::{ToolDecision, ToolVerdict};
pub use crate::layers::cache::CacheLayer;
pub use crate::layers::fallback::FallbackLayer;
pub use crate::layers::pii::MaskPiiLayer;
pub use crate::layers::rate_limit::ModelRateLimitLayer;
pub use crate::layers::retry::{LlmRetryLayer, RetryPolicy};
pub use crate::layers::timeout::CallTimeoutLayer;
pub use crate::layers::ServiceBuilderExt;
pub use crate::lifecycle::{
    from_fn, Hook, LifecycleLayer, Middleware, MiddlewareStack, ModelMiddleware, Runtime,
    ToolMiddleware,
};
pub use crate::request::{DeltaSink, ModelCall, RunRequest, ToolInvocation, ToolOutput};
pub use crate::service::{
    tool_fn, tool_fn_ctx, tool_sync, Agent, AgentExt, AgentTool, Handoff, RunHandle, ScriptedModel,
    ScriptedTurn, ToolDef, ToolRouter,
};
#[cfg(feature = "openai")]
pub use crate::service::{AnthropicMessages, OpenAiChat};
pub use crate::types::{AgentRun, History, Message, Role, RunStatus, ToolCall, Usage};
