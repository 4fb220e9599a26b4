//! One key's quota: its request [`Bucket`], its token bucket and the FIFO
//! queue of the calls waiting for them, behind the key's lock, beside the
//! lock-free pool and the posted settlements that need no lock.
//!
//! A call is admitted when it is at the head of its key's queue and both
//! buckets hold what it needs; admission takes it from both at once. Only
//! the head waits on a timer (until the buckets will hold enough); the
//! others wait to become the head. Refunds and releases wake the head, which
//! checks again.
//!
//! While nobody waits, a call with ample capacity takes neither the lock
//! nor the clock: it draws from the key's lock-free pool (see
//! [`pool`](super::pool)), which every locked step takes back first and
//! publishes again last. A call the pool cannot admit takes the lock once:
//! its settlement is posted without it (see [`posts`](super::posts)) and
//! applied by whoever takes the lock next.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

use super::bucket::{Bucket, Epoch, Grant};
use super::limits::Limits;
use super::need::{Need, TextMemo};
use super::pool::{Drawn, Pool, Word, TOKENS_MAX};
use super::posts::{self, InFlight, Posts};

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
    pub(super) key: Arc<str>,
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
    pub(super) fn new(key: Arc<str>, limits: Limits, created: Instant) -> Self {
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
    pub(super) fn is_idle(&self, now: Instant) -> bool {
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

/// Where a call stands once it entered its key's queue.
pub(super) enum Entered {
    /// Admitted at once, with what it took.
    Admitted(Taken),
    /// Queued under this id.
    Queued(u64),
}

/// What polling a waiter's place in the queue comes to.
pub(super) enum Admit {
    Admitted(Taken),
    NotHead,
    WaitUntil(Instant),
    /// The entry is not queued (cannot happen while its waiter lives).
    Gone,
}
