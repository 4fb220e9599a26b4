//! One bucket of a quota: a level that refills continuously up to its
//! capacity, and goes below zero when a call settles for more than it took.
//!
//! Levels are kept as integers scaled by `per` in nanoseconds, so a bucket
//! refills exactly `amount` per elapsed nanosecond: no rounding drift.
//! Times are nanoseconds since the key's [`Epoch`]: plain integers, read
//! from the clock once per operation.

use std::time::Duration;

use tokio::time::Instant;

use super::limits::Rate;

/// The instant a key's times count from.
#[derive(Debug, Clone, Copy)]
pub(super) struct Epoch(Instant);

impl Epoch {
    pub(super) fn new(now: Instant) -> Self {
        Self(now)
    }

    /// The nanoseconds from the epoch to `at` (zero before it; a year
    /// short of `u64::MAX` nanoseconds, 584 years, at most).
    pub(super) fn nanos(self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.0);
        since
            .as_secs()
            .checked_mul(1_000_000_000)
            .and_then(|nanos| nanos.checked_add(u64::from(since.subsec_nanos())))
            .map_or(LAST, |nanos| nanos.min(LAST))
    }

    /// The nanoseconds from the epoch to now.
    pub(super) fn now(self) -> u64 {
        self.nanos(Instant::now())
    }

    /// The instant `nanos` after the epoch.
    pub(super) fn instant(self, nanos: u64) -> Instant {
        self.0 + Duration::from_nanos(nanos)
    }
}

/// The last time an epoch counts to, so adding a wait cannot overflow.
const LAST: u64 = u64::MAX - MAX_WAIT.as_nanos() as u64;

/// Waits longer than this are reported as this (a year), so `Instant`
/// arithmetic cannot overflow.
const MAX_WAIT: Duration = Duration::from_secs(365 * 86_400);

/// What a bucket gave one call: enough to refund it safely later.
///
/// Packed to 8-byte alignment: a settlement holds one, and moves with
/// every response future, so the padding `i128`'s alignment adds is worth
/// saving. Fields are only read by value.
#[derive(Debug, Clone, Copy)]
#[repr(C, packed(8))]
pub(super) struct Grant {
    pub(super) amount: u64,
    /// Nanoseconds since the key's epoch.
    pub(super) at: u64,
    /// The bucket's level right after the grant, less its refund counter
    /// at the grant: all a refund's bound needs of the past (see
    /// [`Bucket::refund`]).
    mark: i128,
}

impl Grant {
    /// The same grant, for `amount`: a call's share of a grant that
    /// charged several calls at once.
    pub(super) fn with_amount(self, amount: u64) -> Self {
        Self { amount, ..self }
    }
}

/// An amount to take, cut to the bucket, and scaled.
#[derive(Debug, Clone, Copy)]
pub(super) struct Scaled {
    amount: u64,
    scaled: i128,
}

#[derive(Debug)]
pub(super) struct Bucket {
    amount: i128,
    /// `per` in nanoseconds: one unit, scaled.
    unit: i128,
    /// `amount` units: the level of a full bucket.
    cap: i128,
    level: i128,
    /// Nanoseconds since the key's epoch.
    updated: u64,
    /// Every refund ever credited, scaled.
    credited: i128,
}

impl Bucket {
    pub(super) fn new(rate: Rate, now: u64) -> Self {
        let amount = i128::from(rate.amount());
        let unit = i128::try_from(rate.per().as_nanos()).unwrap_or(i128::MAX);
        let cap = mul(amount, unit);
        Self {
            amount,
            unit,
            cap,
            level: cap,
            updated: now,
            credited: 0,
        }
    }

    #[cfg(test)]
    fn cap(&self) -> i128 {
        self.cap
    }

    pub(super) fn scaled(&self, n: u64) -> i128 {
        mul(i128::from(n), self.unit)
    }

    /// A need larger than the whole bucket could never be met; it takes the
    /// whole bucket instead (and settles the rest afterwards).
    pub(super) fn clamp(&self, n: u64) -> u64 {
        n.min(u64::try_from(self.amount).unwrap_or(u64::MAX))
    }

    /// What `elapsed` nanoseconds refill (scaled).
    fn refill_amount(&self, elapsed: u64) -> i128 {
        mul(i128::from(elapsed), self.amount)
    }

    pub(super) fn refill(&mut self, now: u64) {
        if now <= self.updated {
            return;
        }
        // A full bucket stays full (the level never exceeds the cap).
        if self.level < self.cap {
            let added = self.refill_amount(now - self.updated);
            self.level = self.level.saturating_add(added).min(self.cap);
        }
        self.updated = now;
    }

    /// When the bucket was last refilled.
    pub(super) fn updated(&self) -> u64 {
        self.updated
    }

    /// Whether the bucket is full: what a fresh one would be.
    pub(super) fn is_full(&self) -> bool {
        self.level >= self.cap
    }

    /// Whether the bucket holds `n` now: `time_for(scaled(n))` is zero.
    pub(super) fn holds(&self, n: u64) -> bool {
        self.level >= self.scaled(n)
    }

    /// The whole units the bucket holds now (zero in debt).
    pub(super) fn whole(&self) -> u64 {
        u64::try_from(self.level.max(0) / self.unit).unwrap_or(u64::MAX)
    }

    /// Whether the bucket holds one unit now: `holds(1)`.
    #[inline]
    pub(super) fn holds_one(&self) -> bool {
        self.level >= self.unit
    }

    /// Takes one unit, keeping no grant: `take(1)` for a request that goes
    /// out at once (and is never given back).
    #[inline]
    pub(super) fn take_one(&mut self) {
        self.level = self.level.saturating_sub(self.unit);
    }

    /// `n`, cut to the whole bucket ([`clamp`](Self::clamp)), scaled.
    #[inline]
    pub(super) fn need(&self, n: u64) -> Scaled {
        let amount = self.clamp(n);
        Scaled {
            amount,
            scaled: self.scaled(amount),
        }
    }

    /// Whether the bucket holds `need` now.
    #[inline]
    pub(super) fn holds_scaled(&self, need: Scaled) -> bool {
        self.level >= need.scaled
    }

    /// `take(need.amount)`, with the scaling done.
    #[inline]
    pub(super) fn take_scaled(&mut self, need: Scaled) -> Grant {
        self.level = self.level.saturating_sub(need.scaled);
        Grant {
            amount: need.amount,
            at: self.updated,
            mark: self.level.saturating_sub(self.credited),
        }
    }

    /// How long until the bucket holds `need` (scaled) more than it owes.
    pub(super) fn time_for(&self, need: i128) -> Duration {
        let missing = need.saturating_sub(self.level);
        if missing <= 0 {
            return Duration::ZERO;
        }
        let nanos = missing / self.amount + i128::from(missing % self.amount != 0);
        u64::try_from(nanos)
            .map_or(MAX_WAIT, Duration::from_nanos)
            .min(MAX_WAIT)
    }

    pub(super) fn take(&mut self, n: u64) -> Grant {
        self.level = self.level.saturating_sub(self.scaled(n));
        Grant {
            amount: n,
            at: self.updated,
            mark: self.level.saturating_sub(self.credited),
        }
    }

    /// Gives back `n` of what `grant` took, but only as much as the bucket
    /// can still be missing because of it: had the grant been smaller, the
    /// bucket would have been fuller since, and a full bucket overflows.
    /// Its level since the grant is at most `level_after` plus the refill
    /// and the refunds since; the bucket cannot have missed more than
    /// `cap` minus that. So a refund never lets more through than a bucket
    /// that had been charged the smaller amount all along.
    pub(super) fn refund(&mut self, grant: &Grant, n: u64, now: u64) {
        if self.level >= self.cap {
            // A full bucket takes nothing back, and credits nothing.
            return;
        }
        let since = self.refill_amount(now.saturating_sub(grant.at));
        // `cap - level_after - since - (credited - credited_at)`.
        let headroom = self
            .cap
            .saturating_sub(grant.mark)
            .saturating_sub(since)
            .saturating_sub(self.credited);
        let back = self.scaled(n).min(headroom);
        if back > 0 {
            // Credit only what fit under the cap: what a full bucket cannot
            // take was never given back, and must not shrink later refunds.
            let level = self.level.saturating_add(back).min(self.cap);
            let credited = level - self.level;
            self.level = level;
            self.credited = self.credited.saturating_add(credited);
        }
    }

    pub(super) fn charge(&mut self, n: u64) {
        self.level = self.level.saturating_sub(self.scaled(n));
    }
}

/// `a * b` for non-negative `a` and `b`, saturating at `i128::MAX`: what
/// `i128::saturating_mul` gives, in one machine multiply when both fit in
/// 64 bits (always, but for intervals of centuries).
fn mul(a: i128, b: i128) -> i128 {
    debug_assert!(a >= 0 && b >= 0);
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => i128::try_from(u128::from(a) * u128::from(b)).unwrap_or(i128::MAX),
        _ => a.saturating_mul(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The epoch of the buckets below: the test's start, on its clock.
    fn epoch() -> Epoch {
        thread_local!(static EPOCH: Epoch = Epoch::new(Instant::now()));
        EPOCH.with(|e| *e)
    }

    fn clock() -> u64 {
        epoch().now()
    }

    fn bucket(amount: u64, per_secs: u64) -> Bucket {
        Bucket::new(Rate::new(amount, Duration::from_secs(per_secs)), clock())
    }

    #[tokio::test(start_paused = true)]
    async fn a_refund_never_outlives_the_refill_that_would_have_covered_it() {
        // 1,000 tokens a minute; a call reserves 800 and uses 100.
        let mut b = bucket(1_000, 60);
        let grant = b.take(800);
        // Settled at once: the 700 come back.
        let mut quick = Bucket { ..b };
        quick.refund(&grant, 700, clock());
        assert_eq!(quick.level, quick.scaled(900));

        // Settled after the bucket would have refilled anyway: nothing
        // comes back, or another 800 could start on top of a full bucket.
        tokio::time::advance(Duration::from_secs(60)).await;
        let now = clock();
        b.refill(now);
        assert_eq!(b.level, b.cap());
        let _other = b.take(800);
        b.refund(&grant, 700, now);
        assert_eq!(b.level, b.scaled(200));
    }

    #[tokio::test(start_paused = true)]
    async fn a_partly_refilled_bucket_gets_part_of_the_refund() {
        let mut b = bucket(1_000, 60);
        let grant = b.take(800);
        // 30 s refill 500 of the 800 the grant took; 300 can still be owed.
        tokio::time::advance(Duration::from_secs(30)).await;
        let now = clock();
        b.refill(now);
        b.refund(&grant, 700, now);
        assert_eq!(b.level, b.scaled(1_000));
        let mut c = bucket(1_000, 60);
        let grant = c.take(800);
        let _other = c.take(200);
        tokio::time::advance(Duration::from_secs(30)).await;
        let now = clock();
        c.refill(now);
        c.refund(&grant, 700, now);
        // At 500 after the refill; only 300 of the 700 may come back.
        assert_eq!(c.level, c.scaled(800));
    }

    #[test]
    fn waits_round_up_and_saturate() {
        let b = Bucket {
            level: 0,
            ..bucket(3, 1)
        };
        assert_eq!(b.time_for(b.scaled(1)), Duration::from_nanos(333_333_334));
        let huge = Bucket::new(Rate::new(1, Duration::MAX), clock());
        assert_eq!(Bucket { level: 0, ..huge }.time_for(i128::MAX), MAX_WAIT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refund_credits_only_what_fit_under_the_cap() {
        // 1,000 a minute; two calls of 400 each.
        let mut b = bucket(1_000, 60);
        let first = b.take(400);
        let second = b.take(400);
        // The level rose by other means (refill a clock step ahead of the
        // grants' time, or a bucket another path filled): 900 of 1,000.
        b.level = b.scaled(900);
        // A refund of 300 fits only 100 under the cap: only 100 is credited.
        b.refund(&first, 300, clock());
        assert_eq!(b.level, b.cap());
        assert_eq!(b.credited, b.scaled(100));
        // So the second call's refund is bounded by what was really given
        // back, not by the 300 that overflowed.
        b.level = b.scaled(200);
        b.refund(&second, 400, clock());
        // Headroom for `second`: cap - its level after (200) - refunds since
        // (100) = 700; all 400 come back.
        assert_eq!(b.level, b.scaled(600));
        assert_eq!(b.credited, b.scaled(500));
    }

    #[test]
    fn the_multiply_saturates_as_i128_does() {
        let edges = [
            0,
            1,
            2,
            1_000_000_007,
            i128::from(u32::MAX),
            i128::from(u64::MAX) - 1,
            i128::from(u64::MAX),
            i128::from(u64::MAX) + 1,
            i128::try_from(Duration::MAX.as_nanos()).unwrap(),
            i128::MAX / 3,
            i128::MAX,
        ];
        for a in edges {
            for b in edges {
                assert_eq!(mul(a, b), a.saturating_mul(b), "{a} * {b}");
            }
        }
    }

    #[test]
    fn holding_is_having_no_wait() {
        let mut b = bucket(10, 1);
        for _ in 0..3 {
            for n in [0, 1, 4, 10, 11, u64::MAX] {
                assert_eq!(b.holds(n), b.time_for(b.scaled(n)).is_zero(), "{n}");
            }
            // Down to 6, then into debt.
            b.charge(4);
            b.charge(20);
        }
    }
}
