//! The [`ModelRateLimit`](super::ModelRateLimit) service's future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::Service;

use super::remote::{RemoteTicket, RemoteWait};
use super::ticket::{Settlement, Ticket, Waiter};
use crate::error::{AgentError, BoxError, RateLimited};
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
        // The layer's limits are invalid: every call fails.
        Invalid {
            message: Option<Arc<str>>,
        },
        // Boxed: only a call that waits (or reports a wait) comes here,
        // and the future of every other call stays small.
        Waiting {
            waiting: Box<Waiting<S>>,
        },
        // A quota behind a store: boxed, as every such call waits on it.
        Remote {
            waiting: Box<Remote<S>>,
        },
        Called {
            #[pin]
            fut: F,
            // Sent as the inner service was called; settled when it
            // answers.
            settle: Settle,
        },
    }
}

/// What a call that went out settles when its response arrives.
enum Settle {
    /// Nothing (a store that failed open).
    Nothing,
    /// Its in-memory reservation.
    Local(Settlement),
    /// Its reservation on a store (boxed: the in-memory path's future stays
    /// small).
    Remote(Box<RemoteTicket>),
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

/// A call waiting for a store-backed quota.
struct Remote<S> {
    wait: RemoteWait,
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

    pub(super) fn invalid(message: Arc<str>) -> Self {
        Self {
            state: State::Invalid {
                message: Some(message),
            },
        }
    }

    // Inlined, so the inner future is built in place rather than moved
    // through each constructor.
    #[inline(always)]
    pub(super) fn called(fut: S::Future, settlement: Settlement) -> Self {
        Self {
            state: State::Called {
                fut,
                settle: Settle::Local(settlement),
            },
        }
    }

    pub(super) fn remote(inner: S, call: ModelCall, wait: RemoteWait) -> Self {
        Self {
            state: State::Remote {
                waiting: Box::new(Remote {
                    wait,
                    call: Some(call),
                    inner,
                }),
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

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        // Called from `call`: the path of most calls, inlined.
        if let StateProj::Called { fut, settle } = state.as_mut().project() {
            return poll_called(fut, settle, cx);
        }
        poll_state(state, cx)
    }
}

/// Polls a future that is not (yet) calling its inner service.
#[inline(never)]
fn poll_state<S>(
    mut state: Pin<&mut State<S, S::Future>>,
    cx: &mut Context<'_>,
) -> Poll<Result<ModelResponse, BoxError>>
where
    S: Service<ModelCall, Response = ModelResponse>,
    S::Error: Into<BoxError>,
{
    loop {
        let fut = match state.as_mut().project() {
            StateProj::Refused { error } => {
                let err = error
                    .take()
                    .expect("ResponseFuture polled after completion");
                return Poll::Ready(Err(err.into()));
            }
            StateProj::Invalid { message } => {
                let message = message
                    .take()
                    .expect("ResponseFuture polled after completion");
                return Poll::Ready(Err(AgentError::Config(message.to_string()).into()));
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
                    *ticket = Some(Ticket::merged(ticket.take(), admitted));
                }
                let ticket = ticket.take().expect("admitted before the call");
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
                State::Called {
                    fut,
                    settle: Settle::Local(ticket.send()),
                }
            }
            StateProj::Remote { waiting } => {
                let Remote { wait, call, inner } = &mut **waiting;
                let ctx = &call.as_ref().expect("called once").context;
                let (ticket, waited) = match ready!(wait.poll_admitted(cx, ctx)) {
                    Ok(admitted) => admitted,
                    Err(refused) => return Poll::Ready(Err(refused)),
                };
                let call = call.take().expect("called once");
                let ticket = ticket.map(|ticket| ticket.for_run(&call.context));
                if !waited.is_zero() {
                    let ctx = &call.context;
                    ctx.emit(|| AgentEvent::RateLimitWait {
                        run_id: ctx.run_id().clone(),
                        key: wait.key().to_owned(),
                        waited,
                    });
                }
                State::Called {
                    fut: inner.call(call),
                    settle: match ticket {
                        Some(ticket) => Settle::Remote(Box::new(ticket)),
                        None => Settle::Nothing,
                    },
                }
            }
            StateProj::Called { fut, settle } => return poll_called(fut, settle, cx),
        };
        state.set(fut);
    }
}

/// Polls the inner call; settles what it reserved once it answers.
#[inline(always)]
fn poll_called<F, E>(
    fut: Pin<&mut F>,
    settle: &mut Settle,
    cx: &mut Context<'_>,
) -> Poll<Result<ModelResponse, BoxError>>
where
    F: Future<Output = Result<ModelResponse, E>>,
    E: Into<BoxError>,
{
    match fut.poll(cx) {
        Poll::Pending => Poll::Pending,
        Poll::Ready(Ok(response)) => {
            let actual = response.usage.total_tokens();
            match settle {
                Settle::Local(settlement) => settlement.settle(actual),
                Settle::Remote(_) => {
                    if let Settle::Remote(remote) = std::mem::replace(settle, Settle::Nothing) {
                        remote.settle(actual);
                    }
                }
                Settle::Nothing => {}
            }
            Poll::Ready(Ok(response))
        }
        // A failed call keeps its reservation.
        Poll::Ready(Err(err)) => Poll::Ready(Err(err.into())),
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
            State::Invalid { message } => f
                .debug_tuple("ResponseFuture::Invalid")
                .field(message)
                .finish(),
            State::Waiting { waiting } => f
                .debug_struct("ResponseFuture::Waiting")
                .field("waiter", &waiting.waiter)
                .finish_non_exhaustive(),
            State::Remote { waiting } => f
                .debug_struct("ResponseFuture::Remote")
                .field("wait", &waiting.wait)
                .finish_non_exhaustive(),
            State::Called { settle, .. } => {
                let mut called = f.debug_struct("ResponseFuture::Called");
                match settle {
                    Settle::Local(settlement) => called.field("settlement", settlement),
                    Settle::Remote(ticket) => called.field("remote", ticket),
                    Settle::Nothing => called.field("settlement", &"none"),
                };
                called.finish_non_exhaustive()
            }
        }
    }
}
