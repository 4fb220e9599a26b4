//! The futures of [`LlmRetry`](super::LlmRetry).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tower::retry::Policy;
use tower::Service;

use super::{RetryPolicy, RetryRequest, Shared};
use crate::error::BoxError;

pin_project! {
    /// The response future of [`LlmRetry`](super::LlmRetry).
    ///
    /// Until an attempt fails it holds the attempt, the request's copy and a
    /// handle to what the layer's calls share, and nothing else; the policy's
    /// state, the wait and every later attempt live in one box made at the
    /// first failure.
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        attempt: Attempt<S, Req>,
    }
}

pin_project! {
    #[project = AttemptProj]
    enum Attempt<S, Req>
    where
        S: Service<Req>,
    {
        // The first attempt in flight.
        First {
            #[pin]
            future: S::Future,
            // The copy a retry sends; `None` when no retry may follow.
            request: Option<Req>,
            shared: Arc<Shared<S>>,
        },
        // The first attempt failed and is being retried.
        Retrying {
            retrying: Pin<Box<Retrying<S, Req>>>,
        },
    }
}

pin_project! {
    /// A call after its first failure.
    struct Retrying<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S::Future, S>,
        // The copy the next attempt sends; `None` once no retry may follow.
        request: Option<Req>,
        shared: Arc<Shared<S>>,
        // This call's attempts.
        policy: RetryPolicy,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, S> {
        // The wait before the next attempt.
        Waiting {
            #[pin]
            delay: Delay,
        },
        // A fresh clone of the service, being driven to readiness.
        Readying {
            service: S,
        },
        // A retry in flight.
        Called {
            #[pin]
            future: F,
        },
    }
}

impl<S, Req> ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    #[inline(always)]
    pub(super) fn new(future: S::Future, request: Option<Req>, shared: Arc<Shared<S>>) -> Self {
        Self {
            attempt: Attempt::First {
                future,
                request,
                shared,
            },
        }
    }
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    Req: RetryRequest,
{
    type Output = Result<S::Response, BoxError>;

    // Inlined: the first attempt's answer goes straight to the caller.
    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut attempt = self.project().attempt;
        let retrying = match attempt.as_mut().project() {
            AttemptProj::First {
                future,
                request,
                shared,
            } => {
                // A success goes straight out: no policy, copy or error
                // conversion is touched.
                let err = match ready!(future.poll(cx)) {
                    Ok(response) => return Poll::Ready(Ok(response)),
                    Err(err) => err.into(),
                };
                match Retrying::start(request.take(), shared, err) {
                    Ok(retrying) => retrying,
                    Err(result) => return Poll::Ready(result),
                }
            }
            AttemptProj::Retrying { retrying } => return retrying.as_mut().poll(cx),
        };
        attempt.set(Attempt::Retrying { retrying });
        let AttemptProj::Retrying { retrying } = attempt.project() else {
            unreachable!("the attempt was just set to retrying")
        };
        retrying.as_mut().poll(cx)
    }
}

impl<S, Req> Retrying<S, Req>
where
    S: Service<Req> + Clone,
    Req: RetryRequest,
{
    /// What follows the first attempt's failure `err`: the wait before a
    /// retry, or the call's result when the policy gives up.
    #[cold]
    #[inline(never)]
    fn start(
        request: Option<Req>,
        shared: &Arc<Shared<S>>,
        err: BoxError,
    ) -> Result<Pin<Box<Self>>, Result<S::Response, BoxError>> {
        let Some(mut request) = request else {
            return Err(Err(err));
        };
        let mut policy = shared.policy.clone();
        let mut result = Err(err);
        match Policy::<Req, S::Response, BoxError>::retry(&mut policy, &mut request, &mut result) {
            Some(delay) => Ok(Box::pin(Retrying {
                state: State::Waiting { delay },
                request: Some(request),
                shared: shared.clone(),
                policy,
            })),
            None => Err(result),
        }
    }
}

impl<S, Req> Future for Retrying<S, Req>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    Req: RetryRequest,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Waiting { delay } => {
                    ready!(delay.poll(cx));
                    let service = this.shared.service.clone();
                    this.state.set(State::Readying { service });
                }
                StateProj::Readying { service } => {
                    if let Err(err) = ready!(service.poll_ready(cx)) {
                        return Poll::Ready(Err(err.into()));
                    }
                    let Some(request) = this.request.take() else {
                        // Unreachable: a retry is readied with its request.
                        return Poll::Ready(Err("the retry lost its request".into()));
                    };
                    *this.request =
                        Policy::<Req, S::Response, BoxError>::clone_request(this.policy, &request);
                    let future = service.call(request);
                    this.state.set(State::Called { future });
                }
                StateProj::Called { future } => {
                    let err = match ready!(future.poll(cx)) {
                        Ok(response) => return Poll::Ready(Ok(response)),
                        Err(err) => err.into(),
                    };
                    let Some(request) = this.request.as_mut() else {
                        return Poll::Ready(Err(err));
                    };
                    let mut result = Err(err);
                    match this.policy.retry(request, &mut result) {
                        Some(delay) => this.state.set(State::Waiting { delay }),
                        None => return Poll::Ready(result),
                    }
                }
            }
        }
    }
}

impl<S, Req> fmt::Debug for ResponseFuture<S, Req>
where
    S: Service<Req>,
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};
    use std::time::Duration;

    use tower::{Layer, Service, ServiceExt};
    use tower_test::mock;

    use crate::error::{BoxError, ProviderError};
    use crate::layers::retry::{Backoff, Jitter, LlmRetryLayer};
    use crate::types::{Message, ModelRequest, ModelResponse};
    use crate::{ModelCall, RunContext};

    fn layer() -> LlmRetryLayer {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        LlmRetryLayer::new().backoff(backoff.jitter(Jitter::None))
    }

    fn call() -> ModelCall {
        ModelCall::new(
            ModelRequest::new("m", vec![Message::user("hi")]),
            RunContext::new(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_sends_a_copy_sharing_the_calls_parts() {
        let (mut svc, mut handle) = mock::spawn_layer::<ModelCall, ModelResponse, _>(layer());
        assert!(svc.poll_ready().is_ready());
        let sent = call();
        let response = tokio::spawn(svc.call(sent.clone()));
        let (first, send) = handle.next_request().await.unwrap();
        send.send_error(ProviderError::unavailable("overloaded"));
        let (again, send) = handle.next_request().await.unwrap();
        send.send_response(ModelResponse::new("m", Message::assistant("ok")));
        assert_eq!(response.await.unwrap().unwrap().message.text(), "ok");
        assert!(ModelCall::ptr_eq(&first, &sent));
        assert!(ModelCall::ptr_eq(&again, &sent));
    }

    /// Fails its first call; records the version that answered each call.
    #[derive(Clone)]
    struct Versioned {
        version: u32,
        seen: Arc<Mutex<Vec<u32>>>,
    }

    impl Service<ModelCall> for Versioned {
        type Response = ModelResponse;
        type Error = BoxError;
        type Future = std::future::Ready<Result<ModelResponse, BoxError>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _call: ModelCall) -> Self::Future {
            let mut seen = self.seen.lock().unwrap();
            seen.push(self.version);
            std::future::ready(if seen.len() == 1 {
                Err(ProviderError::unavailable("overloaded").into())
            } else {
                Ok(ModelResponse::new("m", Message::assistant("ok")))
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_go_to_the_service_as_get_mut_left_it() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut svc = layer().layer(Versioned {
            version: 1,
            seen: seen.clone(),
        });
        svc.get_mut().version = 2;
        let response = svc.ready().await.unwrap().call(call()).await.unwrap();
        assert_eq!(response.message.text(), "ok");
        assert_eq!(*seen.lock().unwrap(), [2, 2]);
    }
}
