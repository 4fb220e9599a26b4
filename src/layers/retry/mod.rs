//! Retry a failed call: [`tower::retry`] with an LLM-aware [`RetryPolicy`].
//!
//! [`LlmRetryLayer`] wraps a model service or a tool stack in [`LlmRetry`],
//! which is tower's own `Retry` driven by [`RetryPolicy`]. The layer is its
//! own builder: [`LlmRetryLayer::new`] has the policy's defaults, and its
//! setters ([`max_attempts`](LlmRetryLayer::max_attempts),
//! [`backoff`](LlmRetryLayer::backoff),
//! [`max_retry_after`](LlmRetryLayer::max_retry_after),
//! [`budget`](LlmRetryLayer::budget)) change one thing each. The names keep
//! clear of tower's `RetryLayer` and `Retry`.
//!
//! - **What is retried**: rate-limited, unavailable, timed-out and 5xx-class
//!   failures ([`is_transient`]). Never an invalid request, auth, context
//!   length, tripwire, quota-exhausted or cancelled error.
//! - **How long it waits**: the provider's `Retry-After` when it sends one (a
//!   longer one than [`max_retry_after`](RetryPolicy::max_retry_after) fails
//!   the call at once); otherwise exponential [`Backoff`] with full jitter,
//!   capped. A wait that would end past the run's deadline is not started.
//!   Waiting is on tokio's clock, so tests run it under a paused clock.
//! - **How often**: at most [`max_attempts`](RetryPolicy::max_attempts) calls,
//!   and only while the shared [`RetryBudget`] allows. One budget handle given
//!   to every layer (and to the fallback layer, and to the model stacks of
//!   nested agents) is one pool, so retries cannot multiply.
//! - **Replay safety** ([`RetryRequest`]): a streamed model call is retried
//!   only if no delta reached the run's sink yet; a tool call only if its
//!   tool is marked idempotent.
//! - **Observable**: every retry emits [`AgentEvent::RetryAttempt`](crate::event::AgentEvent::RetryAttempt) with the
//!   failed attempt's number, error code and text, and the wait.
//!
//! Every attempt that reaches the model is billed and recorded by the model
//! service itself; the layer records nothing, so nothing counts twice.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_agent::layers::retry::{Backoff, LlmRetryLayer, RetryBudget};
//! use tower_agent::{Agent, ErrorKind, ScriptedModel, ScriptedTurn};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_agent::AgentError> {
//! let retry = LlmRetryLayer::new()
//!     .max_attempts(4)
//!     .backoff(Backoff::new(Duration::from_millis(200), Duration::from_secs(10)))
//!     .budget(RetryBudget::default());
//! let model = ServiceBuilder::new()
//!     .layer(retry)
//!     .service(ScriptedModel::new([
//!         ScriptedTurn::error(ErrorKind::Unavailable, "overloaded"),
//!         ScriptedTurn::rate_limited(Duration::from_secs(2)),
//!         ScriptedTurn::text("Hello!"),
//!     ]));
//!
//! let agent = Agent::builder("greeter").model(model).build()?;
//! let run = agent.run("Hi").await?;
//! assert_eq!(run.output, "Hello!");
//! # Ok(()) }
//! ```
//!
//! # Order
//!
//! Outside the timeout (each attempt gets its own) and outside a fallback (a
//! retry goes through every model again): `retry ▸ timeout ▸ fallback ▸ …`.
//! In a tool stack, `AgentBuilder::tool_layer(LlmRetryLayer::new())`.

mod backoff;
mod budget;
mod policy;
mod replay;

use std::fmt;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::TryFutureExt;
use tower::{Layer, Service};

pub use backoff::{Backoff, Jitter};
pub use budget::{InvalidBudget, RetryBudget};
pub use policy::{is_transient, RetryPolicy};
pub use replay::{RetryRequest, StreamGuard};

use crate::error::BoxError;

/// Wraps a service in [`LlmRetry`]. See the [module docs](self).
///
/// Defaults: those of [`RetryPolicy::new`] (3 attempts in all, 500 ms
/// backoff doubling to 30 s with full jitter, `Retry-After` honoured up to
/// 60 s, no budget).
#[derive(Debug, Clone, Default)]
pub struct LlmRetryLayer {
    policy: RetryPolicy,
}

impl LlmRetryLayer {
    /// A layer with the default policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// The most attempts a call gets, the first included (default 3; 0 is
    /// read as 1, no retry).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.policy = self.policy.max_attempts(attempts);
        self
    }

    /// How long to wait between attempts when the provider does not say.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.policy = self.policy.backoff(backoff);
        self
    }

    /// The longest `Retry-After` to wait for (default 60 s). A provider
    /// asking for more fails the call at once, with its error.
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.policy = self.policy.max_retry_after(max);
        self
    }

    /// Draws every retry from `budget`, shared with whoever else holds it
    /// (the fallback layer, nested agents' stacks).
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.policy = self.policy.budget(budget);
        self
    }

    /// Retries by `policy`, replacing everything set before.
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }
}

impl From<RetryPolicy> for LlmRetryLayer {
    fn from(policy: RetryPolicy) -> Self {
        Self { policy }
    }
}

impl<S> Layer<S> for LlmRetryLayer {
    type Service = LlmRetry<S>;

    fn layer(&self, inner: S) -> LlmRetry<S> {
        LlmRetry::new(inner, self.policy.clone())
    }
}

/// Retries failed calls by a [`RetryPolicy`]. See the [module docs](self).
///
/// Fails with the last attempt's error, as a [`BoxError`].
///
/// # Clone
///
/// Clones share the policy's budget and backoff generator.
#[derive(Clone)]
pub struct LlmRetry<S> {
    inner: tower::retry::Retry<RetryPolicy, ErrInto<S>>,
    budget: Option<RetryBudget>,
}

impl<S> LlmRetry<S> {
    /// Wraps `inner`, retrying by `policy`.
    pub fn new(inner: S, policy: RetryPolicy) -> Self {
        let budget = policy.budget_handle().cloned();
        Self {
            inner: tower::retry::Retry::new(policy, ErrInto(inner)),
            budget,
        }
    }

    inner_accessors!(S, |s| s.inner.get_ref().0, |s| s.inner.get_mut().0, |s| s
        .inner
        .into_inner()
        .0);
}

impl<S: fmt::Debug> fmt::Debug for LlmRetry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlmRetry")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, Req> Service<Req> for LlmRetry<S>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    Req: RetryRequest,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = future::ResponseFuture<S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        req.guard();
        if let Some(budget) = &self.budget {
            budget.deposit_once(req.extensions_mut());
        }
        // tower's `Retry` calls the service made ready and keeps a clone of
        // itself, driven to readiness again, for the retries.
        future::ResponseFuture::new(self.inner.call(req))
    }
}

/// Boxes the inner service's error, so the policy reads one error type.
#[derive(Debug, Clone)]
struct ErrInto<S>(S);

impl<S, Req> Service<Req> for ErrInto<S>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = futures::future::MapErr<S::Future, fn(S::Error) -> BoxError>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.0
            .call(req)
            .map_err(Into::into as fn(S::Error) -> BoxError)
    }
}

/// The futures of [`LlmRetry`].
pub mod future {
    use std::fmt;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use pin_project_lite::pin_project;
    use tower::Service;

    use super::{ErrInto, RetryPolicy, RetryRequest};
    use crate::error::BoxError;

    pin_project! {
        /// The response future of [`LlmRetry`](super::LlmRetry).
        pub struct ResponseFuture<S, Req>
        where
            S: Service<Req>,
            S::Error: Into<BoxError>,
            Req: RetryRequest,
        {
            #[pin]
            inner: tower::retry::future::ResponseFuture<RetryPolicy, ErrInto<S>, Req>,
        }
    }

    impl<S, Req> ResponseFuture<S, Req>
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
        Req: RetryRequest,
    {
        pub(super) fn new(
            inner: tower::retry::future::ResponseFuture<RetryPolicy, ErrInto<S>, Req>,
        ) -> Self {
            Self { inner }
        }
    }

    impl<S, Req> Future for ResponseFuture<S, Req>
    where
        S: Service<Req> + Clone,
        S::Error: Into<BoxError>,
        Req: RetryRequest,
    {
        type Output = Result<S::Response, BoxError>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            self.project().inner.poll(cx)
        }
    }

    impl<S, Req> fmt::Debug for ResponseFuture<S, Req>
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
        Req: RetryRequest,
    {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("ResponseFuture").finish_non_exhaustive()
        }
    }

    pin_project! {
        /// The wait before a retry: a sleep on tokio's clock.
        #[derive(Debug)]
        pub struct Delay {
            #[pin]
            sleep: tokio::time::Sleep,
        }
    }

    impl Delay {
        pub(super) fn new(duration: Duration) -> Self {
            Self {
                sleep: tokio::time::sleep(duration),
            }
        }
    }

    impl Future for Delay {
        type Output = ();

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.project().sleep.poll(cx)
        }
    }
}
