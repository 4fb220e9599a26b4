//! A circuit breaker per model key: stop calling a provider that keeps
//! failing, and let the turn move on at once.
//!
//! [`CircuitBreakerLayer`] watches how the calls of each key (by default the
//! request's model name) end. The breaker of a key:
//!
//! - **opens** after [`consecutive_failures`](CircuitBreakerLayer::consecutive_failures)
//!   provider failures in a row (default 5), or when failures reach
//!   [`failure_rate`](CircuitBreakerLayer::failure_rate) percent of at least
//!   `min_calls` calls over a sliding window (off by default);
//! - while **open**, refuses every call at once, without calling the
//!   provider, with [`CircuitOpen`] (`PROVIDER_UNAVAILABLE`), whose
//!   `retry_after` says when it will try again;
//! - after [`open_for`](CircuitBreakerLayer::open_for) (default 30 s) turns
//!   **half-open**: up to [`probes`](CircuitBreakerLayer::probes) calls at a
//!   time (default 1) go through as probes, the others are refused with a
//!   `retry_after` of zero;
//! - **closes** on a probe's success; a probe's failure opens it again.
//!
//! A *failure* is the provider's trouble: unavailable, timed out, or a 5xx
//! (see [`failure_when`](CircuitBreakerLayer::failure_when) to choose
//! otherwise). An invalid request, a refused key or a rate limit is an
//! answer: the provider is up. A call dropped before it ended teaches the
//! breaker nothing (a dropped probe frees its place for the next one).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_agent::layers::circuit_breaker::{CircuitBreakerLayer, CircuitState};
//! use tower_agent::layers::fallback::FallbackLayer;
//! use tower_agent::{Agent, ErrorKind, ScriptedModel, ScriptedTurn};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_agent::AgentError> {
//! // The big model is down; each of its failures takes 10 s.
//! let provider = ScriptedModel::from_fn(|request| match request.model.as_str() {
//!     "big" => ScriptedTurn::error(ErrorKind::Unavailable, "overloaded").delay(Duration::from_secs(10)),
//!     model => ScriptedTurn::text(format!("{model} here")),
//! });
//! let breaker = CircuitBreakerLayer::new().consecutive_failures(2).open_for(Duration::from_secs(60));
//! let model = ServiceBuilder::new()
//!     .layer(FallbackLayer::models(["small"]))
//!     .layer(breaker.clone())
//!     .service(provider);
//! let agent = Agent::builder("assistant").model(model).model_name("big").build()?;
//!
//! for _ in 0..2 {
//!     agent.run("Hi").await?; // big fails (10 s), small answers
//! }
//! assert!(matches!(breaker.state("big"), Some(CircuitState::Open { .. })));
//!
//! // Now the open breaker refuses big at once: small answers without the wait.
//! let start = tokio::time::Instant::now();
//! assert_eq!(agent.run("Hi").await?.output, "small here");
//! assert_eq!(start.elapsed(), Duration::ZERO);
//! # Ok(()) }
//! ```
//!
//! # Order
//!
//! Inside a [`FallbackLayer`](crate::layers::fallback::FallbackLayer) (each
//! model has its breaker, and a refusal moves the turn to the next model at
//! once) and inside a cache (a cache hit is no news of the provider);
//! outside a rate limit (a refused call spends no capacity) and outside a
//! per-call timeout, if timeouts should count as failures:
//! `retry ▸ fallback ▸ cache ▸ circuit-breaker ▸ timeout ▸ rate-limit ▸ …`.
//!
//! # Clone
//!
//! The breakers live in an `Arc`: the layer, every service it builds and all
//! their clones share them, so every agent using the layer sees one state
//! per key.
//!
//! [`CircuitOpen`]: crate::error::CircuitOpen

mod state;
#[cfg(test)]
mod tests;

pub use crate::error::CircuitOpen;
pub use state::CircuitState;

use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower::{Layer, Service};

use crate::error::{find, kind_of, BoxError, ErrorKind, ProviderError};
use crate::request::ModelCall;
use crate::types::{ModelName, ModelResponse};
use state::{Admission, Breaker};

type FailureFn = dyn Fn(&(dyn StdError + 'static)) -> bool + Send + Sync;
type KeyFn = dyn Fn(&ModelCall) -> String + Send + Sync;

/// The default failure test: unavailable, timed out, or an HTTP 5xx.
pub fn is_provider_failure(err: &(dyn StdError + 'static)) -> bool {
    if find::<CircuitOpen>(err).is_some() {
        return false;
    }
    match kind_of(err) {
        ErrorKind::Unavailable | ErrorKind::Timeout => true,
        ErrorKind::Other => find::<ProviderError>(err)
            .and_then(ProviderError::http_status)
            .is_some_and(|status| (500..600).contains(&status)),
        _ => false,
    }
}

#[derive(Debug, Clone, Copy)]
struct Rate {
    percent: u8,
    min_calls: u32,
    window: Duration,
}

/// The breakers' settings, fixed once the first service is built.
#[derive(Clone)]
struct Config {
    consecutive: Option<u32>,
    rate: Option<Rate>,
    open_for: Duration,
    probes: u32,
    failure: Option<Arc<FailureFn>>,
    key: Option<Arc<KeyFn>>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("consecutive", &self.consecutive)
            .field("rate", &self.rate)
            .field("open_for", &self.open_for)
            .field("probes", &self.probes)
            .finish_non_exhaustive()
    }
}

/// The breakers of every key, shared by the layer and its services.
#[derive(Debug)]
struct Shared {
    config: Config,
    breakers: Mutex<HashMap<ModelName, Arc<Mutex<Breaker>>>>,
}

impl Shared {
    fn breaker(&self, key: &ModelName) -> Arc<Mutex<Breaker>> {
        let mut breakers = self.breakers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(breaker) = breakers.get(key.as_str()) {
            return breaker.clone();
        }
        let breaker = Arc::new(Mutex::new(Breaker::new(&self.config, Instant::now())));
        breakers.insert(key.clone(), breaker.clone());
        breaker
    }

    /// The call's key: the model's name costs a reference count, not a copy.
    fn key(&self, call: &ModelCall) -> ModelName {
        match &self.config.key {
            Some(f) => ModelName::from(f(call)),
            None if call.request.model.is_empty() => ModelName::from("(default)"),
            None => call.request.model.clone(),
        }
    }

    fn is_failure(&self, err: &(dyn StdError + 'static)) -> bool {
        match &self.config.failure {
            Some(f) => f(err),
            None => is_provider_failure(err),
        }
    }
}

/// Wraps model services in [`CircuitBreaker`]. See the [module docs](self).
///
/// The layer is its own builder: [`new`](Self::new) has the defaults, each
/// setter returns it changed.
///
/// # Clone
///
/// Clones share the breakers. Setters called on a clone give it breakers of
/// its own.
#[derive(Clone, Debug)]
pub struct CircuitBreakerLayer {
    shared: Arc<Shared>,
}

impl Default for CircuitBreakerLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl CircuitBreakerLayer {
    /// Opens after 5 failures in a row, for 30 s, then lets one probe through.
    pub fn new() -> Self {
        Self::with_config(Config {
            consecutive: Some(5),
            rate: None,
            open_for: Duration::from_secs(30),
            probes: 1,
            failure: None,
            key: None,
        })
    }

    fn with_config(config: Config) -> Self {
        Self {
            shared: Arc::new(Shared {
                config,
                breakers: Mutex::default(),
            }),
        }
    }

    fn map(self, f: impl FnOnce(&mut Config)) -> Self {
        let mut config = self.shared.config.clone();
        f(&mut config);
        Self::with_config(config)
    }

    /// Opens after `n` provider failures in a row; `0` turns the count off.
    pub fn consecutive_failures(self, n: u32) -> Self {
        self.map(|c| c.consecutive = (n > 0).then_some(n))
    }

    /// Also opens when failures reach `percent` (capped at 100) of at least
    /// `min_calls` calls (at least 1) over the last `window` (counted in ten
    /// buckets, so the window slides in steps of a tenth).
    pub fn failure_rate(self, percent: u8, min_calls: u32, window: Duration) -> Self {
        self.map(|c| {
            c.rate = Some(Rate {
                percent: percent.min(100),
                min_calls: min_calls.max(1),
                window,
            })
        })
    }

    /// How long the breaker stays open before it lets a probe through.
    pub fn open_for(self, duration: Duration) -> Self {
        self.map(|c| c.open_for = duration)
    }

    /// How many probe calls may be in flight at once when half-open (at
    /// least 1).
    pub fn probes(self, n: u32) -> Self {
        self.map(|c| c.probes = n.max(1))
    }

    /// Decides what a failure is, instead of [`is_provider_failure`].
    pub fn failure_when(
        self,
        f: impl Fn(&(dyn StdError + 'static)) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.map(|c| c.failure = Some(Arc::new(f)))
    }

    /// Keys breakers with `f` instead of the model name (e.g. by provider).
    pub fn key_fn(self, f: impl Fn(&ModelCall) -> String + Send + Sync + 'static) -> Self {
        self.map(|c| c.key = Some(Arc::new(f)))
    }

    /// The state of the breaker of `key`, if a call was made with it.
    pub fn state(&self, key: &str) -> Option<CircuitState> {
        let breaker = self
            .shared
            .breakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()?;
        let breaker = breaker.lock().unwrap_or_else(PoisonError::into_inner);
        Some(breaker.state(Instant::now()))
    }
}

impl<S> Layer<S> for CircuitBreakerLayer {
    type Service = CircuitBreaker<S>;

    fn layer(&self, inner: S) -> CircuitBreaker<S> {
        CircuitBreaker {
            inner,
            shared: self.shared.clone(),
            last: None,
        }
    }
}

/// Refuses calls to a key whose provider keeps failing. See the
/// [module docs](self).
///
/// # Clone
///
/// Clones share the breakers.
#[derive(Clone)]
pub struct CircuitBreaker<S> {
    inner: S,
    shared: Arc<Shared>,
    /// The breaker of the last key called, to skip the map next time.
    last: Option<(ModelName, Arc<Mutex<Breaker>>)>,
}

impl<S> CircuitBreaker<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for CircuitBreaker<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("inner", &self.inner)
            .field("config", &self.shared.config)
            .finish()
    }
}

impl<S> Service<ModelCall> for CircuitBreaker<S>
where
    S: Service<ModelCall, Response = ModelResponse>,
    S::Error: Into<BoxError>,
{
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = future::ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, call: ModelCall) -> Self::Future {
        let key = self.shared.key(&call);
        let breaker = match &self.last {
            Some((last, breaker)) if *last == key => breaker.clone(),
            _ => {
                let breaker = self.shared.breaker(&key);
                self.last = Some((key.clone(), breaker.clone()));
                breaker
            }
        };
        let admission = breaker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(&self.shared.config, Instant::now);
        match admission {
            Admission::Reject { retry_after } => {
                tracing::debug!(%key, ?retry_after, "circuit open: call refused");
                future::ResponseFuture::rejected(CircuitOpen::new(key.as_str(), retry_after))
            }
            Admission::Pass | Admission::Probe => {
                let tracker = future::Tracker {
                    shared: self.shared.clone(),
                    breaker,
                    key,
                    probe: admission == Admission::Probe,
                    done: false,
                };
                future::ResponseFuture::inner(self.inner.call(call), tracker)
            }
        }
    }
}

/// The response future of [`CircuitBreaker`].
pub mod future {
    use std::fmt;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex, PoisonError};
    use std::task::{ready, Context, Poll};

    use pin_project_lite::pin_project;
    use tokio::time::Instant;

    use super::state::{Breaker, CircuitState, Outcome};
    use super::{CircuitOpen, Shared};
    use crate::error::{find, kind_of, BoxError, ErrorKind, ProviderError, RateLimited};

    /// Whether an error that is no failure is still the provider's answer
    /// (so the provider is up), rather than news of nothing (a cancelled
    /// call, a tripwire, a breaker further in).
    fn answered(err: &(dyn std::error::Error + 'static)) -> bool {
        find::<CircuitOpen>(err).is_none()
            && find::<RateLimited>(err).is_none()
            && (find::<ProviderError>(err).is_some()
                || matches!(
                    kind_of(err),
                    ErrorKind::InvalidRequest
                        | ErrorKind::ContextLength
                        | ErrorKind::Auth
                        | ErrorKind::RateLimited
                        | ErrorKind::QuotaExhausted
                ))
    }

    /// Records a call's outcome in its breaker, once; a dropped call
    /// records [`Outcome::Abandoned`].
    pub(super) struct Tracker {
        pub(super) shared: Arc<Shared>,
        pub(super) breaker: Arc<Mutex<Breaker>>,
        pub(super) key: crate::types::ModelName,
        pub(super) probe: bool,
        pub(super) done: bool,
    }

    impl Tracker {
        fn finish(&mut self, outcome: Outcome) {
            if std::mem::replace(&mut self.done, true) {
                return;
            }
            let changed = self
                .breaker
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .record(&self.shared.config, self.probe, outcome, Instant::now);
            match changed {
                Some(CircuitState::Open { .. }) => {
                    tracing::warn!(key = %self.key, "circuit opened: the provider keeps failing")
                }
                Some(CircuitState::Closed) => {
                    tracing::info!(key = %self.key, "circuit closed: the provider answered")
                }
                _ => {}
            }
        }
    }

    impl Drop for Tracker {
        fn drop(&mut self) {
            self.finish(Outcome::Abandoned);
        }
    }

    pin_project! {
        /// The response future of [`CircuitBreaker`](super::CircuitBreaker):
        /// the inner call, unboxed, or a refusal at once.
        pub struct ResponseFuture<F> {
            #[pin]
            kind: Kind<F>,
        }
    }

    pin_project! {
        #[project = KindProj]
        enum Kind<F> {
            Inner {
                #[pin]
                future: F,
                tracker: Tracker,
            },
            Rejected {
                error: Option<CircuitOpen>,
            },
        }
    }

    impl<F> ResponseFuture<F> {
        pub(super) fn inner(future: F, tracker: Tracker) -> Self {
            Self {
                kind: Kind::Inner { future, tracker },
            }
        }

        pub(super) fn rejected(error: CircuitOpen) -> Self {
            Self {
                kind: Kind::Rejected { error: Some(error) },
            }
        }
    }

    impl<F, T, E> Future for ResponseFuture<F>
    where
        F: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        type Output = Result<T, BoxError>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            match self.project().kind.project() {
                KindProj::Inner { future, tracker } => {
                    let result = ready!(future.poll(cx)).map_err(Into::into);
                    let outcome = match &result {
                        Ok(_) => Outcome::Success,
                        Err(err) if tracker.shared.is_failure(err.as_ref()) => Outcome::Failure,
                        Err(err) if answered(err.as_ref()) => Outcome::Success,
                        Err(_) => Outcome::Abandoned,
                    };
                    tracker.finish(outcome);
                    Poll::Ready(result)
                }
                KindProj::Rejected { error } => Poll::Ready(Err(error
                    .take()
                    .expect("a refused call's future is polled once after it is ready")
                    .into())),
            }
        }
    }

    impl<F> fmt::Debug for ResponseFuture<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("ResponseFuture").finish_non_exhaustive()
        }
    }
}
