//! [`ModelRateLimit`]: the service the [`ModelRateLimitLayer`](super::ModelRateLimitLayer)
//! builds, and what its `poll_ready` holds for the next call.

use std::fmt;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower::Service;

use super::future;
use super::key::{Entered, KeyShared};
use super::limiter::Limiter;
use super::remote;
use super::ticket::{Arrival, Refused, Settlement, Ticket, Waiter};
use crate::error::BoxError;
use crate::error::RateLimited;
use crate::request::ModelCall;
use crate::types::ModelResponse;

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

/// Limits the requests and tokens of model calls. Built by
/// [`ModelRateLimitLayer`](super::ModelRateLimitLayer). See the
/// [module docs](super).
pub struct ModelRateLimit<S> {
    inner: S,
    /// The shared quota, or why the layer's limits are invalid.
    limiter: Result<Arc<Limiter>, Arc<str>>,
    slot: Slot,
}

impl<S> ModelRateLimit<S> {
    /// `inner` limited by `limiter` (or failing every call with why the
    /// limits are invalid).
    pub(super) fn new(inner: S, limiter: Result<Arc<Limiter>, Arc<str>>) -> Self {
        Self {
            inner,
            limiter,
            slot: Slot::Empty,
        }
    }

    inner_accessors!(inner: S);
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
                        Err(Refused { key, retry_after }) => Slot::Refused { key, retry_after },
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
        // Invalid limits fail the call (from its future), not readiness.
        let Ok(limiter) = &self.limiter else {
            return self.inner.poll_ready(cx).map_err(Into::into);
        };
        if let (Some(key), None) = (&limiter.fixed_key, &limiter.remote) {
            ready!(self.slot.poll_ready(limiter, key, cx));
            if matches!(self.slot, Slot::Refused { .. }) {
                // `call` answers with the refusal.
                return Poll::Ready(Ok(()));
            }
        }
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, call: ModelCall) -> future::ResponseFuture<S> {
        // An in-memory quota and nothing held from `poll_ready`: the path
        // of most calls, kept apart so it stays short.
        if let (Ok(limiter), Slot::Empty) = (&self.limiter, &self.slot) {
            if limiter.remote.is_none() {
                return match limiter.draw(&call) {
                    // Ample capacity: drawn from the lock-free pool. Call
                    // the service made ready right away.
                    Ok((key, drawn)) => future::ResponseFuture::called(
                        self.inner.call(call),
                        Settlement::drawn(key, drawn),
                    ),
                    Err((key, tokens)) => self.call_locked(call, key, tokens),
                };
            }
        }
        self.call_held(call)
    }
}

impl<S> ModelRateLimit<S>
where
    S: Service<ModelCall, Response = ModelResponse> + Clone,
    S::Error: Into<BoxError>,
{
    /// `call` for a call with a store-backed quota, or holding what
    /// `poll_ready` reserved, or with invalid limits.
    #[inline(never)]
    fn call_held(&mut self, call: ModelCall) -> future::ResponseFuture<S> {
        let limiter = match &self.limiter {
            Ok(limiter) => limiter,
            Err(message) => return future::ResponseFuture::invalid(message.clone()),
        };
        if let Some(remote) = &limiter.remote {
            let (key, limits) = limiter.name_of(&call);
            let tokens = limiter.estimate(&call);
            let mut max_wait = limiter.max_wait;
            if let Some(left) = call.context.remaining() {
                max_wait = max_wait.min(left);
            }
            let wait = remote::RemoteWait::new(remote.clone(), &key, limits, tokens, max_wait);
            let clone = self.inner.clone();
            let inner = std::mem::replace(&mut self.inner, clone);
            return future::ResponseFuture::remote(inner, call, wait);
        }
        let (held, waited) = match &self.slot {
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
            None => limiter.key_of(&call),
        };
        let tokens = limiter.estimate(&call);
        let mut max_wait = limiter.max_wait.saturating_sub(waited);
        if let Some(left) = call.context.remaining() {
            max_wait = max_wait.min(left);
        }
        let requests = u64::from(held.is_none());
        match key.arrive(requests, tokens, max_wait) {
            // A slot held from `poll_ready` is given back as `held` drops.
            Err(Refused { key, retry_after }) => {
                future::ResponseFuture::refused(RateLimited::new(key.key(), retry_after))
            }
            // Ample capacity and nothing to report: call the service made
            // ready right away.
            Ok(Arrival::Admitted(ticket)) if waited.is_zero() => {
                let ticket = Ticket::merged(held, ticket);
                future::ResponseFuture::called(self.inner.call(call), ticket.send())
            }
            Ok(arrival) => {
                let (waiter, held) = match arrival {
                    Arrival::Admitted(ticket) => (None, Some(Ticket::merged(held, ticket))),
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

    /// `call` with an in-memory quota and nothing held, when the lock-free
    /// pool could not admit it: reserves `tokens` and the request under
    /// `key`'s lock.
    #[inline(never)]
    fn call_locked(
        &mut self,
        call: ModelCall,
        key: Arc<KeyShared>,
        tokens: u64,
    ) -> future::ResponseFuture<S> {
        let Ok(limiter) = &self.limiter else {
            unreachable!("checked by `call`")
        };
        let max_wait = match call.context.remaining() {
            Some(left) => limiter.max_wait.min(left),
            None => limiter.max_wait,
        };
        match key.enter_call(tokens, max_wait) {
            Ok(Entered::Admitted((_, tokens, slot))) => {
                // Ample capacity: call the service made ready right away.
                // The request slot is spent as the call goes out; only the
                // tokens are settled.
                let settlement = Settlement::new(key, tokens, slot);
                future::ResponseFuture::called(self.inner.call(call), settlement)
            }
            Ok(Entered::Queued(id)) => {
                // The response future calls later: it takes the ready
                // service, and leaves a clone to be made ready.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                let waiter = Waiter::new(key, id);
                future::ResponseFuture::waiting(inner, call, Some(waiter), None, Duration::ZERO)
            }
            Err(retry_after) => {
                future::ResponseFuture::refused(RateLimited::new(key.key(), retry_after))
            }
        }
    }
}
