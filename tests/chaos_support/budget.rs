//! A retry budget that counts: a fixed reserve plus a share of the calls
//! deposited, over the whole load (no time window, so the bound is exact).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tower::retry::budget::Budget;

#[derive(Debug, Default)]
struct Counts {
    deposits: AtomicU64,
    granted: AtomicU64,
    refused: AtomicU64,
}

/// At most `reserve + share × deposits` withdrawals, ever. Clones share the
/// counts.
#[derive(Debug, Clone)]
pub struct CountingBudget {
    reserve: u64,
    share: f64,
    counts: Arc<Counts>,
}

impl CountingBudget {
    pub fn new(reserve: u64, share: f64) -> Self {
        Self {
            reserve,
            share,
            counts: Arc::default(),
        }
    }

    /// How many withdrawals `deposits` calls allow.
    pub fn allowance(&self, deposits: u64) -> u64 {
        self.reserve + (self.share * deposits as f64).floor() as u64
    }

    pub fn deposits(&self) -> u64 {
        self.counts.deposits.load(Ordering::SeqCst)
    }

    pub fn granted(&self) -> u64 {
        self.counts.granted.load(Ordering::SeqCst)
    }

    pub fn refused(&self) -> u64 {
        self.counts.refused.load(Ordering::SeqCst)
    }
}

impl Budget for CountingBudget {
    fn deposit(&self) {
        self.counts.deposits.fetch_add(1, Ordering::SeqCst);
    }

    fn withdraw(&self) -> bool {
        let allowed = self.allowance(self.deposits());
        let granted =
            self.counts
                .granted
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |granted| {
                    (granted < allowed).then_some(granted + 1)
                });
        if granted.is_err() {
            self.counts.refused.fetch_add(1, Ordering::SeqCst);
        }
        granted.is_ok()
    }
}
