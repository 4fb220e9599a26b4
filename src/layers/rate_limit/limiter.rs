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
//! per call: the `Waiter` and `Ticket` of a call hold it, so settling,
//! releasing and leaving go straight to it. The first key a layer sees (the
//! only one, for a layer bound to one model) is found without the map. A
//! call admitted at once takes the lock once: its settlement is posted
//! without it (see [`posts`](super::posts)) and applied by whoever takes
//! the lock next.
//!
//! A key nobody holds whose buckets are full is what a fresh key would be:
//! such idle keys leave the map when it grows past its sweep mark, so the
//! map holds the keys in use plus at most about `idle_keys` others.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

use super::bucket::{Bucket, Epoch, Grant};
use super::limits::{Config, EstimateFn, KeyFn, Limits};
pub(super) use super::need::Need;
use super::need::TextMemo;
use super::pool::{Drawn, Pool, Word, TOKENS_MAX};
use super::posts::{self, InFlight, Posts};
use super::remote::Remote;
use crate::request::ModelCall;
use crate::tokens::{request_tokens, TokenCounters};
use crate::types::ModelName;

struct Queued {
    id: u64,
    requests: u64,
    tokens: u64,
    waker: Option<Waker>,
}

/// What a call takes: its request and token grants, and the slot its
/// settlement is posted in.
pub(super) type Taken = (Option<Grant>, Option<Grant>, Option<u8>);

struct KeyState {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    /// Callers already holding a request slot (`requests == 0`) first, each
    /// group in arrival order.
    queue: VecDeque<Queued>,
    holders: usize,
    next_id: u64,
    /// The token grants of calls whose settlement is posted without the
    /// lock.
    inflight: InFlight,
    /// What is published for the lock-free path, and the closed pools with
    /// calls out.
    pool: Pool,
}

impl KeyState {
    /// Refills to `now`, takes the lock-free pool back and charges what it
    /// drew, then applies the settlements posted since the lock was last
    /// taken. All as of now: the pool may have admitted calls since the
    /// last update, so neither its draws nor a posted charge may be dated
    /// back to where the refill since would cover them (a refund bounded as
    /// of now is bounded at least as tightly as when it was posted).
    fn catch_up(&mut self, posts: &Posts, word: &Word, now: u64) {
        self.refill(now);
        self.pool
            .absorb(word, self.requests.as_mut(), self.tokens.as_mut());
        if self.inflight.any() && self.inflight.apply(posts, self.tokens.as_mut()) {
            self.wake_head();
        }
    }

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

    /// Takes `requests` and `tokens`; the token grant holds a slot to post
    /// its settlement in, when one is free.
    fn take(&mut self, requests: u64, tokens: u64) -> Taken {
        let take = |bucket: &mut Option<Bucket>, n: u64| match bucket {
            Some(b) if n > 0 => Some(b.take(n)),
            _ => None,
        };
        let request_grant = take(&mut self.requests, requests);
        let token_grant = take(&mut self.tokens, tokens);
        let slot = token_grant.and_then(|grant| self.inflight.hold(grant));
        (request_grant, token_grant, slot)
    }

    /// Takes one request and `tokens` (cut to the whole token limit) if
    /// nobody is queued and both fit: what [`fits`](Self::fits) and
    /// [`take`](Self::take) do for a call that holds nothing, in one pass.
    /// Keeps no request grant.
    #[inline]
    fn admit_now(&mut self, tokens: u64) -> Option<(Option<Grant>, Option<u8>)> {
        if !self.queue.is_empty() {
            return None;
        }
        let request = match &self.requests {
            Some(b) if !b.holds_one() => return None,
            b => b.is_some(),
        };
        let tokens = match &self.tokens {
            // A call needing no tokens is not held back by a bucket in
            // debt, but still settles what it used.
            Some(b) => {
                let need = b.need(tokens);
                if tokens > 0 && !b.holds_scaled(need) {
                    return None;
                }
                Some(need)
            }
            None => None,
        };
        if request {
            if let Some(b) = &mut self.requests {
                b.take_one();
            }
        }
        let grant = match (tokens, &mut self.tokens) {
            (Some(need), Some(b)) => b.take_scaled(need),
            _ => return Some((None, None)),
        };
        Some((Some(grant), self.inflight.hold(grant)))
    }

    /// Whether the key is what a fresh one would be: full buckets, nobody
    /// queued.
    fn is_idle(&self) -> bool {
        if !self.queue.is_empty() || self.holders > 0 {
            return false;
        }
        if self.inflight.any() || self.pool.any_out() {
            return false;
        }
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
    /// The lock-free pool (see [`pool`](super::pool)).
    word: Word,
    /// The token limit's amount: what a need is cut to. `None` without a
    /// token limit.
    token_amount: Option<u64>,
    /// The text size of the last history estimated, by lineage and length
    /// (which fix its messages): a run's calls of one key mostly ask again
    /// for the same history, or for it grown.
    memo: TextMemo,
    /// What the buckets' times count from: the key's creation.
    epoch: Epoch,
    state: Mutex<KeyState>,
    /// Settlements posted without `state`'s lock.
    posts: Posts,
}

/// A key's state under its lock, brought up to now. Dropped, it publishes
/// a new lock-free pool if nobody is queued.
struct Locked<'a> {
    word: &'a Word,
    state: MutexGuard<'a, KeyState>,
}

impl Deref for Locked<'_> {
    type Target = KeyState;

    fn deref(&self) -> &KeyState {
        &self.state
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut KeyState {
        &mut self.state
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let state = &mut *self.state;
        if state.queue.is_empty() {
            state
                .pool
                .publish(self.word, state.requests.as_ref(), state.tokens.as_ref());
        }
    }
}

impl KeyShared {
    fn new(key: Arc<str>, limits: Limits, created: Instant) -> Self {
        let epoch = Epoch::new(created);
        let now = 0;
        Self {
            key,
            word: Word::default(),
            token_amount: limits.token_rate().map(|r| r.amount()),
            memo: TextMemo::new(),
            epoch,
            state: Mutex::new(KeyState {
                requests: limits.request_rate().map(|r| Bucket::new(r, now)),
                tokens: limits.token_rate().map(|r| Bucket::new(r, now)),
                queue: VecDeque::new(),
                holders: 0,
                next_id: 0,
                inflight: InFlight::default(),
                pool: Pool::default(),
            }),
            posts: Posts::new(),
        }
    }

    /// The key's name.
    pub(super) fn key(&self) -> &str {
        &self.key
    }

    /// Whether the key is what a fresh one would be at `now`.
    fn is_idle(&self, now: Instant) -> bool {
        self.lock(self.epoch.nanos(now)).is_idle()
    }

    /// The key's state under its lock, brought up to `now`: the posted
    /// settlements applied, the lock-free pool taken back.
    fn lock(&self, now: u64) -> Locked<'_> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.catch_up(&self.posts, &self.word, now);
        Locked {
            word: &self.word,
            state,
        }
    }

    /// The tokens `need` comes to, cut to the whole token limit.
    #[inline]
    pub(super) fn tokens(&self, need: Need<'_>) -> u64 {
        match self.token_amount {
            Some(amount) => self.memo.tokens(need).min(amount),
            None => 0,
        }
    }

    /// Admits a call needing `tokens` (as [`tokens`](Self::tokens) says)
    /// from the lock-free pool, if it holds one request and them: no lock,
    /// no clock. `None`: take the lock ([`enter_call`](Self::enter_call)).
    #[inline]
    pub(super) fn draw(&self, tokens: u64) -> Option<Drawn> {
        if tokens > TOKENS_MAX {
            return None;
        }
        self.word.draw(tokens)
    }

    /// Settles a call drawn from the lock-free pool: `actual` tokens used
    /// (`None`: it keeps what it drew). Without the lock while its pool is
    /// open.
    #[inline]
    pub(super) fn settle_drawn(&self, drawn: Drawn, actual: Option<u64>) {
        let actual = actual.filter(|_| self.token_amount.is_some());
        if !self.word.settle(drawn, actual) {
            self.settle_late(drawn, actual);
        }
    }

    /// [`settle_drawn`](Self::settle_drawn) once the pool was closed.
    #[cold]
    #[inline(never)]
    fn settle_late(&self, drawn: Drawn, actual: Option<u64>) {
        let now = self.epoch.now();
        let mut state = self.lock(now);
        let state = &mut *state;
        if state
            .pool
            .settle_late(drawn, actual, state.tokens.as_mut(), now)
        {
            state.wake_head();
        }
    }

    /// Arrives at the key's queue needing `requests` (0 for a caller that
    /// already holds its request slot) and `tokens`.
    ///
    /// # Errors
    ///
    /// When the call would wait longer than `max_wait`: how long it would
    /// wait. Nothing is taken or queued then.
    pub(super) fn enter(
        &self,
        requests: u64,
        tokens: u64,
        max_wait: Duration,
    ) -> Result<Entered, Duration> {
        let state = self.lock(self.epoch.now());
        self.enter_locked(state, requests, tokens, max_wait)
    }

    /// [`enter`](Self::enter) for a call that holds nothing: one request
    /// and `tokens` (as [`tokens`](Self::tokens) says). Admitted at once,
    /// it keeps no request grant (the call goes out at once, which spends
    /// the request).
    pub(super) fn enter_call(&self, tokens: u64, max_wait: Duration) -> Result<Entered, Duration> {
        let mut state = self.lock(self.epoch.now());
        if let Some((grant, slot)) = state.admit_now(tokens) {
            drop(state);
            return Ok(Entered::Admitted((None, grant, slot)));
        }
        self.enter_locked(state, 1, tokens, max_wait)
    }

    fn enter_locked(
        &self,
        mut state: Locked<'_>,
        requests: u64,
        tokens: u64,
        max_wait: Duration,
    ) -> Result<Entered, Duration> {
        let requests = state.requests.as_ref().map_or(0, |b| b.clamp(requests));
        let tokens = state.tokens.as_ref().map_or(0, |b| b.clamp(tokens));
        let holder = requests == 0;
        let position = if holder {
            state.holders
        } else {
            state.queue.len()
        };
        if position == 0 && state.fits(requests, tokens) {
            let taken = state.take(requests, tokens);
            drop(state);
            return Ok(Entered::Admitted(taken));
        }
        let wait = state.wait_at(position, requests, tokens);
        if wait > max_wait {
            drop(state);
            return Err(wait);
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
        self.posts.set_waiting(true);
        if holder {
            state.holders += 1;
        }
        drop(state);
        Ok(Entered::Queued(id))
    }

    /// Admits waiter `id` if it is the head and its needs fit; otherwise
    /// keeps its waker, and says until when the head must wait.
    pub(super) fn poll_admit(&self, id: u64, waker: &Waker) -> Admit {
        let now = self.epoch.now();
        let mut state = self.lock(now);
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
        let taken = state.take(requests, tokens);
        state.queue.pop_front();
        if requests == 0 {
            state.holders -= 1;
        }
        if state.queue.is_empty() {
            self.posts.set_waiting(false);
        }
        state.wake_head();
        Admit::Admitted(taken)
    }

    pub(super) fn leave(&self, id: u64) {
        let mut state = self.lock(self.epoch.now());
        if let Some(index) = state.queue.iter().position(|q| q.id == id) {
            if let Some(left) = state.queue.remove(index) {
                if left.requests == 0 {
                    state.holders -= 1;
                }
            }
            if state.queue.is_empty() {
                self.posts.set_waiting(false);
            }
            if index == 0 {
                state.wake_head();
            }
        }
    }

    pub(super) fn release(
        &self,
        requests: Option<&Grant>,
        tokens: Option<&Grant>,
        slot: Option<u8>,
    ) {
        let now = self.epoch.now();
        let mut state = self.lock(now);
        if let Some(slot) = slot {
            state.inflight.free(slot);
        }
        if let (Some(bucket), Some(grant)) = (&mut state.requests, requests) {
            bucket.refund(grant, grant.amount, now);
        }
        if let (Some(bucket), Some(grant)) = (&mut state.tokens, tokens) {
            bucket.refund(grant, grant.amount, now);
        }
        state.wake_head();
    }

    /// Charges or refunds the difference between `actual` and what `grant`
    /// reserved, under the lock: for a call that holds no slot.
    pub(super) fn settle(&self, grant: &Grant, actual: u64) {
        if actual == grant.amount {
            return;
        }
        let now = self.epoch.now();
        let mut guard = self.lock(now);
        let state = &mut *guard;
        let Some(bucket) = &mut state.tokens else {
            return;
        };
        if posts::settle(bucket, grant, actual, now) {
            state.wake_head();
        }
    }

    /// Posts the settlement of the call holding `slot` without the lock or
    /// the clock (`None`: the reservation is kept); takes the lock only if a
    /// call is queued, to apply it and let the head go, or if it `charges`
    /// beyond the reservation: the lock-free pool must not admit anyone on
    /// top of a debt it does not see.
    pub(super) fn post(&self, slot: u8, actual: Option<u64>, charges: bool) {
        if self.posts.post(slot, actual) || charges {
            drop(self.lock(self.epoch.now()));
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
    /// The model name the first key was found by, when keyed by model: a
    /// call whose name shares its storage (a clone of it, as the calls of a
    /// run or of an agent have) is of the first key, with no string
    /// compared. Held, so its storage cannot be reused by another name.
    first_name: OnceLock<ModelName>,
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

/// Where a call stands once it entered its key's queue.
pub(super) enum Entered {
    /// Admitted at once, with what it took.
    Admitted(Taken),
    /// Queued under this id.
    Queued(u64),
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
            first_name: OnceLock::new(),
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

    /// Admits `call` from its key's lock-free pool: its key and what it
    /// drew. Otherwise its key and its tokens, for the lock to decide.
    #[inline]
    pub(super) fn draw(
        &self,
        call: &ModelCall,
    ) -> Result<(Arc<KeyShared>, Drawn), (Arc<KeyShared>, u64)> {
        let key = self.key_of(call);
        let tokens = key.tokens(self.need(call));
        match key.draw(tokens) {
            Some(drawn) => Ok((key, drawn)),
            None => Err((key, tokens)),
        }
    }

    /// The state of `call`'s key: the fixed key, the key function's, or the
    /// model.
    #[inline]
    pub(super) fn key_of(&self, call: &ModelCall) -> Arc<KeyShared> {
        if let (None, None, Some(first)) = (&self.fixed_key, &self.key_fn, self.first_of(call)) {
            return first.clone();
        }
        self.key_of_any(call)
    }

    /// The first key, if `call`'s model name shares its storage.
    #[inline]
    fn first_of(&self, call: &ModelCall) -> Option<&Arc<KeyShared>> {
        let name = self.first_name.get()?;
        let (a, b) = (name.as_str(), call.request.model.as_str());
        if std::ptr::eq(a, b) {
            self.first.get()
        } else {
            None
        }
    }

    #[inline(never)]
    fn key_of_any(&self, call: &ModelCall) -> Arc<KeyShared> {
        if let Some(key) = &self.fixed_key {
            return self.key(key);
        }
        match &self.key_fn {
            Some(f) => self.key(&f(call)),
            None => self.key_of_model(&call.request.model),
        }
    }

    /// The state of the key `model`.
    fn key_of_model(&self, model: &ModelName) -> Arc<KeyShared> {
        let key = self.key(model);
        if self.first_name.get().is_none()
            && self
                .first
                .get()
                .is_some_and(|first| Arc::ptr_eq(first, &key))
        {
            let _ = self.first_name.set(model.clone());
        }
        key
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
        match self.need(call) {
            Need::Tokens(tokens) => tokens,
            Need::Text { messages, output } => {
                messages.text_len().div_ceil(4).saturating_add(output)
            }
        }
    }

    /// What [`estimate`](Self::estimate) says, or its parts when the text
    /// is to be measured.
    #[inline]
    pub(super) fn need<'a>(&self, call: &'a ModelCall) -> Need<'a> {
        let request = &call.request;
        if let Some(f) = &self.estimate {
            return Need::Tokens(f(request));
        }
        let output = request
            .settings
            .max_tokens
            .map_or(self.default_output_tokens, u64::from);
        match &self.counters {
            Some(counters) => Need::Tokens(
                request_tokens(&call.context, counters, request).saturating_add(output),
            ),
            None => Need::Text {
                messages: &request.messages,
                output,
            },
        }
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

/// What polling a waiter's place in the queue comes to.
pub(super) enum Admit {
    Admitted(Taken),
    NotHead,
    WaitUntil(Instant),
    /// The entry is not queued (cannot happen while its waiter lives).
    Gone,
}
