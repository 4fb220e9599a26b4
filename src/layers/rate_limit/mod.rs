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
//! let limit = ModelRateLimitLayer::builder()
//!     .requests(1, Duration::from_secs(60))
//!     .tokens(40_000, Duration::from_secs(60))
//!     .max_wait(Duration::from_secs(5))
//!     .build()?;
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
//! [`key_fn`](RateLimitBuilder::key_fn) and [`key`](RateLimitBuilder::key))
//! has a request bucket and a token bucket. A bucket holds up to `amount`
//! and refills continuously at `amount` per `per`: a full bucket allows a
//! burst of `amount`, then one unit every `per / amount`. Keys without
//! limits of their own ([`limits_for`](RateLimitBuilder::limits_for)) get
//! the default limits.
//!
//! # Tokens: reserved, then settled
//!
//! A call reserves its estimated tokens before it goes out: its text at four
//! bytes a token plus `settings.max_tokens` (or
//! [`default_output_tokens`](RateLimitBuilder::default_output_tokens)), or
//! what [`estimate`](RateLimitBuilder::estimate) says. An estimate above
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
//! # Waiting: FIFO, bounded by `max_wait`
//!
//! Each key has one queue. A call is admitted when it is at the head and
//! both buckets hold what it needs; while anyone waits, a newcomer queues
//! behind them even if it would fit, so a small call never slips past a
//! large one that waits for tokens. Only the head sleeps on a timer; a
//! refund or a released reservation wakes it early.
//!
//! A call whose wait, as estimated when it arrives, exceeds
//! [`max_wait`](RateLimitBuilder::max_wait) (or the time left to its run's
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
//! - With a fixed [`key`](RateLimitBuilder::key) (a layer bound to one
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
mod limiter;
mod limits;
#[cfg(test)]
mod tests;

pub use crate::error::RateLimited;
pub use limits::{Limits, Rate};

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower::{Layer, Service};

use crate::error::{AgentError, BoxError};
use crate::request::ModelCall;
use crate::types::{ModelRequest, ModelResponse};
use limiter::{Arrival, EstimateFn, KeyFn, KeyShared, Limiter, Ticket, Waiter};

/// Applies [`ModelRateLimit`] to model services. Built with
/// [`ModelRateLimitLayer::builder`]. See the [module docs](self).
///
/// # Clone
///
/// Clones share the quota: every service built by this layer or a clone of
/// it draws on the same requests and tokens.
#[derive(Clone)]
pub struct ModelRateLimitLayer {
    limiter: Arc<Limiter>,
}

impl ModelRateLimitLayer {
    /// A builder with no limits, a `max_wait` of 30 s, keyed on the model.
    pub fn builder() -> RateLimitBuilder {
        RateLimitBuilder {
            default: Limits::new(),
            per_key: HashMap::new(),
            max_wait: Duration::from_secs(30),
            fixed_key: None,
            key_fn: None,
            estimate: None,
            default_output_tokens: 1024,
        }
    }
}

impl fmt::Debug for ModelRateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelRateLimitLayer")
            .field("limiter", &self.limiter)
            .finish()
    }
}

impl<S> Layer<S> for ModelRateLimitLayer {
    type Service = ModelRateLimit<S>;

    fn layer(&self, inner: S) -> ModelRateLimit<S> {
        ModelRateLimit {
            inner,
            limiter: self.limiter.clone(),
            slot: Slot::Empty,
        }
    }
}

/// Configures a [`ModelRateLimitLayer`].
pub struct RateLimitBuilder {
    default: Limits,
    per_key: HashMap<String, Limits>,
    max_wait: Duration,
    fixed_key: Option<String>,
    key_fn: Option<Arc<KeyFn>>,
    estimate: Option<Arc<EstimateFn>>,
    default_output_tokens: u64,
}

impl fmt::Debug for RateLimitBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitBuilder")
            .field("default", &self.default)
            .field("per_key", &self.per_key)
            .field("max_wait", &self.max_wait)
            .field("fixed_key", &self.fixed_key)
            .field("default_output_tokens", &self.default_output_tokens)
            .finish_non_exhaustive()
    }
}

impl RateLimitBuilder {
    /// At most `amount` requests per `per`, for every key without limits
    /// of its own.
    pub fn requests(mut self, amount: u64, per: Duration) -> Self {
        self.default = self.default.requests(amount, per);
        self
    }

    /// At most `amount` tokens per `per`, for every key without limits of
    /// its own.
    pub fn tokens(mut self, amount: u64, per: Duration) -> Self {
        self.default = self.default.tokens(amount, per);
        self
    }

    /// The limits of `key` (a model name, unless a key function says
    /// otherwise), instead of the default ones.
    pub fn limits_for(mut self, key: impl Into<String>, limits: Limits) -> Self {
        self.per_key.insert(key.into(), limits);
        self
    }

    /// The longest a call may wait for capacity before it fails with
    /// `RATE_LIMITED` (default 30 s). Zero fails every call that would wait.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// Binds the layer to one key, whatever the request says: capacity is
    /// then reserved in `poll_ready`. See [Readiness](self#readiness).
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.fixed_key = Some(key.into());
        self
    }

    /// Keys calls with `f` instead of the model name (e.g. by tenant and
    /// model, from the run's state).
    pub fn key_fn(mut self, f: impl Fn(&ModelCall) -> String + Send + Sync + 'static) -> Self {
        self.key_fn = Some(Arc::new(f));
        self
    }

    /// Estimates a request's tokens with `f` instead of the default (text
    /// at four bytes a token plus the output allowance).
    pub fn estimate(mut self, f: impl Fn(&ModelRequest) -> u64 + Send + Sync + 'static) -> Self {
        self.estimate = Some(Arc::new(f));
        self
    }

    /// The output tokens the default estimate assumes for a request without
    /// `max_tokens` (default 1024).
    pub fn default_output_tokens(mut self, tokens: u64) -> Self {
        self.default_output_tokens = tokens;
        self
    }

    /// The layer.
    ///
    /// # Errors
    ///
    /// [`AgentError::Config`] if a limit has an amount of zero or a zero
    /// interval.
    pub fn build(self) -> Result<ModelRateLimitLayer, AgentError> {
        if !self.default.is_valid() {
            return Err(AgentError::Config(
                "rate limit: amounts and intervals must be above zero".into(),
            ));
        }
        if let Some((key, _)) = self.per_key.iter().find(|(_, l)| !l.is_valid()) {
            return Err(AgentError::Config(format!(
                "rate limit of `{key}`: amounts and intervals must be above zero"
            )));
        }
        Ok(ModelRateLimitLayer {
            limiter: Arc::new(Limiter::new(self)),
        })
    }
}

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

/// Limits the requests and tokens of model calls. See the
/// [module docs](self).
pub struct ModelRateLimit<S> {
    inner: S,
    limiter: Arc<Limiter>,
    slot: Slot,
}

impl<S> ModelRateLimit<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped (a reservation held is given back).
    pub fn into_inner(self) -> S {
        self.inner
    }
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
                        Err(retry_after) => Slot::Refused { key, retry_after },
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
        if let Some(key) = &self.limiter.fixed_key {
            ready!(self.slot.poll_ready(&self.limiter, key, cx));
            if matches!(self.slot, Slot::Refused { .. }) {
                // `call` answers with the refusal.
                return Poll::Ready(Ok(()));
            }
        }
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, call: ModelCall) -> future::ResponseFuture<S> {
        let (held, waited) = match &self.slot {
            // A key per request: nothing was held in `poll_ready`.
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
            None => self.limiter.key_of(&call),
        };
        let tokens = self.limiter.estimate(&call.request);
        let mut max_wait = self.limiter.max_wait.saturating_sub(waited);
        if let Some(left) = call.context.remaining() {
            max_wait = max_wait.min(left);
        }
        let requests = u64::from(held.is_none());
        match key.arrive(requests, tokens, max_wait) {
            // A slot held from `poll_ready` is given back as `held` drops.
            Err(retry_after) => {
                future::ResponseFuture::refused(RateLimited::new(key.key(), retry_after))
            }
            // Ample capacity and nothing to report: call the service made
            // ready right away.
            Ok(Arrival::Admitted(ticket)) if waited.is_zero() => {
                let ticket = match held {
                    None => ticket,
                    held => merged(held, ticket),
                };
                future::ResponseFuture::called(self.inner.call(call), ticket)
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

pub mod future {
    //! The [`ModelRateLimit`](super::ModelRateLimit) service's future.

    use std::fmt;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{ready, Context, Poll};
    use std::time::Duration;

    use pin_project_lite::pin_project;
    use tokio::time::Instant;
    use tower::Service;

    use super::limiter::{Ticket, Waiter};
    use crate::error::{BoxError, RateLimited};
    use crate::event::AgentEvent;
    use crate::request::ModelCall;
    use crate::types::ModelResponse;

    pin_project! {
        /// The future of [`ModelRateLimit`](super::ModelRateLimit): a
        /// refusal, the inner call, or the wait for capacity followed by
        /// the inner call.
        ///
        /// With ample capacity the inner service is called from `call`,
        /// and this future only drives the inner one and settles the
        /// tokens. A call that waits owns the ready inner service until it
        /// is admitted.
        pub struct ResponseFuture<S>
        where
            S: Service<ModelCall>,
        {
            #[pin]
            state: State<S, S::Future>,
        }
    }

    pin_project! {
        #[project = StateProj]
        enum State<S, F> {
            Refused {
                error: Option<RateLimited>,
            },
            // Boxed: only a call that waits (or reports a wait) comes here,
            // and the future of every other call stays small.
            Waiting {
                waiting: Box<Waiting<S>>,
            },
            Called {
                #[pin]
                fut: F,
                // Marked sent as the inner service was called; settled when
                // it answers.
                ticket: Option<Ticket>,
            },
        }
    }

    /// A call that is not admitted yet, or must report its wait.
    struct Waiting<S> {
        /// `None` once admitted (or when admitted in `call`).
        waiter: Option<Waiter>,
        /// The first poll's time, when it waits.
        since: Option<Instant>,
        /// A slot held from `poll_ready`, then the whole admission.
        ticket: Option<Ticket>,
        waited: Duration,
        call: Option<ModelCall>,
        inner: S,
    }

    impl<S> ResponseFuture<S>
    where
        S: Service<ModelCall>,
    {
        pub(super) fn refused(err: RateLimited) -> Self {
            Self {
                state: State::Refused { error: Some(err) },
            }
        }

        pub(super) fn called(fut: S::Future, mut ticket: Ticket) -> Self {
            ticket.sent();
            Self {
                state: State::Called {
                    fut,
                    ticket: Some(ticket),
                },
            }
        }

        pub(super) fn waiting(
            inner: S,
            call: ModelCall,
            waiter: Option<Waiter>,
            ticket: Option<Ticket>,
            waited: Duration,
        ) -> Self {
            Self {
                state: State::Waiting {
                    waiting: Box::new(Waiting {
                        waiter,
                        since: None,
                        ticket,
                        waited,
                        call: Some(call),
                        inner,
                    }),
                },
            }
        }
    }

    impl<S> Future for ResponseFuture<S>
    where
        S: Service<ModelCall, Response = ModelResponse>,
        S::Error: Into<BoxError>,
    {
        type Output = Result<ModelResponse, BoxError>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let mut state = self.project().state;
            loop {
                let fut = match state.as_mut().project() {
                    StateProj::Refused { error } => {
                        let err = error
                            .take()
                            .expect("ResponseFuture polled after completion");
                        return Poll::Ready(Err(err.into()));
                    }
                    StateProj::Waiting { waiting } => {
                        let Waiting {
                            waiter,
                            since,
                            ticket,
                            waited,
                            call,
                            inner,
                        } = &mut **waiting;
                        if let Some(queued) = waiter {
                            let since = *since.get_or_insert_with(|| {
                                tracing::debug!(
                                    key = %queued.key(),
                                    "rate limit: waiting for capacity"
                                );
                                Instant::now()
                            });
                            let admitted = ready!(queued.poll_admitted(cx));
                            *waited += since.elapsed();
                            *waiter = None;
                            *ticket = Some(super::merged(ticket.take(), admitted));
                        }
                        let mut ticket = ticket.take().expect("admitted before the call");
                        let call = call.take().expect("called once");
                        if !waited.is_zero() {
                            let ctx = &call.context;
                            ctx.emit(|| AgentEvent::RateLimitWait {
                                run_id: ctx.run_id().clone(),
                                key: ticket.key().to_owned(),
                                waited: *waited,
                            });
                        }
                        let fut = inner.call(call);
                        ticket.sent();
                        State::Called {
                            fut,
                            ticket: Some(ticket),
                        }
                    }
                    StateProj::Called { fut, ticket } => {
                        let output = fut.poll(cx);
                        // A failed call keeps its reservation.
                        if let (Poll::Ready(Ok(response)), Some(ticket)) = (&output, ticket) {
                            ticket.settle(response.usage.total_tokens());
                        }
                        return output.map_err(Into::into);
                    }
                };
                state.set(fut);
            }
        }
    }

    impl<S> fmt::Debug for ResponseFuture<S>
    where
        S: Service<ModelCall>,
    {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match &self.state {
                State::Refused { error } => f
                    .debug_tuple("ResponseFuture::Refused")
                    .field(error)
                    .finish(),
                State::Waiting { waiting } => f
                    .debug_struct("ResponseFuture::Waiting")
                    .field("waiter", &waiting.waiter)
                    .finish_non_exhaustive(),
                State::Called { ticket, .. } => f
                    .debug_struct("ResponseFuture::Called")
                    .field("ticket", ticket)
                    .finish_non_exhaustive(),
            }
        }
    }
}
