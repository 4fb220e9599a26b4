//! Settlements posted without the key's lock.
//!
//! A call that went out settles its tokens when its response arrives. Taking
//! the key's lock for that would make two critical sections per call; so
//! instead, a call admitted while one of the key's [`SLOTS`] is free holds
//! that slot, and its settlement writes the outcome into the slot's atomic,
//! without reading the clock. Whoever takes the key's lock next applies
//! every posted outcome first, as of the bucket's last update (nobody has
//! looked at the bucket since): a refund is bounded as it would be at that
//! time, which never gives back more than exact estimates would have (see
//! [`Bucket::refund`]). A settlement that finds a call queued takes the lock
//! at once (its refund may let the head go), and calls beyond the slots
//! settle under the lock, as before.
//!
//! The poster stores its outcome, then reads whether anyone waits; a caller
//! that queues sets that flag, then (under the lock, when it polls) reads
//! the outcomes: with both sequentially consistent, one of them sees the
//! other, so no refund is left unapplied while the head sleeps.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::bucket::{Bucket, Grant};

/// The settlements a key takes without its lock: calls in flight beyond
/// these settle under it.
pub(super) const SLOTS: usize = 8;

/// Every slot's bit.
const ALL: u32 = (1 << SLOTS) - 1;

/// A slot's outcome: not posted yet.
const PENDING: u64 = 0;
/// A slot's outcome: the reservation is kept as it is (the call failed, or
/// used what it reserved).
const KEPT: u64 = 1;
/// Outcomes above this are a token count, offset by it.
const OFFSET: u64 = 2;

/// The lock-free half: one outcome per slot, and whether anyone waits.
pub(super) struct Posts {
    outcome: [AtomicU64; SLOTS],
    waiting: AtomicBool,
}

impl Posts {
    pub(super) fn new() -> Self {
        Self {
            outcome: std::array::from_fn(|_| AtomicU64::new(PENDING)),
            waiting: AtomicBool::new(false),
        }
    }

    /// Posts the outcome of the call holding `slot`: `None` keeps its
    /// reservation, `Some(actual)` settles it for `actual` tokens. Says
    /// whether a call is queued: then the poster must take the lock and
    /// apply what it posted.
    pub(super) fn post(&self, slot: u8, actual: Option<u64>) -> bool {
        let slot = usize::from(slot);
        let outcome = actual.map_or(KEPT, |actual| actual.saturating_add(OFFSET));
        self.outcome[slot].store(outcome, Ordering::SeqCst);
        self.waiting.load(Ordering::SeqCst)
    }

    /// Whether a call is queued (set under the key's lock).
    pub(super) fn set_waiting(&self, waiting: bool) {
        self.waiting.store(waiting, Ordering::SeqCst);
    }
}

/// The locked half: which slots are held, and the grant of each.
#[derive(Default)]
pub(super) struct InFlight {
    used: u32,
    grants: [Option<Grant>; SLOTS],
}

impl InFlight {
    /// Whether some slot is held.
    pub(super) fn any(&self) -> bool {
        self.used != 0
    }

    /// A slot for the call that was granted `grant`, if one is free.
    pub(super) fn hold(&mut self, grant: Grant) -> Option<u8> {
        let free = !self.used & ALL;
        if free == 0 {
            return None;
        }
        let slot = free.trailing_zeros();
        self.used |= 1 << slot;
        self.grants[slot as usize] = Some(grant);
        u8::try_from(slot).ok()
    }

    /// Frees the slot of a call that never went out (nothing was posted).
    pub(super) fn free(&mut self, slot: u8) {
        self.used &= !(1 << slot);
        self.grants[usize::from(slot)] = None;
    }

    /// Applies every posted outcome to `bucket`, as of its last update (see
    /// the [module docs](self)), and frees its slot. Says whether anything
    /// was refunded.
    pub(super) fn apply(&mut self, posts: &Posts, mut bucket: Option<&mut Bucket>) -> bool {
        let mut refunded = false;
        let mut used = self.used;
        while used != 0 {
            let slot = used.trailing_zeros() as usize;
            used &= used - 1;
            let outcome = posts.outcome[slot].load(Ordering::SeqCst);
            if outcome == PENDING {
                continue;
            }
            posts.outcome[slot].store(PENDING, Ordering::Relaxed);
            self.used &= !(1 << slot);
            let grant = self.grants[slot].take();
            if let (Some(bucket), Some(grant)) = (bucket.as_deref_mut(), grant) {
                if outcome != KEPT {
                    // The grant's time is never after the bucket's last
                    // update: the settlement is as of that update.
                    refunded |= settle(bucket, &grant, outcome - OFFSET, grant.at);
                }
            }
        }
        refunded
    }
}

/// Charges or refunds the difference between `actual` and what `grant`
/// reserved, as of `at` (or of the bucket's last refill, when that is
/// later: a refund is then bounded as if it came that late, so it never
/// lifts a bucket that has refilled since). Says whether it refunded.
pub(super) fn settle(bucket: &mut Bucket, grant: &Grant, actual: u64, at: u64) -> bool {
    bucket.refill(at);
    if actual > grant.amount {
        bucket.charge(actual - grant.amount);
        false
    } else if actual < grant.amount {
        let now = bucket.updated();
        bucket.refund(grant, grant.amount - actual, now);
        true
    } else {
        false
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::layers::rate_limit::limits::Rate;

    /// 100 a second.
    fn bucket() -> Bucket {
        Bucket::new(Rate::new(1_000, Duration::from_secs(10)), 0)
    }

    #[test]
    fn a_posted_settlement_is_applied_as_of_the_last_update() {
        // A call reserves 800 at 0 and uses 100; another takes 150.
        let posts = Posts::new();
        let mut inflight = InFlight::default();
        let mut posted = bucket();
        let grant = posted.take(800);
        let _other = posted.take(150);
        let slot = inflight.hold(grant).expect("a free slot");
        // Posted at 0.1 s; a post carries no time.
        assert!(!posts.post(slot, Some(100)), "nobody waits");

        // Applied at 0.5 s, as of the bucket's last update (0): the same
        // level as settling under the lock at 0.1 s, then refilling:
        // 50 + 10 + 700 + 40.
        let mut locked = bucket();
        let grant = locked.take(800);
        let _other = locked.take(150);
        assert!(settle(&mut locked, &grant, 100, 100_000_000));
        locked.refill(500_000_000);
        assert!(inflight.apply(&posts, Some(&mut posted)));
        posted.refill(500_000_000);
        assert!(!inflight.any());
        for b in [&posted, &locked] {
            assert!(b.holds(800) && !b.holds(801));
        }
    }

    #[test]
    fn slots_run_out_and_are_freed() {
        let posts = Posts::new();
        let mut inflight = InFlight::default();
        let mut b = bucket();
        let slots: Vec<u8> = (0..SLOTS)
            .map(|_| inflight.hold(b.take(1)).unwrap())
            .collect();
        assert!(inflight.hold(b.take(1)).is_none(), "all {SLOTS} are held");
        // A kept reservation frees its slot and gives nothing back.
        assert!(!posts.post(slots[0], None));
        assert!(!inflight.apply(&posts, Some(&mut b)));
        assert_eq!(inflight.hold(b.take(1)), Some(slots[0]));
        inflight.free(slots[1]);
        assert_eq!(inflight.hold(b.take(1)), Some(slots[1]));
        posts.set_waiting(true);
        assert!(posts.post(slots[2], Some(0)), "a queued call is reported");
    }
}
