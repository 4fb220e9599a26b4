//! The quota behind a [`QuotaStore`]: each call reserves through the store
//! (one atomic step), and the calls of one process wait for it in arrival
//! order, per key.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::OwnedMutexGuard;
use tokio::time::{Instant, Sleep};

use crate::context::RunContext;
use crate::error::{BoxError, ProviderError, RateLimited};
use crate::stores::quota::{Limits, QuotaStore, Reservation};
use crate::stores::{report_failure, FailPolicy};

type Turn = Arc<tokio::sync::Mutex<()>>;

/// The store, what to do when it fails, and one FIFO turn per key.
pub(super) struct Remote {
    store: Arc<dyn QuotaStore>,
    policy: FailPolicy,
    idle_keys: usize,
    turns: Mutex<HashMap<Arc<str>, Turn>>,
}

impl Remote {
    pub(super) fn new(store: Arc<dyn QuotaStore>, policy: FailPolicy, idle_keys: usize) -> Self {
        Self {
            store,
            policy,
            idle_keys: idle_keys.max(1),
            turns: Mutex::new(HashMap::new()),
        }
    }

    /// The key's turn lock (tokio's mutex is fair: waiters go in order).
    fn turn(&self, key: &str) -> (Arc<str>, Turn) {
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((key, turn)) = turns.get_key_value(key) {
            return (key.clone(), turn.clone());
        }
        if turns.len() >= self.idle_keys {
            turns.retain(|_, turn| Arc::strong_count(turn) > 1);
        }
        let key: Arc<str> = Arc::from(key);
        let turn = Turn::default();
        turns.insert(key.clone(), turn.clone());
        (key, turn)
    }
}

impl fmt::Debug for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Remote")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// What an admitted call holds: its reserved tokens, to settle.
pub(super) struct RemoteTicket {
    store: Arc<dyn QuotaStore>,
    key: Arc<str>,
    limits: Limits,
    reserved: u64,
    ctx: Option<RunContext>,
}

impl RemoteTicket {
    /// The run whose events report a failed settlement.
    pub(super) fn for_run(mut self, ctx: &RunContext) -> Self {
        self.ctx = Some(ctx.clone());
        self
    }

    /// Settles the tokens with the real count, in the background: the
    /// response does not wait for the store.
    pub(super) fn settle(self, actual: u64) {
        if actual == self.reserved || self.limits.token_rate().is_none() {
            return;
        }
        let fut = self
            .store
            .settle(&self.key, self.limits, self.reserved, actual);
        let (key, ctx) = (self.key, self.ctx);
        let settle = async move {
            if let Err(e) = fut.await {
                match &ctx {
                    Some(ctx) => report_failure(ctx, "quota", "settle", &e, true),
                    None => tracing::warn!(key = %key, error = %e, "rate limit: settlement failed"),
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => drop(handle.spawn(settle)),
            Err(_) => tracing::warn!("rate limit: no tokio runtime to settle on"),
        }
    }
}

impl fmt::Debug for RemoteTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteTicket")
            .field("key", &self.key)
            .field("reserved", &self.reserved)
            .finish()
    }
}

/// A call on its way to admission: waits for its key's turn, then reserves
/// (and sleeps for the wait the store names) until admitted or refused.
pub(super) struct RemoteWait {
    remote: Arc<Remote>,
    key: Arc<str>,
    limits: Limits,
    tokens: u64,
    max_wait: Duration,
    started: Instant,
    turn: Option<Turn>,
    locking: Option<Pin<Box<dyn Future<Output = OwnedMutexGuard<()>> + Send>>>,
    guard: Option<OwnedMutexGuard<()>>,
    reserving: Option<BoxFuture<'static, Result<Reservation, BoxError>>>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl RemoteWait {
    pub(super) fn new(
        remote: Arc<Remote>,
        key: &str,
        limits: Limits,
        tokens: u64,
        max_wait: Duration,
    ) -> Self {
        let (key, turn) = remote.turn(key);
        Self {
            remote,
            key,
            limits,
            tokens,
            max_wait,
            started: Instant::now(),
            turn: Some(turn),
            locking: None,
            guard: None,
            reserving: None,
            sleep: None,
        }
    }

    pub(super) fn key(&self) -> &str {
        &self.key
    }

    /// Resolves with the ticket and how long the call waited, or the
    /// refusal.
    pub(super) fn poll_admitted(
        &mut self,
        cx: &mut Context<'_>,
        ctx: &RunContext,
    ) -> Poll<Result<(Option<RemoteTicket>, Duration), BoxError>> {
        if self.guard.is_none() {
            if let Some(turn) = self.turn.take() {
                self.locking = Some(Box::pin(turn.lock_owned()));
            }
            if let Some(locking) = &mut self.locking {
                self.guard = Some(ready!(locking.as_mut().poll(cx)));
                self.locking = None;
            }
        }
        loop {
            if let Some(sleep) = &mut self.sleep {
                ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            let reserving = self.reserving.get_or_insert_with(|| {
                self.remote
                    .store
                    .reserve(&self.key, self.limits, 1, self.tokens)
            });
            let answer = ready!(reserving.as_mut().poll(cx));
            self.reserving = None;
            let waited = self.started.elapsed();
            match answer {
                Ok(Reservation::Admitted { tokens }) => {
                    self.guard = None;
                    let ticket = RemoteTicket {
                        store: self.remote.store.clone(),
                        key: self.key.clone(),
                        limits: self.limits,
                        reserved: tokens,
                        ctx: None,
                    };
                    return Poll::Ready(Ok((Some(ticket), waited)));
                }
                Ok(Reservation::Wait(wait)) => {
                    if waited + wait > self.max_wait {
                        self.guard = None;
                        let refused = RateLimited::new(self.key.to_string(), wait);
                        return Poll::Ready(Err(refused.into()));
                    }
                    self.sleep = Some(Box::pin(tokio::time::sleep(wait)));
                }
                Err(e) => {
                    self.guard = None;
                    return Poll::Ready(match self.remote.policy {
                        FailPolicy::Open => {
                            report_failure(ctx, "quota", "reserve", &e, true);
                            Ok((None, waited))
                        }
                        FailPolicy::Closed => {
                            report_failure(ctx, "quota", "reserve", &e, false);
                            let message = format!("rate limit store for `{}`: {e}", self.key);
                            Err(ProviderError::unavailable(message).into())
                        }
                    });
                }
            }
        }
    }
}

impl fmt::Debug for RemoteWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteWait")
            .field("key", &self.key)
            .field("tokens", &self.tokens)
            .finish_non_exhaustive()
    }
}
