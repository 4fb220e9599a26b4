//! [`RetryBudget`]: one pool of retries shared by retry, fallback and nested
//! agents.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower::retry::budget::{Budget, TpsBudget};

/// A shared allowance of extra calls: every retry and every fallback switch
/// withdraws from it, every call deposits into it.
///
/// It wraps any [`tower::retry::budget::Budget`] (by default tower's
/// [`TpsBudget`]: 10 retries a second, plus 20 % of the calls of the last
/// 10 seconds) behind an `Arc`. One `RetryBudget` handed to several layers is
/// one pool:
///
/// - every clone of a [`LlmRetryLayer`](super::LlmRetryLayer) and of the services
///   it makes draws on it;
/// - a [`FallbackLayer`](crate::layers::fallback::FallbackLayer) given the same
///   handle draws on it too, so retry and fallback together cannot exceed it;
/// - a nested agent whose model stack is built with the same handle draws on
///   it, so retries cannot multiply down a tree of agents (three levels of
///   "3 attempts each" would otherwise be 27 calls).
///
/// Each call deposits once, however many layers sharing the budget it passes
/// through: the first layer marks the request.
///
/// ```
/// use tower_agent::layers::retry::{LlmRetryLayer, RetryBudget};
/// use tower_agent::layers::fallback::FallbackLayer;
/// use tower_agent::BoxModel;
///
/// let budget = RetryBudget::default();
/// let retry = LlmRetryLayer::new().budget(budget.clone());
/// let fallback: FallbackLayer<BoxModel> = FallbackLayer::new().models(["small-model"]).budget(budget.clone());
/// // ... the parent's and every child agent's model stacks use `retry` and `fallback`.
/// # let _ = (retry, fallback);
/// ```
///
/// # Clone
///
/// Clones are handles to the same pool.
#[derive(Clone)]
pub struct RetryBudget {
    inner: Arc<dyn Budget + Send + Sync>,
}

impl RetryBudget {
    /// A budget over any tower [`Budget`].
    pub fn new(budget: impl Budget + Send + Sync + 'static) -> Self {
        Self {
            inner: Arc::new(budget),
        }
    }

    /// A [`TpsBudget`]: `min_per_sec` retries a second always, plus
    /// `retry_percent` (0.1 = 10 %) of the calls deposited over the last
    /// `ttl`.
    ///
    /// # Errors
    ///
    /// [`InvalidBudget`] when `ttl` is not between 1 and 60 seconds,
    /// `retry_percent` not between 0 and 1000, or `min_per_sec` too large
    /// (tower's `TpsBudget` would panic on these).
    pub fn tps(ttl: Duration, min_per_sec: u32, retry_percent: f32) -> Result<Self, InvalidBudget> {
        if !(Duration::from_secs(1)..=Duration::from_secs(60)).contains(&ttl) {
            return Err(InvalidBudget("ttl must be between 1 and 60 seconds"));
        }
        if !(0.0..=1000.0).contains(&retry_percent) {
            return Err(InvalidBudget("retry_percent must be between 0 and 1000"));
        }
        if min_per_sec >= i32::MAX as u32 {
            return Err(InvalidBudget("min_per_sec is too large"));
        }
        Ok(Self::new(TpsBudget::new(ttl, min_per_sec, retry_percent)))
    }

    /// Adds one call's worth to the pool.
    pub fn deposit(&self) {
        self.inner.deposit();
    }

    /// Takes one extra call from the pool; `false` when it is empty.
    pub fn withdraw(&self) -> bool {
        self.inner.withdraw()
    }

    /// Whether `other` is a handle to the same pool.
    pub fn same_pool(&self, other: &RetryBudget) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    fn id(&self) -> usize {
        Arc::as_ptr(&self.inner).cast::<()>() as usize
    }

    /// Deposits once per call: a call that already deposited into this pool
    /// (it passed another layer sharing it, or this is a retry of it) does
    /// not deposit again.
    pub(crate) fn deposit_once(&self, extensions: &mut http::Extensions) {
        let id = self.id();
        match extensions.get_mut::<Deposited>() {
            Some(marks) if marks.0.contains(&id) => return,
            Some(marks) => marks.0.push(id),
            None => {
                extensions.insert(Deposited(vec![id]));
            }
        }
        self.deposit();
    }
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self::new(TpsBudget::default())
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget").finish_non_exhaustive()
    }
}

/// The pools a request has deposited into.
#[derive(Debug, Clone, Default)]
struct Deposited(Vec<usize>);

/// A [`RetryBudget`] was configured with values tower's budget refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidBudget(&'static str);

impl fmt::Display for InvalidBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid retry budget: {}", self.0)
    }
}

impl std::error::Error for InvalidBudget {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_tower_would_panic_on() {
        assert!(RetryBudget::tps(Duration::ZERO, 1, 0.1).is_err());
        assert!(RetryBudget::tps(Duration::from_secs(61), 1, 0.1).is_err());
        assert!(RetryBudget::tps(Duration::from_secs(1), 1, -1.0).is_err());
        assert!(RetryBudget::tps(Duration::from_secs(1), 1, f32::NAN).is_err());
        assert!(RetryBudget::tps(Duration::from_secs(1), u32::MAX, 0.1).is_err());
        let err = RetryBudget::tps(Duration::ZERO, 1, 0.1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid retry budget: ttl must be between 1 and 60 seconds"
        );
    }

    #[test]
    fn a_call_deposits_once_per_pool() {
        // No reserve, one retry per two deposits.
        let budget = RetryBudget::tps(Duration::from_secs(10), 0, 0.5).unwrap();
        let other = RetryBudget::tps(Duration::from_secs(10), 0, 0.5).unwrap();
        let mut ext = http::Extensions::new();
        budget.deposit_once(&mut ext);
        budget.clone().deposit_once(&mut ext);
        other.deposit_once(&mut ext);
        assert!(!budget.withdraw(), "one deposit does not pay for a retry");
        budget.deposit_once(&mut http::Extensions::new());
        assert!(budget.withdraw());
        assert!(!budget.withdraw());
        assert!(budget.same_pool(&budget.clone()));
        assert!(!budget.same_pool(&other));
    }
}
