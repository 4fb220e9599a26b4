//! Built-in middleware: message trimming (by messages, text or tokens),
//! context compaction (for the thread or one request, summarized by a model
//! or not), clearing old tool outputs with a recall tool, a dynamic system
//! prompt, a prompt-cache guard, usage accounting, call limits ([`limits`]),
//! the tool policy ([`policy`]), per-turn tool selection
//! ([`tool_selection`]) and memory across runs ([`memory`]).
//!
//! Place built-ins nearest the model with
//! [`LifecycleLayer::builtins`](crate::LifecycleLayer::builtins), or anywhere
//! in a stack like any middleware.
//!
//! ```
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_agent::lifecycle::builtin::{
//!     ContextCompressionMiddleware, MessageTrimMiddleware, PromptCacheGuardMiddleware,
//!     SummarizationPolicy, TrimStrategy, UsageAccountingMiddleware,
//! };
//! use tower_agent::lifecycle::{LifecycleLayer, MiddlewareStack};
//! use tower_agent::{Agent, RunRequest, ScriptedModel, ScriptedTurn};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::AgentError> {
//! let accounting = UsageAccountingMiddleware::new();
//! let guard = PromptCacheGuardMiddleware::new();
//! let builtins = MiddlewareStack::new()
//!     .push(ContextCompressionMiddleware::new(SummarizationPolicy::new(16_000)))
//!     .push(accounting.clone())
//!     .push_model(MessageTrimMiddleware::new(TrimStrategy::LastMessages(40)))
//!     .push_model(guard.clone());
//!
//! let agent = ServiceBuilder::new()
//!     .layer(LifecycleLayer::new(MiddlewareStack::new()).builtins(builtins))
//!     .service(Agent::builder("a").model(ScriptedModel::new([ScriptedTurn::text("hi")])).build()?);
//! agent.oneshot(RunRequest::new("hello")).await?;
//! assert_eq!(accounting.totals().responses, 1);
//! assert!(guard.events().is_empty());
//! # Ok(()) }
//! ```

mod cache_guard;
mod clear_tool_outputs;
mod compression;
#[cfg(feature = "guards")]
pub mod guards;
pub mod limits;
pub mod memory;
pub mod policy;
mod side_call;
mod summarizer;
mod system_prompt;
pub mod tool_selection;
mod trim;
mod usage;
mod view;

pub use cache_guard::{CacheLayoutEvent, PromptCacheGuardMiddleware};
pub use clear_tool_outputs::{ClearToolOutputsMiddleware, RECALL_TOOL};
pub use compression::{
    CompactionScope, CompactionTrigger, ContextCompressionMiddleware, SummarizationPolicy,
    SummaryRecord,
};
pub use memory::{
    parse_memories, Extracted, ExtractionRequest, MemoryExtractor, MemoryMiddleware,
    MemoryNamespace, ModelExtractor, ThreadCompaction,
};
pub use summarizer::{ConcatSummarizer, ModelSummarizer, Summarizer, SUMMARY_PROMPT};
pub use system_prompt::DynamicSystemPromptMiddleware;
pub use trim::{trim_messages, MessageTrimMiddleware, TrimStrategy};
pub use usage::{UsageAccountingMiddleware, UsageTotals};
