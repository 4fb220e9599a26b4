//! [`ModelRateLimitLayer`]: the layer, its own builder.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tower::Layer;

use super::limiter::Limiter;
use super::limits::{Config, Limits};
use super::service::ModelRateLimit;
use crate::error::AgentError;
use crate::request::ModelCall;
use crate::stores::quota::QuotaStore;
use crate::stores::FailPolicy;
use crate::types::ModelRequest;

/// Applies [`ModelRateLimit`] to model services. See the [module docs](super).
///
/// The layer is its own builder: [`new`](Self::new) has no limits, a
/// `max_wait` of 30 s and keys calls by model; each setter changes one thing.
/// The limits are checked once, when the layer first builds a service (or
/// at [`validate`](Self::validate)): a limit of zero fails every call of
/// that service with [`AgentError::Config`] (`INVALID_CONFIG`).
///
/// # Clone
///
/// Clones share the quota: every service built by this layer or a clone of
/// it draws on the same requests and tokens. A setter called on a clone
/// gives that clone a quota of its own.
#[derive(Clone)]
pub struct ModelRateLimitLayer {
    config: Config,
    /// The quota, made (and the limits checked) once, when the first
    /// service is built; shared by every clone made since the last setter.
    limiter: Arc<OnceLock<Result<Arc<Limiter>, Arc<str>>>>,
}

impl ModelRateLimitLayer {
    /// No limits yet, a `max_wait` of 30 s, keyed on the model, 1024 output
    /// tokens assumed for a request without `max_tokens`.
    pub fn new() -> Self {
        Self {
            config: Config::default(),
            limiter: Arc::default(),
        }
    }

    /// Changes the configuration: the layer gets a quota of its own.
    fn with(mut self, change: impl FnOnce(&mut Config)) -> Self {
        change(&mut self.config);
        self.limiter = Arc::default();
        self
    }

    /// At most `amount` requests per `per`, for every key without limits
    /// of its own.
    pub fn requests(self, amount: u64, per: Duration) -> Self {
        self.with(|c| c.default = c.default.requests(amount, per))
    }

    /// At most `amount` tokens per `per`, for every key without limits of
    /// its own.
    pub fn tokens(self, amount: u64, per: Duration) -> Self {
        self.with(|c| c.default = c.default.tokens(amount, per))
    }

    /// The limits of `key` (a model name, unless a key function says
    /// otherwise), instead of the default ones.
    pub fn limits_for(self, key: impl Into<String>, limits: Limits) -> Self {
        let key = key.into();
        self.with(|c| {
            c.per_key.insert(key, limits);
        })
    }

    /// The longest a call may wait for capacity before it fails with
    /// `RATE_LIMITED` (default 30 s). Zero fails every call that would wait.
    pub fn max_wait(self, max_wait: Duration) -> Self {
        self.with(|c| c.max_wait = max_wait)
    }

    /// Binds the layer to one key, whatever the request says: capacity is
    /// then reserved in `poll_ready`. See [Readiness](super#readiness).
    pub fn key(self, key: impl Into<String>) -> Self {
        let key = key.into();
        self.with(|c| c.fixed_key = Some(key))
    }

    /// Keys calls with `f` instead of the model name (e.g. by tenant and
    /// model, from the run's state).
    pub fn key_fn(self, f: impl Fn(&ModelCall) -> String + Send + Sync + 'static) -> Self {
        self.with(|c| c.key_fn = Some(Arc::new(f)))
    }

    /// Estimates a request's tokens with `f` instead of the default (text
    /// at four bytes a token plus the output allowance).
    pub fn estimate(self, f: impl Fn(&ModelRequest) -> u64 + Send + Sync + 'static) -> Self {
        self.with(|c| c.estimate = Some(Arc::new(f)))
    }

    /// Counts a request's input with the model's counter from `counters`
    /// (see [`request_tokens`](crate::tokens::request_tokens)), incrementally
    /// per run, instead of four bytes a token. An [`estimate`](Self::estimate)
    /// function still wins.
    ///
    /// ```
    /// use tower_agent::layers::rate_limit::ModelRateLimitLayer;
    /// use tower_agent::tokens::TokenCounters;
    ///
    /// let layer = ModelRateLimitLayer::new().token_counter(TokenCounters::openai());
    /// # let _ = layer;
    /// ```
    pub fn token_counter(self, counters: crate::tokens::TokenCounters) -> Self {
        self.with(|c| c.counters = Some(counters))
    }

    /// The output tokens the default estimate assumes for a request without
    /// `max_tokens` (default 1024).
    pub fn default_output_tokens(self, tokens: u64) -> Self {
        self.with(|c| c.default_output_tokens = tokens)
    }

    /// How many idle keys may stay in memory before they are swept (default
    /// 1024). A key is idle when its buckets have refilled and no call
    /// holds or waits for its quota: it is then exactly what a fresh key
    /// would be, and forgetting it changes nothing. See
    /// [Keys](super#keys).
    pub fn idle_keys(self, keys: usize) -> Self {
        self.with(|c| c.idle_keys = keys)
    }

    /// Keeps the quota in `store` instead of in memory: a store shared by
    /// many processes (Redis, …) makes one quota for all of them. Calls of
    /// one process still wait in arrival order per key; each reservation
    /// and each settlement is one step on the store (the settlement is sent
    /// beside the response, which does not wait for it). With a store,
    /// `poll_ready` only forwards the inner service's readiness, also with a
    /// fixed [`key`](Self::key): every call waits in its response future.
    /// A call dropped while its reservation is on the wire may leave that
    /// reservation spent. See [`stores::quota`](crate::stores::quota).
    pub fn store(self, store: impl QuotaStore) -> Self {
        let store: Arc<dyn QuotaStore> = Arc::new(store);
        self.with(|c| c.store = Some(store))
    }

    /// What a call does when the quota store fails (default
    /// [`FailPolicy::Closed`]: it fails with `UNAVAILABLE`).
    pub fn on_store_error(self, policy: FailPolicy) -> Self {
        self.with(|c| c.on_store_error = policy)
    }

    /// Checks the limits, as building the first service does.
    ///
    /// # Errors
    ///
    /// [`AgentError::Config`] if a limit has an amount of zero or a zero
    /// interval.
    pub fn validate(&self) -> Result<(), AgentError> {
        self.limiter()
            .map(drop)
            .map_err(|message| AgentError::Config(message.to_string()))
    }

    /// The shared quota, made on first use; or why the limits are invalid.
    pub(super) fn limiter(&self) -> Result<Arc<Limiter>, Arc<str>> {
        self.limiter
            .get_or_init(|| {
                self.config
                    .check()
                    .map(|()| Arc::new(Limiter::new(self.config.clone())))
                    .map_err(Arc::from)
            })
            .clone()
    }
}

impl Default for ModelRateLimitLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ModelRateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelRateLimitLayer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for ModelRateLimitLayer {
    type Service = ModelRateLimit<S>;

    fn layer(&self, inner: S) -> ModelRateLimit<S> {
        ModelRateLimit::new(inner, self.limiter())
    }
}
