//! The lock-free path of a key's quota: a pool of whole requests and tokens
//! published from the buckets into one atomic word, which a call with
//! ample capacity draws from with one compare-and-swap, reading neither
//! the clock nor the key's lock.
//!
//! # Why it stays within the limit
//!
//! A bucket's stored level never exceeds its true level: refill only adds.
//! Under the key's lock, with nobody queued, the whole units the buckets
//! hold as of their last update are published in the word. A draw takes
//! from what is left of them, so the calls admitted from one pool never
//! take more than the buckets held when it was published.
//!
//! The next time the key's lock is taken, the word is taken back (closed)
//! before anything else: the buckets are refilled to now, and what was
//! drawn is charged then, as if every draw of the pool had come at that
//! moment. That is the latest a draw can have come, so the level it leaves
//! is the lowest any real order of the draws could leave: charging the
//! draws at their own times, earlier, would let the refill since cover
//! them. So the pool's draws never let more through than the buckets would
//! have admitted one by one under the lock.
//!
//! # Settling
//!
//! A call's settlement (its real token use against its estimate) goes back
//! into the word while its pool is still open: it changes how much the pool
//! drew, before the pool is charged, so the call is charged what it used,
//! exactly. A pool closed since holds a [`Record`] for each call still out:
//! the grant its draws came to when they were charged. A late settlement is
//! then applied under the lock against that grant, through
//! [`Bucket::refund`], which never gives back what the refill since would
//! have covered.
//!
//! # The word
//!
//! From the top bit down: open (no call queued, and published since the
//! lock was last taken), the pool's epoch, the requests left, the calls
//! drawn and not settled, the tokens left. An epoch names one pool; it is
//! not published again while a call drawn from it is unsettled, so a late
//! settlement never lands in a later pool.

use std::sync::atomic::{AtomicU64, Ordering};

use super::bucket::{Bucket, Grant};
use super::posts;

const TOKEN_BITS: u32 = 30;
const OUT_BITS: u32 = 10;
const REQUEST_BITS: u32 = 10;
const EPOCH_BITS: u32 = 13;

const OUT_SHIFT: u32 = TOKEN_BITS;
const REQUEST_SHIFT: u32 = OUT_SHIFT + OUT_BITS;
const EPOCH_SHIFT: u32 = REQUEST_SHIFT + REQUEST_BITS;
const OPEN: u64 = 1 << (EPOCH_SHIFT + EPOCH_BITS);

/// The most tokens a pool holds: a call needing more takes the lock.
pub(super) const TOKENS_MAX: u64 = (1 << TOKEN_BITS) - 1;
/// The most requests a pool holds: the next call after them takes the
/// lock, which publishes a new pool.
const REQUESTS_MAX: u64 = (1 << REQUEST_BITS) - 1;
const OUT_MAX: u64 = (1 << OUT_BITS) - 1;
/// How many pools can be told apart.
const EPOCHS: u16 = 1 << EPOCH_BITS;

const ONE_OUT: u64 = 1 << OUT_SHIFT;
const ONE_REQUEST: u64 = 1 << REQUEST_SHIFT;

// A call out is a request drawn: the count of calls out fits its field.
const _: () = assert!(OUT_MAX >= REQUESTS_MAX);
const _: () = assert!(EPOCH_SHIFT + EPOCH_BITS == 63);

fn tokens(word: u64) -> u64 {
    word & TOKENS_MAX
}

fn out(word: u64) -> u64 {
    (word >> OUT_SHIFT) & OUT_MAX
}

fn requests(word: u64) -> u64 {
    (word >> REQUEST_SHIFT) & REQUESTS_MAX
}

fn epoch(word: u64) -> u16 {
    // Masked to 13 bits: the cast keeps it all.
    ((word >> EPOCH_SHIFT) & u64::from(EPOCHS - 1)) as u16
}

/// What one call drew from a pool: the pool's epoch and its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Drawn {
    /// At most [`TOKENS_MAX`].
    tokens: u32,
    epoch: u16,
}

impl Drawn {
    pub(super) fn tokens(self) -> u64 {
        u64::from(self.tokens)
    }
}

/// The lock-free half: the published pool.
#[derive(Debug, Default)]
pub(super) struct Word(AtomicU64);

impl Word {
    /// Takes one request and `tokens` from the open pool, if it holds them.
    #[inline]
    pub(super) fn draw(&self, tokens: u64) -> Option<Drawn> {
        let mut word = self.0.load(Ordering::Acquire);
        loop {
            if word & OPEN == 0 || requests(word) == 0 || self::tokens(word) < tokens {
                return None;
            }
            // No field borrows: each one checked above holds what it loses,
            // and `out` stays at most the requests published.
            let drawn = word - ONE_REQUEST + ONE_OUT - tokens;
            match self
                .0
                .compare_exchange_weak(word, drawn, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Some(Drawn {
                        // At most `TOKENS_MAX`, checked above.
                        tokens: tokens as u32,
                        epoch: epoch(word),
                    });
                }
                Err(now) => word = now,
            }
        }
    }

    /// Settles `drawn` in its pool, while the pool is open: `actual`
    /// tokens instead of the drawn ones (`None`: the drawn ones are kept).
    /// False when the pool was closed since, or cannot cover a charge
    /// beyond the draw: then the lock must settle it
    /// ([`Pool::settle_late`]).
    #[inline]
    pub(super) fn settle(&self, drawn: Drawn, actual: Option<u64>) -> bool {
        let mut word = self.0.load(Ordering::Acquire);
        loop {
            if word & OPEN == 0 || epoch(word) != drawn.epoch {
                return false;
            }
            let mut settled = word - ONE_OUT;
            match actual {
                // Back into the pool: at most what this call took from it,
                // so the field stays at most what was published.
                Some(actual) if actual < drawn.tokens() => settled += drawn.tokens() - actual,
                Some(actual) if actual > drawn.tokens() => {
                    let extra = actual - drawn.tokens();
                    if tokens(word) < extra {
                        return false;
                    }
                    settled -= extra;
                }
                _ => {}
            }
            match self
                .0
                .compare_exchange_weak(word, settled, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
    }
}

/// A closed pool with calls still out: what its draws were charged as.
#[derive(Debug)]
struct Record {
    epoch: u16,
    /// Calls drawn from it and not settled yet.
    out: u64,
    /// The token grant its draws came to (none without a token limit).
    grant: Option<Grant>,
}

/// The locked half: what was published, and the closed pools with calls
/// still out.
#[derive(Debug, Default)]
pub(super) struct Pool {
    open: bool,
    epoch: u16,
    requests: u64,
    tokens: u64,
    records: Vec<Record>,
}

impl Pool {
    /// Closes the word, and charges what its pool drew to the buckets
    /// (refilled to now already). Every locked step does this first.
    pub(super) fn absorb(
        &mut self,
        word: &Word,
        requests: Option<&mut Bucket>,
        tokens: Option<&mut Bucket>,
    ) {
        if !self.open {
            return;
        }
        self.open = false;
        let left = word.0.swap(0, Ordering::AcqRel);
        // What is left never exceeds what was published: see `Word`.
        let drawn = self.requests - self::requests(left);
        let net_tokens = self.tokens - self::tokens(left);
        if let Some(bucket) = requests {
            bucket.charge(drawn);
        }
        let grant = tokens.map(|bucket| bucket.take(net_tokens));
        let out = out(left);
        if out > 0 {
            self.records.push(Record {
                epoch: self.epoch,
                out,
                grant,
            });
        }
    }

    /// Publishes the whole units the buckets hold, when nobody is queued
    /// (the caller checks) and the word is closed.
    pub(super) fn publish(
        &mut self,
        word: &Word,
        requests: Option<&Bucket>,
        tokens: Option<&Bucket>,
    ) {
        if self.open {
            return;
        }
        let published_requests = requests.map_or(REQUESTS_MAX, |b| b.whole().min(REQUESTS_MAX));
        if published_requests == 0 {
            return;
        }
        let published_tokens = tokens.map_or(0, |b| b.whole().min(TOKENS_MAX));
        let Some(epoch) = self.free_epoch() else {
            // Every epoch has calls out: the lock serves until some settle.
            return;
        };
        self.open = true;
        self.epoch = epoch;
        self.requests = published_requests;
        self.tokens = published_tokens;
        let published = OPEN
            | (u64::from(epoch) << EPOCH_SHIFT)
            | (published_requests << REQUEST_SHIFT)
            | published_tokens;
        word.0.store(published, Ordering::Release);
    }

    /// The last epoch, if no call drawn from it is out, or the next free
    /// one.
    fn free_epoch(&self) -> Option<u16> {
        let taken = |epoch: u16| self.records.iter().any(|r| r.epoch == epoch);
        (0..EPOCHS)
            .map(|step| (self.epoch + step) % EPOCHS)
            .find(|&epoch| !taken(epoch))
    }

    /// Whether a call drawn from a pool is still out.
    pub(super) fn any_out(&self) -> bool {
        !self.records.is_empty()
    }

    /// Settles `drawn` under the lock, once its pool is closed (the caller
    /// absorbed it): against the grant its pool's draws came to, as of
    /// `now` (the bucket is refilled to it). Says whether it refunded.
    pub(super) fn settle_late(
        &mut self,
        drawn: Drawn,
        actual: Option<u64>,
        tokens: Option<&mut Bucket>,
        now: u64,
    ) -> bool {
        let Some(index) = self.records.iter().position(|r| r.epoch == drawn.epoch) else {
            // Cannot happen: a pool with calls out keeps its record. Charge
            // what was used beyond the draw, and give nothing back.
            if let (Some(bucket), Some(actual)) = (tokens, actual) {
                bucket.charge(actual.saturating_sub(drawn.tokens()));
            }
            return false;
        };
        let record = &mut self.records[index];
        record.out -= 1;
        let grant = record.grant;
        if record.out == 0 {
            self.records.swap_remove(index);
        }
        match (tokens, grant, actual) {
            (Some(bucket), Some(grant), Some(actual)) => {
                posts::settle(bucket, &grant.with_amount(drawn.tokens()), actual, now)
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::layers::rate_limit::limits::Rate;

    fn bucket(amount: u64) -> Bucket {
        Bucket::new(Rate::new(amount, Duration::from_secs(10)), 0)
    }

    #[test]
    fn a_pool_holds_what_the_buckets_held_and_no_more() {
        let word = Word::default();
        let mut pool = Pool::default();
        let (mut r, mut t) = (bucket(3), bucket(1_000));
        assert_eq!(word.draw(0), None, "closed until published");
        pool.publish(&word, Some(&r), Some(&t));
        // Exactly the need: admitted.
        let first = word.draw(1_000).unwrap();
        assert_eq!(word.draw(1), None, "the tokens are spent");
        assert!(word.settle(first, Some(400)));
        let second = word.draw(600).unwrap();
        let third = word.draw(0).unwrap();
        assert_eq!(word.draw(0), None, "the three requests are spent");
        pool.absorb(&word, Some(&mut r), Some(&mut t));
        assert_eq!(word.draw(0), None, "closed once absorbed");
        assert!(!r.holds(1));
        assert!(!t.holds(1), "400 used, 600 out");
        // Late: the call that drew nothing used 50.
        assert!(!word.settle(third, Some(50)));
        assert!(!pool.settle_late(third, Some(50), Some(&mut t), 0));
        assert!(pool.any_out());
        // The 600 came back, as of the charge.
        assert!(pool.settle_late(second, Some(0), Some(&mut t), 0));
        assert!(!pool.any_out());
        assert!(t.holds(550) && !t.holds(551));
    }

    #[test]
    fn an_epoch_with_calls_out_is_not_published_again() {
        let word = Word::default();
        let mut pool = Pool::default();
        let (mut r, mut t) = (bucket(100), bucket(100));
        pool.publish(&word, Some(&r), Some(&t));
        let old = word.draw(10).unwrap();
        pool.absorb(&word, Some(&mut r), Some(&mut t));
        pool.publish(&word, Some(&r), Some(&t));
        let new = word.draw(10).unwrap();
        assert_ne!(old.epoch, new.epoch);
        // The old call cannot settle into the new pool.
        assert!(!word.settle(old, Some(0)));
        assert!(word.settle(new, Some(0)));
        pool.absorb(&word, Some(&mut r), Some(&mut t));
        // Nothing out of the second pool: its epoch may come again.
        pool.publish(&word, Some(&r), Some(&t));
        assert_eq!(word.draw(0).unwrap().epoch, new.epoch);
    }

    #[test]
    fn a_charge_the_pool_cannot_cover_is_left_to_the_lock() {
        let word = Word::default();
        let mut pool = Pool::default();
        let mut t = bucket(100);
        pool.publish(&word, None, Some(&t));
        let drawn = word.draw(90).unwrap();
        assert!(!word.settle(drawn, Some(200)), "110 more, 10 left");
        pool.absorb(&word, None, Some(&mut t));
        assert!(!pool.settle_late(drawn, Some(200), Some(&mut t), 0));
        // 100 - 200: in debt by 100.
        assert!(!t.holds(0));
        t.refill(20_000_000_000);
        assert!(t.holds(100) && !t.holds(101));
    }

    #[test]
    fn without_limits_a_pool_counts_calls_only() {
        let word = Word::default();
        let mut pool = Pool::default();
        pool.publish(&word, None, None);
        let drawn: Vec<Drawn> = (0..REQUESTS_MAX).map(|_| word.draw(0).unwrap()).collect();
        assert_eq!(word.draw(0), None, "a new pool comes from the lock");
        pool.absorb(&word, None, None);
        pool.publish(&word, None, None);
        assert!(word.draw(0).is_some());
        for d in drawn {
            assert!(!pool.settle_late(d, None, None, 0));
        }
        assert!(!pool.any_out());
    }
}
