//! The lifecycle adapter: [`Middleware`] hooks, wrap middleware,
//! [`MiddlewareStack`], the [`LifecycleLayer`] that brackets a run,
//! tripwires, tool verdicts and approvals.
//!
//! Two shapes of middleware:
//!
//! - **Lifecycle middleware** ([`Middleware`]) observes and changes values at
//!   fixed points of a run: `before_agent` … `after_agent`. Every hook has a
//!   no-op default and returns a [`Hook`]; values it may change are passed
//!   `&mut`, and where it decides it returns a typed value (a
//!   [`ToolVerdict`](crate::hooks::ToolVerdict), an approval, a
//!   continuation).
//! - **Wrap middleware** ([`ModelMiddleware`], [`ToolMiddleware`],
//!   [`from_fn`]) surrounds each model or tool call with a [`Next`] it may call
//!   0..N times: proceed, short-circuit, retry, fall back. Each is also a
//!   tower `Layer` ([`WrapModelLayer`], [`WrapToolLayer`], [`FromFnLayer`]).
//!
//! A [`MiddlewareStack`] holds both, in registration order, and a
//! [`LifecycleLayer`] runs it around every run of the service it wraps.
//!
//! ```
//! use futures::future::BoxFuture;
//! use serde::Deserialize;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_agent::lifecycle::{
//!     Hook, HookSet, LifecycleLayer, LoggingMiddleware, Middleware, MiddlewareStack,
//!     ModelMiddleware, ModelNext,
//! };
//! use tower_agent::types::{Message, ModelResponse};
//! use tower_agent::{
//!     tool_sync, tripwire, Agent, AgentError, BoxError, ModelCall, RunContext, RunRequest,
//!     ScriptedModel, ScriptedTurn, ToolRouter,
//! };
//!
//! /// The input guard: refunds go to a person.
//! struct RefundGuard;
//!
//! impl Middleware for RefundGuard {
//!     fn name(&self) -> &str {
//!         "refund-guard"
//!     }
//!
//!     fn hooks(&self) -> HookSet {
//!         HookSet::BEFORE_RUN
//!     }
//!
//!     fn before_run<'a>(
//!         &'a self,
//!         _ctx: &'a RunContext,
//!         input: &'a mut Message,
//!         _messages: &'a [Message],
//!     ) -> Hook<'a, Option<String>> {
//!         if input.text().to_lowercase().contains("refund") {
//!             return Hook::err(tripwire("refunds go to a person"));
//!         }
//!         Hook::ok(None)
//!     }
//! }
//!
//! /// Around each model call: always at temperature 0.
//! struct Deterministic;
//!
//! impl ModelMiddleware for Deterministic {
//!     fn name(&self) -> &str {
//!         "deterministic"
//!     }
//!
//!     fn wrap_model<'a>(
//!         &'a self,
//!         mut call: ModelCall,
//!         next: ModelNext,
//!     ) -> BoxFuture<'a, Result<ModelResponse, BoxError>> {
//!         call.request.settings.temperature = Some(0.0);
//!         Box::pin(next.run(call))
//!     }
//! }
//!
//! #[derive(Deserialize, schemars::JsonSchema)]
//! struct Order {
//!     id: String,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), AgentError> {
//! let logging = LoggingMiddleware::new();
//! let stack = MiddlewareStack::new()
//!     .push(logging.clone())
//!     .push(RefundGuard)
//!     .push_model(Deterministic);
//!
//! let model = ScriptedModel::new([
//!     ScriptedTurn::tool_call("order_status", r#"{"id": "A-1"}"#),
//!     ScriptedTurn::text("Order A-1 has shipped."),
//! ]);
//! let tools = ToolRouter::new().tool(tool_sync("order_status", "Where an order is", |o: Order| {
//!     Ok::<_, BoxError>(format!("order {} shipped", o.id))
//! }));
//! let agent = Agent::builder("support").model(model.clone()).tools(tools).build()?;
//! let support = ServiceBuilder::new()
//!     .layer(LifecycleLayer::new(stack))
//!     .service(agent);
//!
//! let run = support.clone().oneshot(RunRequest::new("Where is A-1?")).await?;
//! assert_eq!(run.output, "Order A-1 has shipped.");
//! assert!(model.requests().iter().all(|r| r.settings.temperature == Some(0.0)));
//! assert_eq!(logging.counts().get(tower_agent::lifecycle::HookPoint::AfterTool), 1);
//!
//! let err = support.oneshot(RunRequest::new("I want a refund")).await.unwrap_err();
//! assert_eq!(err.code(), "GUARDRAIL_TRIPPED");
//! assert!(matches!(err, AgentError::Tripwire { middleware, hook, .. }
//!     if middleware == "refund-guard" && hook == "before_run"));
//! # Ok(())
//! # }
//! ```
//!
//! # The hook points
//!
//! | hook | when | what it may do |
//! | --- | --- | --- |
//! | `before_agent` | a run starts, new or resumed, before anything else | add context after the system prompt, for this run only |
//! | `before_run` | a new run's input, before any model call | guard it; add context after it, kept in the transcript |
//! | `before_model` | before each model turn | change the messages from then on (checked for history integrity) |
//! | `wrap_model` | around each model call | change the call, call `next` 0..N times, answer without it |
//! | `on_model_delta` | each streamed delta | change it; `Err` cuts the stream. No events |
//! | `after_model` | each answer, before the run uses it | replace its content or tool calls (none: final answer) |
//! | `before_tool` | before each tool call is decided, again on resume | a [`ToolVerdict`](crate::hooks::ToolVerdict), new arguments |
//! | `decide_approval` | a call asks for approval | approve or decline it, before the agent's approver |
//! | `wrap_tool` | around each tool call that passed approval | change the arguments (the approval is withdrawn), answer for the tool |
//! | `on_tool_delta` | each delta a tool streams | change it; `Err` aborts the call. No events |
//! | `after_tool` | after each tool call | replace the result |
//! | `after_tool_batch` | every call of a step has its result | `add_context`, `stop` |
//! | `before_stop` | the agent would stop with a final answer | `continue_with` a message |
//! | `before_compaction` / `after_compaction` | around a compaction (by a middleware or a layer) | skip it / react |
//! | `before_model_switch` | the run would move to another model | block it |
//! | `on_notification` | a person should know something | nothing: observe |
//! | `on_error` | the run failed | observe; its errors are ignored |
//! | `after_agent` | the run ended: completed, stopped, paused or failed | clean up; its errors are logged |
//!
//! # Order
//!
//! The onion: `before_*` hooks run in registration order, `after_*` hooks,
//! the delta hooks and `on_error` in reverse; the first wrap middleware is
//! the outermost. Placement levels nest the same way: the hooks a run
//! inherited (its parent run's) ▸ the [`Runtime`]'s ▸ the agent's (its
//! [`LifecycleLayer`]) ▸ the run's ([`RunMiddleware`]) ▸ built-ins nearest
//! the model. See [`ordering`] for the picture.
//!
//! # Events and errors
//!
//! Every hook invocation that does not [`skip`](Hook::skip) is bracketed by
//! `MiddlewareStarted` / `MiddlewareCompleted` events (outcome `ok`, `error`
//! or `panic`), always balanced; the delta hooks emit none. The first `Err`
//! short-circuits: the run fails, every middleware's `on_error` runs (their
//! own errors ignored), then every `after_agent`, and the caller gets the
//! original error. A hook's unclassified error becomes
//! [`AgentError::Middleware`](crate::AgentError::Middleware), a panic too;
//! a [`tripwire`](crate::tripwire) becomes
//! [`AgentError::Tripwire`](crate::AgentError::Tripwire) naming the
//! middleware and the hook, also from a nested agent run; errors the run
//! knows (a provider's, a cancellation) stay as they are. A
//! [`FailPolicy::Open`] middleware's errors are logged instead.
//!
//! # Tool verdicts and approvals
//!
//! Of several `before_tool` verdicts, deny > defer > ask > allow > continue
//! ([`merge_verdicts`]); each middleware sees the arguments the ones before
//! it rewrote, and the last rewrite counts. A call that asks is decided by
//! the `decide_approval` hooks, then the agent's approver; if nobody decides
//! it is declined. A deferred call pauses the run into a serializable
//! checkpoint; `RunRequest::resume(checkpoint, decisions)` continues it,
//! asking `before_tool` again with `resumed == true`. Every decision is
//! logged as a `ToolDecision` event naming who decided.

pub mod builtin;
mod call_chain;
mod call_hook;
mod closures;
pub(crate) mod edit_watch;
mod from_fn;
mod hook_point;
mod installed;
mod layer;
mod logging;
mod middleware;
mod next;
mod runtime;
mod stack;
mod stack_hooks;
mod verdict;
mod wrap;
mod wrap_layer;

#[doc = include_str!("../../docs/ordering.md")]
pub mod ordering {}

pub use crate::hooks::AgentMiddleware;
pub use from_fn::{from_fn, FromFn, FromFnLayer};
pub use hook_point::HookPoint;
pub use layer::{Lifecycle, LifecycleLayer, ResponseFuture};
pub use logging::{HookCounts, LoggingMiddleware};
pub use middleware::{FailPolicy, Hook, Middleware};
pub use next::Next;
pub use runtime::{RunMiddleware, RunRequestExt, Runtime};
pub use stack::MiddlewareStack;
pub use verdict::{decision_rank, merge_verdicts};
pub use wrap::{ModelMiddleware, ModelNext, ToolMiddleware, ToolNext, WrapRequest, Wrapped};
pub use wrap_layer::{WrapModel, WrapModelLayer, WrapTool, WrapToolLayer};
