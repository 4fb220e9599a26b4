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
#[cfg(test)]
mod tests;
mod ticket;

pub mod future;

pub use crate::error::RateLimited;
pub use layer::ModelRateLimitLayer;
pub use limits::{Limits, Rate};

use std::fmt;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower::Service;

use crate::error::BoxError;
use crate::request::ModelCall;
use crate::types::ModelResponse;
use key::{Entered, KeyShared};
use limiter::Limiter;
use ticket::{Arrival, Refused, Settlement, Ticket, Waiter};

/// What `poll_ready` holds for the next call (with a fixed key).
enum Slot {
    Empty,
    Waiting {
        waiter: Waiter,
        since: Instant,
    },
    Reserved {
        ticket: Ticket,
        waited: Duration,
    },
    Refused {
        key: Arc<KeyShared>,
        retry_after: Duration,
    },
}

/// Limits the requests and tokens of model calls. Built by
/// [`ModelRateLimitLayer`]. See the [module docs](self).
pub struct ModelRateLimit<S> {
    inner: S,
    /// The shared quota, or why the layer's limits are invalid.
    limiter: Result<Arc<Limiter>, Arc<str>>,
    slot: Slot,
}

impl<S> ModelRateLimit<S> {
    inner_accessors!(inner: S);
}

impl<S: Clone> Clone for ModelRateLimit<S> {
    /// Shares the quota; starts without the original's reservation.
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            slot: Slot::Empty,
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for ModelRateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let slot = match &self.slot {
            Slot::Empty => "empty",
            Slot::Waiting { .. } => "waiting",
            Slot::Reserved { .. } => "reserved",
            Slot::Refused { .. } => "refused",
        };
        f.debug_struct("ModelRateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.limiter)
            .field("slot", &slot)
            .finish()
    }
}

impl Slot {
    /// With a fixed key: holds a request slot, or a refusal, once ready.
    fn poll_ready(&mut self, limiter: &Limiter, key: &str, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match self {
                Slot::Empty => {
                    let key = limiter.key(key);
                    *self = match key.arrive(1, 0, limiter.max_wait) {
                        Ok(Arrival::Admitted(ticket)) => Slot::Reserved {
                            ticket,
                            waited: Duration::ZERO,
                        },
                        Ok(Arrival::Queued(waiter)) => Slot::Waiting {
                            waiter,
                            since: Instant::now(),
                        },
                        Err(Refused { key, retry_after }) => Slot::Refused { key, retry_after },
                    };
                }
                Slot::Waiting { waiter, since } => {
                    let ticket = ready!(waiter.poll_admitted(cx));
                    let waited = since.elapsed();
                    *self = Slot::Reserved { ticket, waited };
                }
                Slot::Reserved { .. } | Slot::Refused { .. } => return Poll::Ready(()),
            }
        }
    }
}

impl<S> Service<ModelCall> for ModelRateLimit<S>
where
    S: Service<ModelCall, Response = ModelResponse> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = future::ResponseFuture<S>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Invalid limits fail the call (from its future), not readiness.
        let Ok(limiter) = &self.limiter else {
            return self.inner.poll_ready(cx).map_err(Into::into);
        };
        if let (Some(key), None) = (&limiter.fixed_key, &limiter.remote) {
            ready!(self.slot.poll_ready(limiter, key, cx));
            if matches!(self.slot, Slot::Refused { .. }) {
                // `call` answers with the refusal.
                return Poll::Ready(Ok(()));
            }
        }
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, call: ModelCall) -> future::ResponseFuture<S> {
        // An in-memory quota and nothing held from `poll_ready`: the path
        // of most calls, kept apart so it stays short.
        if let (Ok(limiter), Slot::Empty) = (&self.limiter, &self.slot) {
            if limiter.remote.is_none() {
                return match limiter.draw(&call) {
                    // Ample capacity: drawn from the lock-free pool. Call
                    // the service made ready right away.
                    Ok((key, drawn)) => future::ResponseFuture::called(
                        self.inner.call(call),
                        Settlement::drawn(key, drawn),
                    ),
                    Err((key, tokens)) => self.call_locked(call, key, tokens),
                };
            }
        }
        self.call_held(call)
    }
}

impl<S> ModelRateLimit<S>
where
    S: Service<ModelCall, Response = ModelResponse> + Clone,
    S::Error: Into<BoxError>,
{
    /// `call` for a call with a store-backed quota, or holding what
    /// `poll_ready` reserved, or with invalid limits.
    #[inline(never)]
    fn call_held(&mut self, call: ModelCall) -> future::ResponseFuture<S> {
        let limiter = match &self.limiter {
            Ok(limiter) => limiter,
            Err(message) => return future::ResponseFuture::invalid(message.clone()),
        };
        if let Some(remote) = &limiter.remote {
            let (key, limits) = limiter.name_of(&call);
            let tokens = limiter.estimate(&call);
            let mut max_wait = limiter.max_wait;
            if let Some(left) = call.context.remaining() {
                max_wait = max_wait.min(left);
            }
            let wait = remote::RemoteWait::new(remote.clone(), &key, limits, tokens, max_wait);
            let clone = self.inner.clone();
            let inner = std::mem::replace(&mut self.inner, clone);
            return future::ResponseFuture::remote(inner, call, wait);
        }
        let (held, waited) = match &self.slot {
            Slot::Empty => (None, Duration::ZERO),
            _ => match std::mem::replace(&mut self.slot, Slot::Empty) {
                Slot::Refused { key, retry_after } => {
                    let refused = RateLimited::new(key.key(), retry_after);
                    return future::ResponseFuture::refused(refused);
                }
                Slot::Reserved { ticket, waited } => (Some(ticket), waited),
                // Not made ready by `poll_ready`: everything is reserved here.
                Slot::Waiting { .. } | Slot::Empty => (None, Duration::ZERO),
            },
        };
        let key = match &held {
            Some(ticket) => ticket.shared().clone(),
            None => limiter.key_of(&call),
        };
        let tokens = limiter.estimate(&call);
        let mut max_wait = limiter.max_wait.saturating_sub(waited);
        if let Some(left) = call.context.remaining() {
            max_wait = max_wait.min(left);
        }
        let requests = u64::from(held.is_none());
        match key.arrive(requests, tokens, max_wait) {
            // A slot held from `poll_ready` is given back as `held` drops.
            Err(Refused { key, retry_after }) => {
                future::ResponseFuture::refused(RateLimited::new(key.key(), retry_after))
            }
            // Ample capacity and nothing to report: call the service made
            // ready right away.
            Ok(Arrival::Admitted(ticket)) if waited.is_zero() => {
                let ticket = merged(held, ticket);
                future::ResponseFuture::called(self.inner.call(call), ticket.send())
            }
            Ok(arrival) => {
                let (waiter, held) = match arrival {
                    Arrival::Admitted(ticket) => (None, Some(merged(held, ticket))),
                    Arrival::Queued(waiter) => (Some(waiter), held),
                };
                // The response future calls later: it takes the ready
                // service, and leaves a clone to be made ready.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                future::ResponseFuture::waiting(inner, call, waiter, held, waited)
            }
        }
    }

    /// `call` with an in-memory quota and nothing held, when the lock-free
    /// pool could not admit it: reserves `tokens` and the request under
    /// `key`'s lock.
    #[inline(never)]
    fn call_locked(
        &mut self,
        call: ModelCall,
        key: Arc<KeyShared>,
        tokens: u64,
    ) -> future::ResponseFuture<S> {
        let Ok(limiter) = &self.limiter else {
            unreachable!("checked by `call`")
        };
        let max_wait = match call.context.remaining() {
            Some(left) => limiter.max_wait.min(left),
            None => limiter.max_wait,
        };
        match key.enter_call(tokens, max_wait) {
            Ok(Entered::Admitted((_, tokens, slot))) => {
                // Ample capacity: call the service made ready right away.
                // The request slot is spent as the call goes out; only the
                // tokens are settled.
                let settlement = Settlement::new(key, tokens, slot);
                future::ResponseFuture::called(self.inner.call(call), settlement)
            }
            Ok(Entered::Queued(id)) => {
                // The response future calls later: it takes the ready
                // service, and leaves a clone to be made ready.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                let waiter = Waiter::new(key, id);
                future::ResponseFuture::waiting(inner, call, Some(waiter), None, Duration::ZERO)
            }
            Err(retry_after) => {
                future::ResponseFuture::refused(RateLimited::new(key.key(), retry_after))
            }
        }
    }
}

/// A slot held from `poll_ready` takes over what `ticket` holds.
fn merged(held: Option<Ticket>, ticket: Ticket) -> Ticket {
    match held {
        Some(mut held) => {
            held.merge(ticket);
            held
        }
        None => ticket,
    }
}
