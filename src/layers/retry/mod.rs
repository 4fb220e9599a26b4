//! Retry a failed call: [`tower::retry`] with an LLM-aware [`RetryPolicy`].
//!
//! [`LlmRetryLayer`] wraps a model service or a tool stack in [`LlmRetry`],
//! which drives [`RetryPolicy`] (a [`tower::retry::Policy`]) as tower's own
//! `Retry` does, cheaper per call. The layer is its
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
pub mod future;
mod policy;
mod replay;

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

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

impl<S: Clone> Layer<S> for LlmRetryLayer {
    type Service = LlmRetry<S>;

    fn layer(&self, inner: S) -> LlmRetry<S> {
        LlmRetry::new(inner, self.policy.clone())
    }
}

/// Retries failed calls by a [`RetryPolicy`]. See the [module docs](self).
///
/// Fails with the last attempt's error, as a [`BoxError`].
///
/// It drives the policy as tower's `Retry` does (the same
/// [`tower::retry::Policy`] methods), at less cost per call: a call that
/// succeeds at once copies its request (one reference count for a
/// [`ModelCall`](crate::ModelCall)) and one handle; the policy's state, the
/// backoff and the wait are made only after a failure. A retry goes to a
/// fresh clone of the inner service, driven to readiness first.
///
/// # Clone
///
/// Clones share the policy's budget and backoff generator.
#[derive(Clone)]
pub struct LlmRetry<S> {
    inner: S,
    /// The policy and a clone of `inner` to clone for retries: one handle
    /// per call, however deep the inner stack.
    shared: Arc<Shared<S>>,
    /// What sends a call off the short path, in one byte read once per
    /// call: [`STALE`] and [`CHECKED`] bits; zero for the common layer.
    detour: u8,
}

/// `inner` was lent out mutably since `shared` was made.
const STALE: u8 = 1;

/// The policy has a budget to deposit into, or never retries (and so
/// takes no copy).
const CHECKED: u8 = 2;

/// What every call of one [`LlmRetry`] shares.
#[derive(Debug)]
pub(crate) struct Shared<S> {
    pub(crate) policy: RetryPolicy,
    pub(crate) service: S,
}

impl<S: Clone> LlmRetry<S> {
    /// Wraps `inner`, retrying by `policy`.
    pub fn new(inner: S, policy: RetryPolicy) -> Self {
        let service = inner.clone();
        let checked = policy.budget_handle().is_some() || !policy.retries();
        Self {
            inner,
            shared: Arc::new(Shared { policy, service }),
            detour: if checked { CHECKED } else { 0 },
        }
    }
}

impl<S: Clone> LlmRetry<S> {
    /// Shares the inner service as [`get_mut`](Self::get_mut) left it.
    #[cold]
    #[inline(never)]
    fn refresh(&mut self) {
        self.shared = Arc::new(Shared {
            policy: self.shared.policy.clone(),
            service: self.inner.clone(),
        });
        self.detour &= !STALE;
    }
}

impl<S> LlmRetry<S> {
    inner_accessors!(inner: S;
        /// Retries after this go to clones of the service as changed.
        get_mut: |retry| retry.detour |= STALE);
}

impl<S: fmt::Debug> fmt::Debug for LlmRetry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlmRetry")
            .field("inner", &self.inner)
            .field("policy", &self.shared.policy)
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

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline(always)]
    fn call(&mut self, mut req: Req) -> Self::Future {
        // One test for the common layer; the future is built in one place,
        // in the caller's memory.
        let copy = if self.detour == 0 {
            req.guard();
            Some(req.clone())
        } else {
            self.checked_copy(&mut req)
        };
        future::ResponseFuture::new(self.inner.call(req), copy, self.shared.clone())
    }
}

impl<S: Clone> LlmRetry<S> {
    /// Readies a call off the short path: refreshes what a retry is sent
    /// to, deposits into the budget, and takes a copy only if a retry may
    /// follow.
    #[inline(never)]
    fn checked_copy<Req: RetryRequest>(&mut self, req: &mut Req) -> Option<Req> {
        if self.detour & STALE != 0 {
            self.refresh();
        }
        req.guard();
        let policy = &self.shared.policy;
        if let Some(budget) = policy.budget_handle() {
            budget.deposit_once(req.extensions_mut());
        }
        policy.retries().then(|| req.clone())
    }
}
