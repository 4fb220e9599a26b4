//! [`ServiceBuilderExt`]: shortcuts for this crate's layers.

use std::time::Duration;

use tower::layer::util::Stack;
use tower::ServiceBuilder;

use super::cache::CacheLayer;
use super::circuit_breaker::CircuitBreakerLayer;
use super::fallback::FallbackLayer;
use super::pii::MaskPiiLayer;
use super::rate_limit::ModelRateLimitLayer;
use super::retry::LlmRetryLayer;
use super::timeout::CallTimeoutLayer;

mod sealed {
    pub trait Sealed {}
    impl<L> Sealed for tower::ServiceBuilder<L> {}
}

/// Shortcuts for this crate's layers on tower's
/// `ServiceBuilder`.
///
/// The names do not shadow `ServiceBuilder`'s own methods (`retry`,
/// `timeout`, `rate_limit`, …), which stay available for tower's layers.
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_agent::layers::ServiceBuilderExt;
/// use tower_agent::layers::cache::CacheLayer;
/// use tower_agent::layers::pii::MaskPiiLayer;
/// use tower_agent::layers::retry::LlmRetryLayer;
/// use tower_agent::{Agent, ScriptedModel, ScriptedTurn};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), tower_agent::AgentError> {
/// let model = ServiceBuilder::new()
///     .llm_retry(LlmRetryLayer::new().max_attempts(4))
///     .call_timeout(Duration::from_secs(30))
///     .fallback_models(["backup-model"])
///     .response_cache(CacheLayer::new())
///     .mask_pii(MaskPiiLayer::default())
///     .service(ScriptedModel::new([ScriptedTurn::text("Hello!")]));
/// let agent = Agent::builder("assistant").model(model).build()?;
/// assert_eq!(agent.run("Hi").await?.output, "Hello!");
/// # Ok(()) }
/// ```
pub trait ServiceBuilderExt<L>: sealed::Sealed + Sized {
    /// Retries transient provider errors: [`LlmRetryLayer`]. Takes the layer
    /// or a [`RetryPolicy`](super::retry::RetryPolicy).
    fn llm_retry(self, layer: impl Into<LlmRetryLayer>) -> ServiceBuilder<Stack<LlmRetryLayer, L>>;

    /// A per-call timeout bounded by the run's deadline, ending at once on
    /// cancellation: [`CallTimeoutLayer::new`].
    fn call_timeout(self, timeout: Duration) -> ServiceBuilder<Stack<CallTimeoutLayer, L>>;

    /// The run's deadline and cancellation only: [`CallTimeoutLayer::deadline`].
    fn run_deadline(self) -> ServiceBuilder<Stack<CallTimeoutLayer, L>>;

    /// Falls back to other models or services: [`FallbackLayer`].
    fn fallback<S>(self, layer: FallbackLayer<S>) -> ServiceBuilder<Stack<FallbackLayer<S>, L>>;

    /// Falls back to other models of the same provider, in order:
    /// `FallbackLayer::new().models(models)`.
    fn fallback_models<S, I>(self, models: I) -> ServiceBuilder<Stack<FallbackLayer<S>, L>>
    where
        I: IntoIterator,
        I::Item: Into<String>;

    /// Answers identical calls from a store: [`CacheLayer`].
    fn response_cache(self, layer: CacheLayer) -> ServiceBuilder<Stack<CacheLayer, L>>;

    /// Requests and tokens per interval, one quota shared by every clone:
    /// [`ModelRateLimitLayer`].
    fn model_rate_limit(
        self,
        layer: ModelRateLimitLayer,
    ) -> ServiceBuilder<Stack<ModelRateLimitLayer, L>>;

    /// Masks PII in what the model reads and restores it in what it writes:
    /// [`MaskPiiLayer`]. Put it last (innermost).
    fn mask_pii(self, layer: MaskPiiLayer) -> ServiceBuilder<Stack<MaskPiiLayer, L>>;

    /// Refuses calls at once to a model whose provider keeps failing:
    /// [`CircuitBreakerLayer`]. Put it inside the fallback.
    fn circuit_breaker(
        self,
        layer: CircuitBreakerLayer,
    ) -> ServiceBuilder<Stack<CircuitBreakerLayer, L>>;
}

impl<L> ServiceBuilderExt<L> for ServiceBuilder<L> {
    fn llm_retry(self, layer: impl Into<LlmRetryLayer>) -> ServiceBuilder<Stack<LlmRetryLayer, L>> {
        self.layer(layer.into())
    }

    fn call_timeout(self, timeout: Duration) -> ServiceBuilder<Stack<CallTimeoutLayer, L>> {
        self.layer(CallTimeoutLayer::new(timeout))
    }

    fn run_deadline(self) -> ServiceBuilder<Stack<CallTimeoutLayer, L>> {
        self.layer(CallTimeoutLayer::deadline())
    }

    fn fallback<S>(self, layer: FallbackLayer<S>) -> ServiceBuilder<Stack<FallbackLayer<S>, L>> {
        self.layer(layer)
    }

    fn fallback_models<S, I>(self, models: I) -> ServiceBuilder<Stack<FallbackLayer<S>, L>>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.layer(FallbackLayer::new().models(models))
    }

    fn response_cache(self, layer: CacheLayer) -> ServiceBuilder<Stack<CacheLayer, L>> {
        self.layer(layer)
    }

    fn model_rate_limit(
        self,
        layer: ModelRateLimitLayer,
    ) -> ServiceBuilder<Stack<ModelRateLimitLayer, L>> {
        self.layer(layer)
    }

    fn mask_pii(self, layer: MaskPiiLayer) -> ServiceBuilder<Stack<MaskPiiLayer, L>> {
        self.layer(layer)
    }

    fn circuit_breaker(
        self,
        layer: CircuitBreakerLayer,
    ) -> ServiceBuilder<Stack<CircuitBreakerLayer, L>> {
        self.layer(layer)
    }
}
