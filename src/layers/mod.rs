//! The wrap layers: each a `tower::Layer` over a model service or a tool
//! stack, composed with `ServiceBuilder`.
//!
//! | layer | module | stacks | what it does |
//! | --- | --- | --- | --- |
//! | [`LlmRetryLayer`](retry::LlmRetryLayer) | [`retry`] | model, tool | retries provider trouble with backoff, `Retry-After` and a shared budget; replay-safe |
//! | [`CallTimeoutLayer`](timeout::CallTimeoutLayer) | [`timeout`] | model, tool | a per-call timeout, bounded by the run's deadline; ends on cancellation |
//! | [`FallbackLayer`](fallback::FallbackLayer) | [`fallback`] | model | moves to the next model or provider on provider errors |
//! | [`CacheLayer`](cache::CacheLayer) | [`cache`] | model | answers identical calls from a store, at no usage |
//! | [`ModelRateLimitLayer`](rate_limit::ModelRateLimitLayer) | [`rate_limit`] | model | requests and tokens per interval per model key, one quota shared by every clone |
//! | [`MaskPiiLayer`](pii::MaskPiiLayer) | [`pii`] | model | masks PII in what the model reads, restores it in what it writes, streamed or not |
//!
//! The order we recommend, outermost first (a cache hit then never
//! spends rate-limit capacity, and a retried call asks the limiter again):
//!
//! ```text
//! ModelCall ─► retry ▸ timeout ▸ fallback ▸ cache ▸ rate-limit ▸ pii ─► model service
//! ToolInvocation ─► timeout ▸ retry ▸ … ─► ToolRouter
//! ```
//!
//! [`ServiceBuilderExt`] adds a shortcut for each (`.llm_retry(..)`,
//! `.call_timeout(..)`, `.fallback_models(..)`, `.response_cache(..)`,
//! `.model_rate_limit(..)`, …).
//!
//! Each layer is its own builder, as tower-http's are: `new()` has the
//! defaults a user would pick, and consuming setters without `set_` or
//! `with_` change one thing each and cannot fail. What can be wrong (a rate
//! limit of zero) is checked once, when the layer builds its service, and
//! fails with a typed error. Every service has `get_ref`, `get_mut` and
//! `into_inner`. The names keep clear of tower's own (`CallTimeoutLayer`,
//! not `TimeoutLayer`; `LlmRetryLayer`, not `RetryLayer`), so both import
//! side by side.
//!
//! tower's own layers (`TimeoutLayer`, `ConcurrencyLimitLayer`,
//! `LoadShedLayer`, `BufferLayer`, …) compose into the same stacks unchanged;
//! the run classifies their errors (see [`crate::error`]).
//!
//! Layers that only need the run (its deadline, cancellation, events, ledger)
//! are generic over [`HasContext`](crate::request::HasContext); those that may
//! send a request twice over [`RetryRequest`](retry::RetryRequest).
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_agent::layers::{fallback::FallbackLayer, retry::{LlmRetryLayer, RetryBudget}, timeout::CallTimeoutLayer};
//! use tower_agent::{Agent, ScriptedModel, ScriptedTurn};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_agent::AgentError> {
//! let budget = RetryBudget::default();
//! let model = ServiceBuilder::new()
//!     .layer(LlmRetryLayer::new().budget(budget.clone()))
//!     .layer(CallTimeoutLayer::new(Duration::from_secs(30)))
//!     .layer(FallbackLayer::new().models(["small"]).budget(budget))
//!     .service(ScriptedModel::new([ScriptedTurn::text("Hello!")]));
//! let agent = Agent::builder("assistant").model(model).build()?;
//! assert_eq!(agent.run("Hi").await?.output, "Hello!");
//! # Ok(()) }
//! ```

pub mod budget;
mod builder_ext;
pub mod cache;
pub mod circuit_breaker;
pub mod fallback;
pub mod pii;
pub mod rate_limit;
pub mod retry;
pub mod timeout;

pub use builder_ext::ServiceBuilderExt;
