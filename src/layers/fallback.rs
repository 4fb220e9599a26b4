//! Fall back to the next model when a provider fails.
//!
//! [`Fallback`] sends a [`ModelCall`] to its inner service; when that fails
//! with a provider's passing trouble ([`is_transient`]: unavailable,
//! rate-limited, timed out, 5xx), it tries the next [`Target`] in order:
//!
//! - [`Target::model`]: the same inner service, with `request.model`
//!   rewritten (several models on one provider);
//! - [`Target::service`] / [`Target::service_as`]: another model service
//!   (another provider), optionally with its own model name.
//!
//! Any other failure (invalid request, auth, context length, a tripwire…)
//! returns at once: another model would not fix it. Every layer inside the
//! fallback runs again for each model, since the fallback wraps the services.
//!
//! Each switch:
//! - asks the run's hooks first ([`before_model_switch`](crate::hooks::before_model_switch)); a
//!   `false` blocks it and the call fails with the last error;
//! - withdraws from the [`RetryBudget`], if one is given (the same handle as
//!   the retry layer's, so retry and fallback draw on one pool); an empty
//!   budget fails the call with the last error;
//! - is skipped when the call streamed a delta to the run's sink already (the
//!   next model would repeat text the user saw);
//! - emits [`AgentEvent::FallbackUsed`].
//!
//! The answering model is in `response.model` (set to the model sent when the
//! service leaves it empty). When every model fails, the error is
//! [`FallbackExhausted`], listing each model and its error; it classifies as
//! its last error (its `source()`), so the run reports e.g.
//! `PROVIDER_UNAVAILABLE`.
//!
//! Each model service records the usage of the calls that reached it; the
//! fallback records nothing, so a run's usage counts every model tried, once.
//!
//! # Example
//!
//! ```
//! use tower::ServiceBuilder;
//! use tower_agent::layers::fallback::FallbackLayer;
//! use tower_agent::{Agent, ErrorKind, ScriptedModel, ScriptedTurn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_agent::AgentError> {
//! // One provider serving two models; the big one is down.
//! let provider = ScriptedModel::from_fn(|request| match request.model.as_str() {
//!     "big" => ScriptedTurn::error(ErrorKind::Unavailable, "overloaded"),
//!     model => ScriptedTurn::text(format!("{model} here")),
//! });
//! let model = ServiceBuilder::new()
//!     .layer(FallbackLayer::new().models(["small"]))
//!     .service(provider);
//!
//! let agent = Agent::builder("assistant").model(model).model_name("big").build()?;
//! let run = agent.run("Hi").await?;
//! assert_eq!(run.output, "small here");
//! # Ok(()) }
//! ```
//!
//! [`AgentEvent::FallbackUsed`]: crate::event::AgentEvent::FallbackUsed

use std::sync::Arc;
use std::task::{Context, Poll};

use tower::{Layer, Service, ServiceExt};

use self::error::{FallbackAttempt, FallbackExhausted};
use crate::error::{kind_of, BoxError};
use crate::event::AgentEvent;
use crate::layers::retry::{is_transient, RetryBudget, RetryRequest};
use crate::request::ModelCall;
use crate::types::{ModelName, ModelResponse};

/// Where a call goes next: see the [module docs](self).
#[derive(Debug, Clone)]
pub struct Target<S> {
    model: Option<String>,
    service: Option<S>,
}

impl<S> Target<S> {
    /// The inner service, asked for model `name`.
    pub fn model(name: impl Into<String>) -> Self {
        Self {
            model: Some(name.into()),
            service: None,
        }
    }

    /// Another service, with the request's model name unchanged.
    pub fn service(service: S) -> Self {
        Self {
            model: None,
            service: Some(service),
        }
    }

    /// Another service, asked for model `name`.
    pub fn service_as(name: impl Into<String>, service: S) -> Self {
        Self {
            model: Some(name.into()),
            service: Some(service),
        }
    }
}

/// Wraps a model service in [`Fallback`]. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct FallbackLayer<S> {
    targets: Vec<Target<S>>,
    budget: Option<RetryBudget>,
}

impl<S> FallbackLayer<S> {
    /// A layer with no targets yet (calls go to the inner service only), and
    /// no budget: add targets with [`models`](Self::models),
    /// [`model`](Self::model), [`service`](Self::service),
    /// [`service_as`](Self::service_as) or [`target`](Self::target).
    pub fn new() -> Self {
        Self {
            targets: Vec::new(),
            budget: None,
        }
    }

    /// Then falls back to each of `models`, in order, on the inner service.
    pub fn models<I>(mut self, models: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.targets.extend(models.into_iter().map(Target::model));
        self
    }

    /// Then falls back to `target`.
    pub fn target(mut self, target: Target<S>) -> Self {
        self.targets.push(target);
        self
    }

    /// Then falls back to model `name` on the inner service.
    pub fn model(self, name: impl Into<String>) -> Self {
        self.target(Target::model(name))
    }

    /// Then falls back to `service`.
    pub fn service(self, service: S) -> Self {
        self.target(Target::service(service))
    }

    /// Then falls back to `service`, asked for model `name`.
    pub fn service_as(self, name: impl Into<String>, service: S) -> Self {
        self.target(Target::service_as(name, service))
    }

    /// Draws every switch from `budget` (share it with the retry layer).
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.budget = Some(budget);
        self
    }
}

impl<S> Default for FallbackLayer<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Clone> Layer<S> for FallbackLayer<S> {
    type Service = Fallback<S>;

    fn layer(&self, inner: S) -> Fallback<S> {
        let fallback = Fallback::new(inner, self.targets.iter().cloned());
        match &self.budget {
            Some(budget) => fallback.budget(budget.clone()),
            None => fallback,
        }
    }
}

#[derive(Debug, Clone)]
struct Resolved<S> {
    model: Option<ModelName>,
    service: S,
}

/// What a call needs once its first model failed: one handle per call.
#[derive(Debug, Clone)]
struct Chain<S> {
    targets: Box<[Resolved<S>]>,
    budget: Option<RetryBudget>,
}

/// Tries a model service, then each [`Target`] in order, while they fail
/// with provider errors. See the [module docs](self).
///
/// A call that the first model answers costs a copy of the call (one
/// reference count) and one handle to the targets.
///
/// # Clone
///
/// Clones share the targets and the budget.
#[derive(Debug, Clone)]
pub struct Fallback<S> {
    inner: S,
    chain: Arc<Chain<S>>,
}

impl<S: Clone> Fallback<S> {
    /// Sends calls to `inner`, then to each of `targets`.
    pub fn new(inner: S, targets: impl IntoIterator<Item = Target<S>>) -> Self {
        let targets = targets
            .into_iter()
            .map(|t| Resolved {
                model: t.model.map(ModelName::from),
                service: t.service.unwrap_or_else(|| inner.clone()),
            })
            .collect();
        Self {
            inner,
            chain: Arc::new(Chain {
                targets,
                budget: None,
            }),
        }
    }

    /// Draws every switch from `budget`.
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        Arc::make_mut(&mut self.chain).budget = Some(budget);
        self
    }
}

impl<S> Fallback<S> {
    /// The model names of the targets (`None`: the request's own).
    pub fn target_models(&self) -> impl Iterator<Item = Option<&str>> {
        self.chain.targets.iter().map(|t| t.model.as_deref())
    }

    inner_accessors!(inner: S);
}

fn label(model: &str) -> String {
    if model.is_empty() {
        "(default)".to_owned()
    } else {
        model.to_owned()
    }
}

fn answered(mut response: ModelResponse, sent: &str) -> ModelResponse {
    name_answer(&mut response, sent);
    response
}

/// Names the model sent in a response that names none.
#[inline]
fn name_answer(response: &mut ModelResponse, sent: &str) {
    if response.model.is_empty() {
        response.model = sent.into();
    }
}

impl<S> Service<ModelCall> for Fallback<S>
where
    S: Service<ModelCall, Response = ModelResponse> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = future::ResponseFuture<S>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, mut call: ModelCall) -> Self::Future {
        if self.chain.targets.is_empty() {
            return future::ResponseFuture::new(self.inner.call(call), None);
        }
        call.guard();
        if let Some(budget) = &self.chain.budget {
            budget.deposit_once(&mut call.extensions);
        }
        // The inner service was made ready by `poll_ready`: call it now. The
        // rest of the chain runs only if this first call fails.
        let first = self.inner.call(call.clone());
        let rest = Rest {
            call,
            chain: self.chain.clone(),
        };
        future::ResponseFuture::new(first, Some(rest))
    }
}

/// What the chain needs once the first model failed.
struct Rest<S> {
    call: ModelCall,
    chain: Arc<Chain<S>>,
}

impl<S> Rest<S>
where
    S: Service<ModelCall, Response = ModelResponse> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    /// Tries each target in turn, the first model having failed with `err`.
    async fn run(self, err: BoxError) -> Result<ModelResponse, BoxError> {
        let Rest { call, chain } = self;
        let (targets, budget) = (&chain.targets, &chain.budget);
        let ctx = call.context.clone();
        let mut sent = call.request.model.clone();
        let mut result: Result<ModelResponse, BoxError> = Err(err);
        let mut attempts = Vec::new();
        for target in targets.iter() {
            let err = match result {
                Ok(response) => return Ok(answered(response, &sent)),
                Err(err) => err,
            };
            if !is_transient(err.as_ref()) || !call.replay_safe() || ctx.is_cancelled() {
                return Err(err);
            }
            let next_model = target.model.as_ref().unwrap_or(&call.request.model);
            let (from, to) = (label(&sent), label(next_model));
            if !crate::hooks::before_model_switch(&ctx, &from, &to).await? {
                tracing::debug!(%from, %to, "a hook blocked the model switch");
                return Err(err);
            }
            if budget.as_ref().is_some_and(|b| !b.withdraw()) {
                tracing::debug!(%from, %to, "the retry budget is spent: no fallback");
                return Err(err);
            }
            let code = kind_of(err.as_ref()).code();
            tracing::debug!(%from, %to, code, error = %err, "falling back");
            ctx.emit(|| AgentEvent::FallbackUsed {
                run_id: ctx.run_id().clone(),
                from: from.as_str().into(),
                to: to.into(),
                code,
            });
            attempts.push(FallbackAttempt::new(from, err));
            let mut next = call.clone();
            next.request.model = next_model.clone();
            sent = next_model.clone();
            result = target
                .service
                .clone()
                .oneshot(next)
                .await
                .map_err(Into::into);
        }
        match result {
            Ok(response) => Ok(answered(response, &sent)),
            Err(err) if !is_transient(err.as_ref()) => Err(err),
            Err(err) => {
                attempts.push(FallbackAttempt::new(label(&sent), err));
                Err(FallbackExhausted::new(attempts).into())
            }
        }
    }
}

/// The future of [`Fallback`].
pub mod future {
    use std::fmt;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{ready, Context, Poll};

    use pin_project_lite::pin_project;
    use tower::Service;

    use super::{name_answer, Rest};
    use crate::error::BoxError;
    use crate::future::BoxResponseFuture;
    use crate::request::ModelCall;
    use crate::types::ModelResponse;

    pin_project! {
        /// The response future of [`Fallback`](super::Fallback): the first
        /// model's call, unboxed; the rest of the chain (boxed) only after
        /// it failed.
        pub struct ResponseFuture<S>
        where
            S: Service<ModelCall>,
        {
            #[pin]
            state: State<S>,
        }
    }

    pin_project! {
        #[project = StateProj]
        enum State<S>
        where
            S: Service<ModelCall>,
        {
            First {
                #[pin]
                future: S::Future,
                rest: Option<Rest<S>>,
            },
            Rest {
                future: BoxResponseFuture<ModelResponse>,
            },
        }
    }

    impl<S> ResponseFuture<S>
    where
        S: Service<ModelCall>,
    {
        #[inline]
        pub(super) fn new(future: S::Future, rest: Option<Rest<S>>) -> Self {
            Self {
                state: State::First { future, rest },
            }
        }
    }

    impl<S> Future for ResponseFuture<S>
    where
        S: Service<ModelCall, Response = ModelResponse> + Clone + Send + Sync + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        type Output = Result<ModelResponse, BoxError>;

        #[inline]
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let mut state = self.project().state;
            loop {
                match state.as_mut().project() {
                    StateProj::First { future, rest } => {
                        let mut result: Result<ModelResponse, BoxError> =
                            ready!(future.poll(cx)).map_err(Into::into);
                        let Some(rest) = rest.take() else {
                            return Poll::Ready(result);
                        };
                        if let Ok(response) = &mut result {
                            name_answer(response, &rest.call.request.model);
                            return Poll::Ready(result);
                        }
                        if let Err(err) = result {
                            let future = BoxResponseFuture::new(rest.run(err));
                            state.set(State::Rest { future });
                        }
                    }
                    StateProj::Rest { future } => return Pin::new(future).poll(cx),
                }
            }
        }
    }

    impl<S> fmt::Debug for ResponseFuture<S>
    where
        S: Service<ModelCall>,
    {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("ResponseFuture").finish_non_exhaustive()
        }
    }
}

/// The error of [`Fallback`] when every model failed.
pub mod error {
    use std::error::Error as StdError;
    use std::fmt;

    use crate::error::{kind_of, BoxError, ErrorKind};

    /// One model's failure in a [`FallbackExhausted`].
    #[derive(Debug)]
    pub struct FallbackAttempt {
        model: String,
        error: BoxError,
    }

    impl FallbackAttempt {
        pub(super) fn new(model: String, error: BoxError) -> Self {
            Self { model, error }
        }

        /// The model tried (`(default)` for a request naming none).
        pub fn model(&self) -> &str {
            &self.model
        }

        /// How it failed.
        pub fn error(&self) -> &BoxError {
            &self.error
        }
    }

    /// Every model of a [`Fallback`](super::Fallback) failed.
    ///
    /// Its `source()` is the last model's error, so it classifies as that
    /// error does: [`kind`](Self::kind), `AgentError::classify` and
    /// `kind_of` all see e.g. `RATE_LIMITED`.
    #[derive(Debug)]
    pub struct FallbackExhausted {
        attempts: Vec<FallbackAttempt>,
    }

    impl FallbackExhausted {
        /// `attempts` must not be empty.
        pub(super) fn new(attempts: Vec<FallbackAttempt>) -> Self {
            debug_assert!(!attempts.is_empty());
            Self { attempts }
        }

        /// Each model tried and its error, in order.
        pub fn attempts(&self) -> &[FallbackAttempt] {
            &self.attempts
        }

        /// The kind of the last model's error.
        pub fn kind(&self) -> ErrorKind {
            self.attempts
                .last()
                .map_or(ErrorKind::Other, |a| kind_of(a.error.as_ref()))
        }
    }

    impl fmt::Display for FallbackExhausted {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("every model failed: ")?;
            for (i, attempt) in self.attempts.iter().enumerate() {
                if i > 0 {
                    f.write_str("; ")?;
                }
                write!(f, "{}: {}", attempt.model, attempt.error)?;
            }
            Ok(())
        }
    }

    impl StdError for FallbackExhausted {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.attempts
                .last()
                .map(|a| a.error.as_ref() as &(dyn StdError + 'static))
        }
    }
}
