//! Bound each call by a timeout, the run's deadline and its cancellation.
//!
//! [`CallTimeout`] gives every call the shorter of the layer's timeout and the
//! time left to the run's deadline ([`RunContext::deadline`]), like tonic's
//! `grpc-timeout` takes the shorter of its own and the caller's. Cancelling
//! the run ([`RunContext::cancel`]) ends the call in flight at once, dropping
//! the inner future.
//!
//! | what happened | the error (boxed) | code |
//! | --- | --- | --- |
//! | the layer's timeout passed first | [`AgentError::Timeout`] from [`TimeoutSource::CallTimeout`] ([`TimeoutSource::Tool`] on a tool stack), `after` the timeout | `TIMEOUT` |
//! | the run's deadline passed first | [`AgentError::Timeout`] from [`TimeoutSource::RunDeadline`], `after` the run's age | `TIMEOUT` |
//! | the run was cancelled | [`AgentError::Cancelled`] | `CANCELLED` |
//!
//! The name keeps clear of tower's own `TimeoutLayer`, which composes into
//! the same stacks and knows nothing of the run.
//!
//! It is generic over any request carrying a [`RunContext`]
//! ([`HasContext`]), so one layer serves the model stack and the tool stack.
//! Inside an [`LlmRetryLayer`](crate::layers::retry::LlmRetryLayer) the timeout is per
//! attempt, and a timed-out attempt is retried.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_agent::error::TimeoutSource;
//! use tower_agent::layers::timeout::CallTimeoutLayer;
//! use tower_agent::{Agent, AgentError, ScriptedModel, ScriptedTurn};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), AgentError> {
//! let model = ServiceBuilder::new()
//!     .layer(CallTimeoutLayer::new(Duration::from_secs(20)))
//!     .service(ScriptedModel::new([ScriptedTurn::text("late").delay(Duration::from_secs(60))]));
//!
//! let agent = Agent::builder("slow").model(model).build()?;
//! let err = agent.run("Hi").await.unwrap_err();
//! assert_eq!(err.code(), "TIMEOUT");
//! assert!(matches!(err, AgentError::Timeout { timer: TimeoutSource::CallTimeout, .. }));
//! assert_eq!(err.to_string(), "timed out: the call timeout fired after 20s");
//! # Ok(()) }
//! ```
//!
//! [`RunContext`]: crate::RunContext
//! [`RunContext::deadline`]: crate::RunContext::deadline
//! [`RunContext::cancel`]: crate::RunContext::cancel
//! [`AgentError::Cancelled`]: crate::AgentError::Cancelled
//! [`AgentError::Timeout`]: crate::AgentError::Timeout
//! [`TimeoutSource::CallTimeout`]: crate::error::TimeoutSource::CallTimeout
//! [`TimeoutSource::Tool`]: crate::error::TimeoutSource::Tool
//! [`TimeoutSource::RunDeadline`]: crate::error::TimeoutSource::RunDeadline

use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower::{Layer, Service};

use crate::error::BoxError;
use crate::request::HasContext;

/// Wraps a service in [`CallTimeout`]. See the [module docs](self).
#[derive(Debug, Clone, Copy)]
pub struct CallTimeoutLayer {
    timeout: Option<Duration>,
}

impl CallTimeoutLayer {
    /// Each call gets at most `timeout`, and no more than the run has left.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout: Some(timeout),
        }
    }

    /// Each call gets what the run has left to its deadline (no limit
    /// without one), and ends when the run is cancelled.
    pub fn deadline() -> Self {
        Self { timeout: None }
    }

    /// Each call gets at most `timeout` (replacing the one given before).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

impl<S> Layer<S> for CallTimeoutLayer {
    type Service = CallTimeout<S>;

    fn layer(&self, inner: S) -> CallTimeout<S> {
        CallTimeout {
            inner,
            timeout: self.timeout,
        }
    }
}

/// Ends a call at its timeout, the run's deadline or the run's cancellation,
/// whichever comes first. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct CallTimeout<S> {
    inner: S,
    timeout: Option<Duration>,
}

impl<S> CallTimeout<S> {
    /// Wraps `inner`, giving each call at most `timeout`.
    pub fn new(inner: S, timeout: Duration) -> Self {
        CallTimeoutLayer::new(timeout).layer(inner)
    }

    /// Wraps `inner`, bounding each call by the run's deadline only.
    pub fn deadline(inner: S) -> Self {
        CallTimeoutLayer::deadline().layer(inner)
    }

    /// The per-call timeout, if any.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    inner_accessors!(inner: S);
}

impl<S, Req> Service<Req> for CallTimeout<S>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    Req: HasContext,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = future::ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        let ctx = req.context();
        if ctx.is_cancelled() {
            return future::ResponseFuture::cancelled();
        }
        let own = self.timeout.map(|t| (Instant::now() + t, t));
        // The layer's own timeout wins a tie: it is the one configured here.
        let (until, timer) = match (own, ctx.deadline()) {
            (Some((at, _)), Some(run)) if run < at => (Some(run), future::Timer::Run),
            (Some((at, t)), _) => (Some(at), future::Timer::Own(req.call_timer(), t)),
            (None, run) => (run, future::Timer::Run),
        };
        let ctx = ctx.clone();
        future::ResponseFuture::new(self.inner.call(req), until, timer, ctx)
    }
}

/// The future of [`CallTimeout`].
pub mod future {
    use std::fmt;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{ready, Context, Poll};
    use std::time::Duration;

    use pin_project_lite::pin_project;
    use tokio::time::{Instant, Sleep};
    use tokio_util::sync::WaitForCancellationFutureOwned;

    use crate::context::RunContext;
    use crate::error::{AgentError, BoxError, TimeoutSource};

    /// Which timer `until` is.
    #[derive(Debug, Clone, Copy)]
    pub(super) enum Timer {
        /// The layer's own timeout, reported as this source.
        Own(TimeoutSource, Duration),
        /// The run's deadline.
        Run,
    }

    pin_project! {
        /// The response future of [`CallTimeout`](super::CallTimeout).
        ///
        /// The timer and the cancellation watch are armed only when the
        /// inner future first waits (in one allocation, off the future's
        /// own size): a call that answers at once costs neither. The
        /// deadline still counts from the call.
        pub struct ResponseFuture<F> {
            #[pin]
            kind: Kind<F>,
        }
    }

    pin_project! {
        #[project = KindProj]
        enum Kind<F> {
            Running {
                #[pin]
                inner: F,
                until: Option<Instant>,
                timer: Timer,
                ctx: RunContext,
                armed: Option<Pin<Box<Armed>>>,
            },
            Cancelled,
        }
    }

    pin_project! {
        /// What a waiting call watches besides its inner future.
        struct Armed {
            #[pin]
            cancelled: WaitForCancellationFutureOwned,
            #[pin]
            sleep: Option<Sleep>,
        }
    }

    impl<F> ResponseFuture<F> {
        #[inline]
        pub(super) fn new(inner: F, until: Option<Instant>, timer: Timer, ctx: RunContext) -> Self {
            Self {
                kind: Kind::Running {
                    inner,
                    until,
                    timer,
                    ctx,
                    armed: None,
                },
            }
        }

        pub(super) fn cancelled() -> Self {
            Self {
                kind: Kind::Cancelled,
            }
        }
    }

    impl<F> fmt::Debug for ResponseFuture<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("ResponseFuture").finish_non_exhaustive()
        }
    }

    impl<F, T, E> Future for ResponseFuture<F>
    where
        F: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        type Output = Result<T, BoxError>;

        #[inline]
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let KindProj::Running {
                inner,
                until,
                timer,
                ctx,
                armed,
            } = self.project().kind.project()
            else {
                return Poll::Ready(Err(AgentError::Cancelled.into()));
            };
            if let Some(armed) = armed.as_mut() {
                if armed.as_mut().project().cancelled.poll(cx).is_ready() {
                    return Poll::Ready(Err(AgentError::Cancelled.into()));
                }
            }
            if let Poll::Ready(result) = inner.poll(cx) {
                return Poll::Ready(result.map_err(Into::into));
            }
            let armed = match armed {
                Some(armed) => armed,
                // The first wait: arm the cancellation watch and the timer.
                None => {
                    let armed = armed.insert(Box::pin(Armed {
                        cancelled: ctx.cancellation_token().clone().cancelled_owned(),
                        sleep: until.map(tokio::time::sleep_until),
                    }));
                    if armed.as_mut().project().cancelled.poll(cx).is_ready() {
                        return Poll::Ready(Err(AgentError::Cancelled.into()));
                    }
                    armed
                }
            };
            match armed.as_mut().project().sleep.as_pin_mut() {
                Some(sleep) => {
                    ready!(sleep.poll(cx));
                    let (timer, after) = match *timer {
                        Timer::Own(source, after) => (source, after),
                        Timer::Run => (TimeoutSource::RunDeadline, ctx.elapsed()),
                    };
                    let after = Some(after);
                    Poll::Ready(Err(AgentError::Timeout { timer, after }.into()))
                }
                None => Poll::Pending,
            }
        }
    }
}
