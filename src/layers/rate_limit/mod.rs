//! A token-aware rate limit for model calls: requests per interval AND
//! tokens per interval, per model key, one quota shared by every clone and
//! every agent that uses the layer.
//!
//! tower's own `RateLimit` keeps its state in each service instance and is
//! not `Clone`, so an agent (which clones its model service for every call)
//! would get a fresh quota each time. Here the quota lives in an `Arc` that
//! the layer, every service it builds and all their clones share.
//!
//! ```
//! use std::time::Duration;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_agent::error::{kind_of, retry_after};
//! use tower_agent::layers::rate_limit::ModelRateLimitLayer;
//! use tower_agent::types::{Message, ModelRequest};
//! use tower_agent::{ErrorKind, ModelCall, RunContext, ScriptedModel, ScriptedTurn};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_agent::AgentError> {
//! let limit = ModelRateLimitLayer::new()
//!     .requests(1, Duration::from_secs(60))
//!     .tokens(40_000, Duration::from_secs(60))
//!     .max_wait(Duration::from_secs(5));
//! limit.validate()?; // optional: the first service built checks it too
//!
//! // Two model stacks (say, two agents) on one quota.
//! let model = ScriptedModel::from_fn(|_| ScriptedTurn::text("ok"));
//! let mut first = ServiceBuilder::new().layer(limit.clone()).service(model.clone());
//! let mut second = ServiceBuilder::new().layer(limit).service(model);
//!
//! let call = || ModelCall::new(ModelRequest::new("gpt-4o", vec![Message::user("hi")]), RunContext::new());
//! first.ready().await.unwrap().call(call()).await.unwrap();
//!
//! // The minute's one request is spent; waiting 60 s is more than `max_wait`.
//! let err = second.ready().await.unwrap().call(call()).await.unwrap_err();
//! assert_eq!(kind_of(err.as_ref()), ErrorKind::RateLimited);
//! assert_eq!(retry_after(err.as_ref()), Some(Duration::from_secs(60)));
//! # Ok(()) }
//! ```
//!
//! # The quota
//!
//! Each key (by default the request's model name; see
//! [`key_fn`](ModelRateLimitLayer::key_fn) and [`key`](ModelRateLimitLayer::key))
//! has a request bucket and a token bucket. A bucket holds up to `amount`
//! and refills continuously at `amount` per `per`: a full bucket allows a
//! burst of `amount`, then one unit every `per / amount`. Keys without
//! limits of their own ([`limits_for`](ModelRateLimitLayer::limits_for)) get
//! the default limits.
//!
//! # Configuration
//!
//! [`ModelRateLimitLayer`] is its own builder: [`new`](ModelRateLimitLayer::new)
//! sets no limit, a `max_wait` of 30 s and keys by model, and each setter
//! changes one thing and cannot fail. The limits are checked once, when the
//! layer builds its first service: a zero amount or interval fails every
//! call of that service with [`AgentError::Config`](crate::AgentError::Config)
//! (`INVALID_CONFIG`). Call [`validate`](ModelRateLimitLayer::validate) to
//! find out at start-up instead.
//!
//! # Keys
//!
//! A key's state is made on its first call, with full buckets. Once its
//! buckets have refilled and no call holds or waits for its quota, it is
//! exactly what a fresh key would be; such idle keys are swept when more
//! than [`idle_keys`](ModelRateLimitLayer::idle_keys) (default 1024) have
//! piled up, so a layer keyed per tenant or per user does not grow without
//! bound.
//!
//! # Tokens: reserved, then settled
//!
//! A call reserves its estimated tokens before it goes out: its text at four
//! bytes a token plus `settings.max_tokens` (or
//! [`default_output_tokens`](ModelRateLimitLayer::default_output_tokens)), or
//! what [`estimate`](ModelRateLimitLayer::estimate) says. An estimate above
//! the whole token limit reserves the whole limit. When the response
//! arrives, the difference to `usage.total_tokens()` is charged (the bucket
//! may go below zero, delaying the calls after it) or refunded.
//!
//! A refund gives back only what the bucket can still be missing because of
//! the over-estimate: a call that settles after the bucket would have
//! refilled anyway gets nothing back, so a refund never lets more through
//! than exact estimates would have. A failed call keeps its reservation (the
//! provider may have spent it, and a storm of failures must not overrun the
//! provider's limit). A call dropped before it went out (cancelled while
//! waiting, or a service dropped while holding a slot) gives back what it
//! held; once the inner service was called, the reservation is kept, as the
//! inner service may have sent the request from `call`.
//!
//! # Ample capacity: no lock, no clock
//!
//! While nobody waits for a key, the whole requests and tokens its buckets
//! hold are published where a call takes its share with one atomic
//! compare-and-swap, and settles it the same way when its response
//! arrives: no lock and no clock read. What was taken is charged to the
//! buckets, as of that moment, the next time the key's lock is taken (when
//! the published share runs short, or a call must wait): never more than
//! the buckets would have admitted one call at a time.
//!
//! # Waiting: FIFO, bounded by `max_wait`
//!
//! Each key has one queue. A call is admitted when it is at the head and
//! both buckets hold what it needs; while anyone waits, a newcomer queues
//! behind them even if it would fit, so a small call never slips past a
//! large one that waits for tokens. Only the head sleeps on a timer; a
//! refund or a released reservation wakes it early.
//!
//! A call whose wait, as estimated when it arrives, exceeds
//! [`max_wait`](ModelRateLimitLayer::max_wait) (or the time left to its run's
//! deadline) fails at once with [`RateLimited`]
//! (`RATE_LIMITED`), whose `retry_after` is that estimate; a retry layer
//! outside honours it. Settlements of calls in flight may make the real
//! wait shorter or longer than the estimate. A call that waited emits
//! [`AgentEvent::RateLimitWait`](crate::event::AgentEvent::RateLimitWait).
//!
//! # Readiness
//!
//! The key is read from the request, which `poll_ready` does not see. So:
//!
//! - With a fixed [`key`](ModelRateLimitLayer::key) (a layer bound to one
//!   model), `poll_ready` queues for the call's request slot and stays
//!   `Pending` until it holds it: real backpressure, as `tower::limit`
//!   gives. `call` then reserves the tokens (it needs the request to
//!   estimate them); callers that already hold a slot queue for tokens
//!   ahead of those still waiting for a slot (who all arrived later).
//! - Otherwise `poll_ready` only forwards the inner service's readiness, and
//!   `call` queues for the request slot and the tokens of the call's key
//!   together; the response future waits.
//!
//! Either way the place in the queue is taken in arrival order, before any
//! waiting. A refusal is returned from the response future, never from
//! `poll_ready` (a `Buffer` in front would treat a `poll_ready` error as
//! fatal).
//!
//! # Clone
//!
//! A clone shares the quota but not a reservation its original made in
//! `poll_ready`: it reserves for itself when polled. A call admitted at once
//! calls the inner service from `call`, as tower's own middleware do; a
//! call that waits takes the ready inner service into its response future
//! (`mem::replace`, leaving a clone behind), so the service is ready to be
//! polled again at once.
//!
//! # Order
//!
//! Inside cache (a hit spends nothing) and retry (every attempt asks again),
//! next to the provider. A queued call holds the inner service it was made
//! ready with (`poll_ready` forwards to it first), so a
//! `ConcurrencyLimitLayer` belongs outside this layer: inside, each waiting
//! call would hold a permit.

mod bucket;
mod key;
mod layer;
mod limiter;
mod limits;
mod need;
mod pool;
#[cfg(test)]
mod pool_tests;
mod posts;
mod remote;
mod service;
#[cfg(test)]
mod tests;
mod ticket;

pub mod future;

pub use crate::error::RateLimited;
pub use layer::ModelRateLimitLayer;
pub use limits::{Limits, Rate};
pub use service::ModelRateLimit;
