//! The rate limit's shared quota: [`Rate`] and [`Limits`], the
//! [`QuotaStore`] trait a quota shared by many processes sits behind, and
//! the in-memory [`MemoryQuotaStore`].
//!
//! The [`ModelRateLimitLayer`](crate::layers::rate_limit::ModelRateLimitLayer)
//! keeps its quota in memory, with its own FIFO queue per key, unless it is
//! given a store ([`store`](crate::layers::rate_limit::ModelRateLimitLayer::store)):
//! then each call reserves through the store (calls of one process still
//! queue in arrival order per key), and settles through it.
//!
//! # The algorithm: GCRA
//!
//! Stores keep each bucket as one number, its *theoretical arrival time*
//! (GCRA, the generic cell rate algorithm): a call needing `n` of a bucket
//! of `amount` per `per` moves it `n · per / amount` later, and is admitted
//! when the result is no more than `per` ahead of now. That is exactly the
//! in-memory token bucket (a burst of `amount`, then a steady refill), in
//! one value per bucket that a Redis script reads and writes atomically,
//! with no log of past calls to trim (as a sliding window needs). Settling
//! moves the tokens' time by the difference: later for more tokens than
//! reserved, earlier for fewer, never earlier than now (a refund never
//! lets more through than exact estimates would have).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::error::BoxError;

/// An amount per interval: `amount` requests (or tokens) per `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    amount: u64,
    per: Duration,
}

impl Rate {
    /// `amount` per `per`.
    pub const fn new(amount: u64, per: Duration) -> Self {
        Self { amount, per }
    }

    /// How many per interval.
    pub const fn amount(&self) -> u64 {
        self.amount
    }

    /// The interval.
    pub const fn per(&self) -> Duration {
        self.per
    }

    pub(crate) fn is_valid(&self) -> bool {
        self.amount > 0 && !self.per.is_zero()
    }
}

/// The limits of one key: requests per interval and tokens per interval,
/// each optional (no limit when unset).
///
/// ```
/// use std::time::Duration;
/// use tower_agent::layers::rate_limit::Limits;
///
/// let tier_one = Limits::new()
///     .requests(500, Duration::from_secs(60))
///     .tokens(30_000, Duration::from_secs(60));
/// assert_eq!(tier_one.token_rate().unwrap().amount(), 30_000);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    requests: Option<Rate>,
    tokens: Option<Rate>,
}

impl Limits {
    /// No limit at all.
    pub const fn new() -> Self {
        Self {
            requests: None,
            tokens: None,
        }
    }

    /// At most `amount` requests per `per`.
    pub const fn requests(mut self, amount: u64, per: Duration) -> Self {
        self.requests = Some(Rate::new(amount, per));
        self
    }

    /// At most `amount` tokens (input plus output) per `per`.
    pub const fn tokens(mut self, amount: u64, per: Duration) -> Self {
        self.tokens = Some(Rate::new(amount, per));
        self
    }

    /// The request limit, if any.
    pub const fn request_rate(&self) -> Option<Rate> {
        self.requests
    }

    /// The token limit, if any.
    pub const fn token_rate(&self) -> Option<Rate> {
        self.tokens
    }

    pub(crate) fn is_valid(&self) -> bool {
        self.requests.is_none_or(|r| r.is_valid()) && self.tokens.is_none_or(|r| r.is_valid())
    }
}

/// What a store answers to a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// Taken: the call may go. `tokens` were reserved (the estimate, cut to
    /// the whole token limit).
    Admitted {
        /// The tokens reserved, to settle later.
        tokens: u64,
    },
    /// Nothing was taken; the buckets will hold what was asked in this long.
    Wait(Duration),
}

/// A quota of requests and tokens per key, kept where every process using
/// it sees the same state.
///
/// Object-safe: the rate-limit layer holds it as `Arc<dyn QuotaStore>`.
/// Each method is one atomic step on the store (one Lua script on Redis).
///
/// # Errors
///
/// A store may fail (its server is down); the layer then follows its
/// [`FailPolicy`](crate::stores::FailPolicy) (closed by default).
pub trait QuotaStore: Send + Sync + 'static {
    /// Takes one request (when `requests` is 1) and `tokens` from `key`'s
    /// buckets under `limits`, both or neither. An amount above a bucket's
    /// whole limit takes the whole limit.
    fn reserve(
        &self,
        key: &str,
        limits: Limits,
        requests: u64,
        tokens: u64,
    ) -> BoxFuture<'static, Result<Reservation, BoxError>>;

    /// Charges (or refunds) the difference between the `actual` tokens a
    /// call used and the `reserved` ones.
    fn settle(
        &self,
        key: &str,
        limits: Limits,
        reserved: u64,
        actual: u64,
    ) -> BoxFuture<'static, Result<(), BoxError>>;
}

impl<T: QuotaStore + ?Sized> QuotaStore for Arc<T> {
    fn reserve(
        &self,
        key: &str,
        limits: Limits,
        requests: u64,
        tokens: u64,
    ) -> BoxFuture<'static, Result<Reservation, BoxError>> {
        (**self).reserve(key, limits, requests, tokens)
    }

    fn settle(
        &self,
        key: &str,
        limits: Limits,
        reserved: u64,
        actual: u64,
    ) -> BoxFuture<'static, Result<(), BoxError>> {
        (**self).settle(key, limits, reserved, actual)
    }
}

/// One GCRA bucket's step: `tat` is the stored time (µs, `None` for a full
/// bucket). Returns the new time and how long until `need` fits (zero: it
/// fits now).
pub(crate) fn gcra(rate: Rate, tat: Option<f64>, now: f64, need: u64) -> (f64, f64) {
    let per = rate.per().as_secs_f64() * 1e6;
    let need = need.min(rate.amount());
    let start = tat.unwrap_or(now).max(now);
    let next = start + need as f64 * per / rate.amount() as f64;
    (next, (next - per - now).max(0.0))
}

/// The settlement of one GCRA bucket: `diff` more tokens (or fewer, if
/// negative) than reserved.
pub(crate) fn gcra_settle(rate: Rate, tat: Option<f64>, now: f64, diff: i128) -> f64 {
    let per = rate.per().as_secs_f64() * 1e6;
    let shift = diff as f64 * per / rate.amount() as f64;
    let tat = tat.unwrap_or(now);
    if diff > 0 {
        tat.max(now) + shift
    } else {
        (tat + shift).max(now)
    }
}

/// The in-memory [`QuotaStore`], on tokio's clock (a paused test clock
/// moves it): the same GCRA as the Redis store, for one process. Clones
/// share the quota.
///
/// ```
/// use std::time::Duration;
/// use tower_agent::stores::quota::{Limits, MemoryQuotaStore, QuotaStore, Reservation};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let store = MemoryQuotaStore::new();
/// let limits = Limits::new().requests(1, Duration::from_secs(60));
/// assert!(matches!(store.reserve("m", limits, 1, 0).await, Ok(Reservation::Admitted { .. })));
/// assert_eq!(store.reserve("m", limits, 1, 0).await.unwrap(), Reservation::Wait(Duration::from_secs(60)));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryQuotaStore {
    inner: Arc<MemoryQuota>,
}

#[derive(Debug)]
struct MemoryQuota {
    base: Instant,
    /// Per key: the requests' and the tokens' theoretical arrival times.
    keys: Mutex<HashMap<String, [Option<f64>; 2]>>,
}

impl MemoryQuotaStore {
    /// An empty quota: every key starts with full buckets.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(MemoryQuota {
                base: Instant::now(),
                keys: Mutex::new(HashMap::new()),
            }),
        }
    }

    fn now(&self) -> f64 {
        self.inner.base.elapsed().as_secs_f64() * 1e6
    }
}

impl Default for MemoryQuotaStore {
    fn default() -> Self {
        Self::new()
    }
}

/// Microseconds as a duration, rounded up.
pub(crate) fn micros(us: f64) -> Duration {
    Duration::from_micros(us.ceil().max(0.0) as u64)
}

impl QuotaStore for MemoryQuotaStore {
    fn reserve(
        &self,
        key: &str,
        limits: Limits,
        requests: u64,
        tokens: u64,
    ) -> BoxFuture<'static, Result<Reservation, BoxError>> {
        let now = self.now();
        let mut keys = self
            .inner
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let tats = keys.entry(key.to_owned()).or_default();
        let step = |rate: Option<Rate>, tat: Option<f64>, need: u64| match rate {
            Some(rate) if need > 0 => Some(gcra(rate, tat, now, need)),
            _ => None,
        };
        let r = step(limits.request_rate(), tats[0], requests);
        let t = step(limits.token_rate(), tats[1], tokens);
        let wait = r.map_or(0.0, |s| s.1).max(t.map_or(0.0, |s| s.1));
        let answer = if wait > 0.0 {
            Reservation::Wait(micros(wait))
        } else {
            if let Some((tat, _)) = r {
                tats[0] = Some(tat);
            }
            if let Some((tat, _)) = t {
                tats[1] = Some(tat);
            }
            let reserved = limits
                .token_rate()
                .map_or(0, |rate| tokens.min(rate.amount()));
            Reservation::Admitted { tokens: reserved }
        };
        Box::pin(std::future::ready(Ok(answer)))
    }

    fn settle(
        &self,
        key: &str,
        limits: Limits,
        reserved: u64,
        actual: u64,
    ) -> BoxFuture<'static, Result<(), BoxError>> {
        if let (Some(rate), true) = (limits.token_rate(), reserved != actual) {
            let now = self.now();
            let mut keys = self
                .inner
                .keys
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let tats = keys.entry(key.to_owned()).or_default();
            let diff = i128::from(actual) - i128::from(reserved);
            tats[1] = Some(gcra_settle(rate, tats[1], now, diff));
        }
        Box::pin(std::future::ready(Ok(())))
    }
}
