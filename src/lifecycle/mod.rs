//! The lifecycle adapter: [`Middleware`] (every hook of a run, lifecycle
//! and wrap), the [`MiddlewareStack`] that orders them, the
//! [`LifecycleLayer`] that brackets a run, tripwires, tool verdicts and
//! approvals.
//!
//! A [`Middleware`] is one object with one name. Its hooks observe and
//! change values at fixed points of a run (`before_agent` … `after_agent`)
//! and surround each model or tool call (`wrap_model`, `wrap_tool`, with a
//! [`Next`] they may call 0..N times: proceed, short-circuit, retry, fall
//! back). Every hook has a no-op default; override the ones you need and
//! nothing else: the stack learns which hooks a middleware leaves alone and
//! skips them at no cost, and runs every one it overrides, in every build.
//! Values a hook may change are passed `&mut`; where it decides it returns
//! a typed value (a [`ToolVerdict`](crate::hooks::ToolVerdict), an
//! approval, a continuation).
//!
//! Three ways to write one, one registration each:
//!
//! - closures on the stack, for one hook and no lifetimes:
//!   [`MiddlewareStack::before_model`], `before_run`, `after_model`,
//!   `before_tool` (a verdict), `after_tool`, `after_agent`, `on_error`, and
//!   an async form of each (`before_run_async`, `before_model_async`, …,
//!   `on_error_async`);
//! - a type implementing [`Middleware`], pushed with
//!   [`push`](MiddlewareStack::push);
//! - a wrap-only [`ModelMiddleware`] / [`ToolMiddleware`] or a [`from_fn`]
//!   closure, pushed with [`push_model`](MiddlewareStack::push_model) /
//!   [`push_tool`](MiddlewareStack::push_tool).
//!
//! The stack knows a closure's or a wrap-only middleware's hook points from
//! how it was registered; a type's it learns as the hooks answer. A delta
//! hook (`on_model_delta`, `on_tool_delta`) is learned only from a delta, so
//! until a tool streams, each tool call under a type that may override
//! `on_tool_delta` carries a guard for it. A model or tool call with nothing
//! of the hooks around it (no wrap hook, no `after_model`, no delta hook
//! that applies) is made as a run without hooks makes it.
//!
//! The stack runs in every run of an agent built with
//! [`AgentBuilder::middleware`](crate::AgentBuilder::middleware) (the agent
//! keeps `run`), or of any run service wrapped in a [`LifecycleLayer`].
//!
//! # Two depths for wrap middleware
//!
//! A wrap middleware on the stack is one of the run's hooks: it sees every
//! model (or tool) call of the run *and of the runs nested in it*
//! (sub-agents), in its place in the onion, and each invocation is
//! bracketed by `MiddlewareStarted`/`MiddlewareCompleted` events. The same
//! middleware as a plain tower layer ([`WrapModelLayer`], [`WrapToolLayer`],
//! [`from_fn`] in a `ServiceBuilder`) sees only the calls of the service it
//! wraps.
//!
//! ```
//! use serde::Deserialize;
//! use tower_agent::lifecycle::{
//!     from_fn, HookPoint, LoggingMiddleware, MiddlewareStack, ModelNext,
//! };
//! use tower_agent::{
//!     tool_sync, tripwire, Agent, AgentError, BoxError, ModelCall, ScriptedModel, ScriptedTurn,
//!     ToolRouter,
//! };
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
//!     // The input guard: refunds go to a person.
//!     .before_run("refund-guard", |_ctx, input| {
//!         if input.text().to_lowercase().contains("refund") {
//!             return Err(tripwire("refunds go to a person").into());
//!         }
//!         Ok(())
//!     })
//!     // Around each model call: always at temperature 0.
//!     .push_model(
//!         from_fn(|mut call: ModelCall, next: ModelNext| async move {
//!             call.request.settings_mut().temperature = Some(0.0);
//!             next.run(call).await
//!         })
//!         .name("deterministic"),
//!     );
//!
//! let model = ScriptedModel::new([
//!     ScriptedTurn::tool_call("order_status", r#"{"id": "A-1"}"#),
//!     ScriptedTurn::text("Order A-1 has shipped."),
//! ]);
//! let tools = ToolRouter::new().tool(tool_sync("order_status", "Where an order is", |o: Order| {
//!     Ok::<_, BoxError>(format!("order {} shipped", o.id))
//! }));
//! let support = Agent::builder("support")
//!     .model(model.clone())
//!     .tools(tools)
//!     .middleware(stack)
//!     .build()?;
//!
//! let run = support.run("Where is A-1?").await?;
//! assert_eq!(run.output, "Order A-1 has shipped.");
//! assert!(model.requests().iter().all(|r| r.settings.temperature == Some(0.0)));
//! assert_eq!(logging.counts().get(HookPoint::AfterTool), 1);
//!
//! let err = support.run("I want a refund").await.unwrap_err();
//! assert_eq!(err.code(), "GUARDRAIL_TRIPPED");
//! assert!(matches!(err, AgentError::Tripwire { middleware, hook, .. }
//!     if middleware == "refund-guard" && hook == "before_run"));
//! # Ok(())
//! # }
//! ```
//!
//! The same stack in a [`LifecycleLayer`] brackets any run service:
//! `ServiceBuilder::new().layer(LifecycleLayer::new(stack)).service(agent)`.
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
//! [`LifecycleLayer`] or `AgentBuilder::middleware`) ▸ the run's ([`RunMiddleware`]) ▸ built-ins nearest
//! the model. See [`ordering`] for the picture, and for how the hook names
//! of other agent frameworks map onto these.
//!
//! # Events and errors
//!
//! Every hook invocation that does not [`skip`](Hook::skip) (nor is left
//! at its default) is bracketed by
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
//! Below a tool wrap hook of a stack, the tool's own failure comes back from
//! `next.run` as the error result the model would read, a panic too: by
//! default it reads only that the tool failed, the message going to the
//! `ToolCallCompleted` event (see
//! [`AgentBuilder::show_tool_panics`](crate::AgentBuilder::show_tool_panics)).
//! Below a wrap middleware made a tower layer ([`WrapToolLayer`],
//! [`from_fn`] over a tool service) it is an `Err`; a panic, a
//! [`ToolPanicked`](crate::error::ToolPanicked).
//!
//! # Tool verdicts and approvals
//!
//! Of several `before_tool` verdicts, deny > defer > ask > allow >
//! ask-unless-allowed > continue
//! ([`merge_verdicts`]); each middleware sees the arguments the ones before
//! it rewrote, and the last rewrite counts. A call that asks is decided by
//! the `decide_approval` hooks, then the agent's approver; if nobody decides
//! it is declined. A deferred call pauses the run into a serializable
//! checkpoint; `RunRequest::resume(checkpoint, decisions)` continues it,
//! asking `before_tool` again with `resumed == true`. A decision with an
//! `always` scope stands for the later calls it covers: they are approved
//! without asking, and the checkpoint carries it
//! ([`StickyApprovals`](crate::hooks::StickyApprovals)). Every decision is
//! logged as a `ToolDecision` event naming who decided. The built-in
//! [`ToolPolicyMiddleware`](builtin::policy::ToolPolicyMiddleware) decides
//! by rules and a permission mode on this machinery.

mod attribute;
pub mod builtin;
mod call_chain;
mod call_hook;
mod chain_run;
mod closures;
pub(crate) mod edit_watch;
mod from_fn;
mod hook_point;
mod inline_bytes;
mod installed;
mod layer;
mod logging;
mod middleware;
mod next;
mod placement;
mod runtime;
mod stack;
mod stack_hooks;
mod tool_snapshot;
mod verdict;
mod wrap;
mod wrap_layer;

#[doc = include_str!("../../docs/ordering.md")]
pub mod ordering {}

pub use crate::hooks::AgentMiddleware;
pub use from_fn::{from_fn, FromFn, FromFnLayer};
pub use hook_point::HookPoint;
pub use layer::{Lifecycle, LifecycleFuture, LifecycleLayer, ResponseFuture};
pub use logging::{HookCounts, LoggingMiddleware};
pub use middleware::{FailPolicy, Hook, Middleware};
pub use next::Next;
pub use runtime::{RunMiddleware, RunRequestExt, Runtime};
pub use stack::MiddlewareStack;
pub use verdict::{decision_rank, merge_verdicts};
pub use wrap::{ModelMiddleware, ModelNext, ToolMiddleware, ToolNext, WrapRequest, Wrapped};
pub use wrap_layer::{WrapModel, WrapModelLayer, WrapTool, WrapToolLayer};
