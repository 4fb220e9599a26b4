//! The shared quota: per key, a request [`Bucket`], a token bucket and one
//! FIFO queue of the calls waiting for them.
//!
//! A call is admitted when it is at the head of its key's queue and both
//! buckets hold what it needs; admission takes it from both at once. Only
//! the head waits on a timer (until the buckets will hold enough); the
//! others wait to become the head. Refunds and releases wake the head, which
//! checks again.
//!
//! Each key's state sits behind its own lock in a [`KeyShared`], found once
//! per call: the [`Waiter`] and [`Ticket`] of a call hold it, so settling,
//! releasing and leaving go straight to it. The first key a layer sees (the
//! only one, for a layer bound to one model) is found without the map.
//!
//! A key nobody holds whose buckets are full is what a fresh key would be:
//! such idle keys leave the map when it grows past its sweep mark, so the
//! map holds the keys in use plus at most about `idle_keys` others.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use super::bucket::{Bucket, Epoch, Grant};
use super::limits::{Config, EstimateFn, KeyFn, Limits};
use super::remote::Remote;
use crate::request::ModelCall;
use crate::tokens::{request_tokens, TokenCounters};

struct Queued {
    id: u64,
    requests: u64,
    tokens: u64,
    waker: Option<Waker>,
}

struct KeyState {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    /// Callers already holding a request slot (`requests == 0`) first, each
    /// group in arrival order.
    queue: VecDeque<Queued>,
    holders: usize,
    next_id: u64,
}

impl KeyState {
    fn refill(&mut self, now: u64) {
        if let Some(b) = &mut self.requests {
            b.refill(now);
        }
        if let Some(b) = &mut self.tokens {
            b.refill(now);
        }
    }

    /// How long until `requests` and `tokens` fit after everything queued
    /// at or before `position` (an estimate: settlements may change it).
    fn wait_at(&self, position: usize, requests: u64, tokens: u64) -> Duration {
        let (r, t) = match position {
            0 => (requests, tokens),
            _ => self
                .queue
                .iter()
                .take(position)
                .fold((requests, tokens), |(r, t), q| {
                    (r + q.requests, t + q.tokens)
                }),
        };
        let wait = |bucket: &Option<Bucket>, n: u64| match bucket {
            Some(b) if n > 0 => b.time_for(b.scaled(n)),
            _ => Duration::ZERO,
        };
        wait(&self.requests, r).max(wait(&self.tokens, t))
    }

    /// Whether `requests` and `tokens` fit now: `wait_at(0, ..)` is zero.
    fn fits(&self, requests: u64, tokens: u64) -> bool {
        let holds = |bucket: &Option<Bucket>, n: u64| match bucket {
            Some(b) if n > 0 => b.holds(n),
            _ => true,
        };
        holds(&self.requests, requests) && holds(&self.tokens, tokens)
    }

    fn take(&mut self, requests: u64, tokens: u64) -> (Option<Grant>, Option<Grant>) {
        let take = |bucket: &mut Option<Bucket>, n: u64| match bucket {
            Some(b) if n > 0 => Some(b.take(n)),
            _ => None,
        };
        (
            take(&mut self.requests, requests),
            take(&mut self.tokens, tokens),
        )
    }

    /// Whether the key is what a fresh one would be: full buckets, nobody
    /// queued.
    fn is_idle(&mut self, now: u64) -> bool {
        if !self.queue.is_empty() || self.holders > 0 {
            return false;
        }
        self.refill(now);
        self.requests.as_ref().is_none_or(Bucket::is_full)
            && self.tokens.as_ref().is_none_or(Bucket::is_full)
    }

    fn wake_head(&mut self) {
        if let Some(waker) = self.queue.front_mut().and_then(|q| q.waker.take()) {
            waker.wake();
        }
    }
}

/// One key's quota and queue, shared by the limiter and every call of that
/// key that waits or holds a part of the quota.
pub(super) struct KeyShared {
    key: Arc<str>,
    /// What the buckets' times count from: the key's creation.
    epoch: Epoch,
    state: Mutex<KeyState>,
}

impl KeyShared {
    fn new(key: Arc<str>, limits: Limits, created: Instant) -> Self {
        let epoch = Epoch::new(created);
        let now = 0;
        Self {
            key,
            epoch,
            state: Mutex::new(KeyState {
                requests: limits.request_rate().map(|r| Bucket::new(r, now)),
                tokens: limits.token_rate().map(|r| Bucket::new(r, now)),
                queue: VecDeque::new(),
                holders: 0,
                next_id: 0,
            }),
        }
    }

    /// The key's name.
    pub(super) fn key(&self) -> &str {
        &self.key
    }

    /// Whether the key is what a fresh one would be at `now`.
    fn is_idle(&self, now: Instant) -> bool {
        self.state().is_idle(self.epoch.nanos(now))
    }

    fn state(&self) -> MutexGuard<'_, KeyState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Arrives at the key's queue needing `requests` (0 for a caller that
    /// already holds its request slot) and `tokens`.
    ///
    /// # Errors
    ///
    /// When the call would wait longer than `max_wait`: the key and how
    /// long the call would wait. Nothing is taken or queued then.
    pub(super) fn arrive(
        self: Arc<Self>,
        requests: u64,
        tokens: u64,
        max_wait: Duration,
    ) -> Result<Arrival, Refused> {
        let now = self.epoch.now();
        let mut state = self.state();
        state.refill(now);
        let requests = state.requests.as_ref().map_or(0, |b| b.clamp(requests));
        let tokens = state.tokens.as_ref().map_or(0, |b| b.clamp(tokens));
        let holder = requests == 0;
        let position = if holder {
            state.holders
        } else {
            state.queue.len()
        };
        if position == 0 && state.fits(requests, tokens) {
            let (request_grant, token_grant) = state.take(requests, tokens);
            drop(state);
            return Ok(Arrival::Admitted(Ticket::new(
                self,
                request_grant,
                token_grant,
            )));
        }
        let wait = state.wait_at(position, requests, tokens);
        if wait > max_wait {
            drop(state);
            return Err(Refused {
                key: self,
                retry_after: wait,
            });
        }
        let id = state.next_id;
        state.next_id += 1;
        let queued = Queued {
            id,
            requests,
            tokens,
            waker: None,
        };
        state.queue.insert(position, queued);
        if holder {
            state.holders += 1;
        }
        drop(state);
        Ok(Arrival::Queued(Waiter {
            shared: self,
            id,
            sleep: None,
            admitted: false,
        }))
    }

    /// Admits waiter `id` if it is the head and its needs fit; otherwise
    /// keeps its waker, and says until when the head must wait.
    fn poll_admit(&self, id: u64, waker: &Waker) -> Admit {
        let now = self.epoch.now();
        let mut state = self.state();
        state.refill(now);
        let Some(index) = state.queue.iter().position(|q| q.id == id) else {
            return Admit::Gone;
        };
        let entry = &mut state.queue[index];
        match &entry.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => entry.waker = Some(waker.clone()),
        }
        if index > 0 {
            return Admit::NotHead;
        }
        let (requests, tokens) = (entry.requests, entry.tokens);
        let wait = state.wait_at(0, requests, tokens);
        if !wait.is_zero() {
            let wait = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
            return Admit::WaitUntil(self.epoch.instant(now.saturating_add(wait)));
        }
        let (request_grant, token_grant) = state.take(requests, tokens);
        state.queue.pop_front();
        if requests == 0 {
            state.holders -= 1;
        }
        state.wake_head();
        Admit::Admitted(request_grant, token_grant)
    }

    fn leave(&self, id: u64) {
        let mut state = self.state();
        if let Some(index) = state.queue.iter().position(|q| q.id == id) {
            if let Some(left) = state.queue.remove(index) {
                if left.requests == 0 {
                    state.holders -= 1;
                }
            }
            if index == 0 {
                state.wake_head();
            }
        }
    }

    fn release(&self, requests: Option<&Grant>, tokens: Option<&Grant>) {
        let now = self.epoch.now();
        let mut state = self.state();
        state.refill(now);
        if let (Some(bucket), Some(grant)) = (&mut state.requests, requests) {
            bucket.refund(grant, grant.amount, now);
        }
        if let (Some(bucket), Some(grant)) = (&mut state.tokens, tokens) {
            bucket.refund(grant, grant.amount, now);
        }
        state.wake_head();
    }

    /// Charges or refunds the difference between `actual` and what `grant`
    /// reserved. Only the token bucket is brought up to date: catching the
    /// request bucket up now or at its next use comes to the same level.
    fn settle(&self, grant: &Grant, actual: u64) {
        if actual == grant.amount {
            return;
        }
        let now = self.epoch.now();
        let mut state = self.state();
        let Some(bucket) = &mut state.tokens else {
            return;
        };
        bucket.refill(now);
        if actual > grant.amount {
            bucket.charge(actual - grant.amount);
        } else {
            bucket.refund(grant, grant.amount - actual, now);
            state.wake_head();
        }
    }
}

/// The configuration and the state every clone of a layer and of its
/// services shares.
pub(super) struct Limiter {
    pub(super) default: Limits,
    pub(super) per_key: HashMap<String, Limits>,
    pub(super) max_wait: Duration,
    pub(super) fixed_key: Option<String>,
    pub(super) key_fn: Option<Arc<KeyFn>>,
    pub(super) estimate: Option<Arc<EstimateFn>>,
    pub(super) default_output_tokens: u64,
    counters: Option<TokenCounters>,
    idle_keys: usize,
    /// The quota behind a store, when the layer was given one: then the
    /// in-memory keys below are not used.
    pub(super) remote: Option<Arc<Remote>>,
    /// The first key seen, read without a lock. Set only under `keys`'
    /// lock, and never also in `keys`.
    first: OnceLock<Arc<KeyShared>>,
    /// Every other key.
    keys: Mutex<Keys>,
}

/// The keys after the first, and when to sweep the idle ones out.
#[derive(Default)]
struct Keys {
    map: HashMap<Arc<str>, Arc<KeyShared>>,
    /// Sweep when the map reaches this many keys.
    sweep_at: usize,
}

impl Keys {
    /// Drops every key that only the map holds and that is idle. The next
    /// sweep comes once the map has doubled (or grown by `idle_keys`), so
    /// sweeping costs O(1) per new key.
    fn sweep(&mut self, idle_keys: usize, now: Instant) {
        self.map
            .retain(|_, shared| Arc::strong_count(shared) > 1 || !shared.is_idle(now));
        self.sweep_at = self.map.len() + self.map.len().max(idle_keys);
    }
}

/// A call refused on arrival: it would wait longer than it may.
pub(super) struct Refused {
    pub(super) key: Arc<KeyShared>,
    pub(super) retry_after: Duration,
}

/// The outcome of arriving at a key's queue.
pub(super) enum Arrival {
    /// Admitted at once.
    Admitted(Ticket),
    /// Queued: poll the waiter until it is admitted.
    Queued(Waiter),
}

impl Limiter {
    pub(super) fn new(config: Config) -> Self {
        Self {
            idle_keys: config.idle_keys.max(1),
            remote: config
                .store
                .map(|store| Arc::new(Remote::new(store, config.on_store_error, config.idle_keys))),
            default: config.default,
            per_key: config.per_key,
            max_wait: config.max_wait,
            fixed_key: config.fixed_key,
            key_fn: config.key_fn,
            estimate: config.estimate,
            default_output_tokens: config.default_output_tokens,
            counters: config.counters,
            first: OnceLock::new(),
            keys: Mutex::new(Keys {
                map: HashMap::new(),
                sweep_at: config.idle_keys.max(1),
            }),
        }
    }

    /// How many keys the limiter holds, the first included.
    #[cfg(test)]
    pub(super) fn key_count(&self) -> usize {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.map.len() + usize::from(self.first.get().is_some())
    }

    /// The state of `key`, created (with full buckets) on first use.
    pub(super) fn key(&self, key: &str) -> Arc<KeyShared> {
        match self.first.get() {
            Some(first) if *first.key == *key => first.clone(),
            _ => self.key_locked(key),
        }
    }

    fn key_locked(&self, key: &str) -> Arc<KeyShared> {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        // Another thread may have set `first` since it was read.
        if let Some(first) = self.first.get().filter(|first| *first.key == *key) {
            return first.clone();
        }
        if let Some(shared) = keys.map.get(key) {
            return shared.clone();
        }
        let now = Instant::now();
        let limits = self.per_key.get(key).copied().unwrap_or(self.default);
        let shared = Arc::new(KeyShared::new(Arc::from(key), limits, now));
        if let Err(shared) = self.first.set(shared.clone()) {
            if keys.map.len() >= keys.sweep_at {
                keys.sweep(self.idle_keys, now);
            }
            keys.map.insert(shared.key.clone(), shared);
        }
        shared
    }

    /// The state of `call`'s key: the fixed key, the key function's, or the
    /// model.
    pub(super) fn key_of(&self, call: &ModelCall) -> Arc<KeyShared> {
        if let Some(key) = &self.fixed_key {
            return self.key(key);
        }
        match &self.key_fn {
            Some(f) => self.key(&f(call)),
            None => self.key(&call.request.model),
        }
    }

    /// The name of `call`'s key, and its limits (for a store-backed quota).
    pub(super) fn name_of(&self, call: &ModelCall) -> (String, Limits) {
        let key = match (&self.fixed_key, &self.key_fn) {
            (Some(key), _) => key.clone(),
            (None, Some(f)) => f(call),
            (None, None) => call.request.model.to_string(),
        };
        let limits = self.per_key.get(&key).copied().unwrap_or(self.default);
        (key, limits)
    }

    /// The tokens `call` is expected to take: its input (counted by the
    /// model's counter, or its text at four bytes a token) plus
    /// `max_tokens` (or the default output estimate).
    pub(super) fn estimate(&self, call: &ModelCall) -> u64 {
        let request = &call.request;
        if let Some(f) = &self.estimate {
            return f(request);
        }
        let input = match &self.counters {
            Some(counters) => request_tokens(&call.context, counters, request),
            None => request.messages.text_len().div_ceil(4),
        };
        input.saturating_add(
            request
                .settings
                .max_tokens
                .map_or(self.default_output_tokens, u64::from),
        )
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("default", &self.default)
            .field("per_key", &self.per_key)
            .field("max_wait", &self.max_wait)
            .field("fixed_key", &self.fixed_key)
            .field("default_output_tokens", &self.default_output_tokens)
            .finish_non_exhaustive()
    }
}

enum Admit {
    Admitted(Option<Grant>, Option<Grant>),
    NotHead,
    WaitUntil(Instant),
    /// The entry is not queued (cannot happen while its waiter lives).
    Gone,
}

/// A place in a key's queue. Dropped before admission, it leaves the queue.
pub(super) struct Waiter {
    shared: Arc<KeyShared>,
    id: u64,
    sleep: Option<Pin<Box<Sleep>>>,
    admitted: bool,
}

impl Waiter {
    /// The key's name.
    pub(super) fn key(&self) -> &str {
        self.shared.key()
    }

    /// Resolves once admitted.
    pub(super) fn poll_admitted(&mut self, cx: &mut Context<'_>) -> Poll<Ticket> {
        loop {
            match self.shared.poll_admit(self.id, cx.waker()) {
                Admit::Admitted(requests, tokens) => {
                    self.admitted = true;
                    let ticket = Ticket::new(self.shared.clone(), requests, tokens);
                    return Poll::Ready(ticket);
                }
                Admit::Gone => {
                    // Not queued: admit with nothing held rather than hang.
                    self.admitted = true;
                    return Poll::Ready(Ticket::new(self.shared.clone(), None, None));
                }
                Admit::NotHead => return Poll::Pending,
                Admit::WaitUntil(deadline) => {
                    let sleep = match &mut self.sleep {
                        Some(sleep) => {
                            sleep.as_mut().reset(deadline);
                            sleep
                        }
                        None => self
                            .sleep
                            .insert(Box::pin(tokio::time::sleep_until(deadline))),
                    };
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
            }
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if !self.admitted {
            self.shared.leave(self.id);
        }
    }
}

impl fmt::Debug for Waiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiter")
            .field("key", &self.key())
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// What one call holds of a key's quota. Dropped before the call was sent,
/// it gives it back; once sent, its tokens are settled with the real usage,
/// or kept as reserved if the call failed.
pub(super) struct Ticket {
    /// `None` once sent: the ticket is then a [`Settlement`].
    shared: Option<Arc<KeyShared>>,
    requests: Option<Grant>,
    tokens: Option<Grant>,
}

impl Ticket {
    fn new(shared: Arc<KeyShared>, requests: Option<Grant>, tokens: Option<Grant>) -> Self {
        Self {
            shared: Some(shared),
            requests,
            tokens,
        }
    }

    /// The state of the ticket's key.
    pub(super) fn shared(&self) -> &Arc<KeyShared> {
        self.shared
            .as_ref()
            .expect("a ticket holds its key until it is sent")
    }

    /// The key's name.
    pub(super) fn key(&self) -> &str {
        self.shared().key()
    }

    /// Takes over what `other` (of the same key) holds.
    pub(super) fn merge(&mut self, mut other: Ticket) {
        self.requests = self.requests.or(other.requests.take());
        self.tokens = self.tokens.or(other.tokens.take());
    }

    /// The call went out: from now on the reservation is kept, and only
    /// the tokens are settled, with the response's usage.
    pub(super) fn send(mut self) -> Settlement {
        Settlement {
            shared: self.shared.take().expect("a ticket is sent once"),
            tokens: self.tokens.take(),
        }
    }
}

/// What a call that went out still has to settle: its token reservation.
/// Smaller than its [`Ticket`], as it moves with the response future.
pub(super) struct Settlement {
    shared: Arc<KeyShared>,
    tokens: Option<Grant>,
}

impl Settlement {
    /// Charges the difference between the real token count and the
    /// reservation, or refunds it. Once: the tokens are then settled.
    pub(super) fn settle(&mut self, actual_tokens: u64) {
        if let Some(grant) = self.tokens.take() {
            self.shared.settle(&grant, actual_tokens);
        }
    }
}

impl fmt::Debug for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settlement")
            .field("key", &self.shared.key())
            .field("tokens", &self.tokens.map(|g| g.amount))
            .finish()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            if self.requests.is_some() || self.tokens.is_some() {
                shared.release(self.requests.as_ref(), self.tokens.as_ref());
            }
        }
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("key", &self.shared.as_ref().map(|shared| shared.key()))
            .field("requests", &self.requests.map(|g| g.amount))
            .field("tokens", &self.tokens.map(|g| g.amount))
            .finish()
    }
}
