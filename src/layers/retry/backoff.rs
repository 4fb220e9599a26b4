//! [`Backoff`]: how long a retry waits, exponential with full jitter, capped.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How the wait before a retry is spread out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Jitter {
    /// A uniformly random wait between zero and the exponential ceiling
    /// ("full jitter"): concurrent callers that failed together do not come
    /// back together. The default.
    #[default]
    Full,
    /// Exactly the exponential ceiling: predictable, for tests and for a
    /// single caller.
    None,
}

/// Exponential backoff with jitter, capped: before retry `n` (counting the
/// failed attempts from 1) a call waits a random time in
/// `0 ..= min(max, base × factor^(n-1))`.
///
/// The defaults: `base` 500 ms, `factor` 2, `max` 30 s, [`Jitter::Full`],
/// random from the thread's generator. [`seed`](Self::seed) makes the
/// sequence of waits reproducible.
///
/// ```
/// use std::time::Duration;
/// use tower_agent::layers::retry::{Backoff, Jitter};
///
/// let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1)).jitter(Jitter::None);
/// assert_eq!(backoff.delay(1), Duration::from_millis(100));
/// assert_eq!(backoff.delay(3), Duration::from_millis(400));
/// assert_eq!(backoff.delay(30), Duration::from_secs(1)); // capped
/// ```
///
/// # Clone
///
/// Clones of a seeded backoff share one generator, so the waits of every
/// call through a layer come from one reproducible sequence.
#[derive(Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    factor: f64,
    jitter: Jitter,
    rng: Option<Arc<Mutex<StdRng>>>,
}

impl Backoff {
    /// Waits starting at `base` and never longer than `max` (a `max` below
    /// `base` is read as `base`).
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max: max.max(base),
            factor: 2.0,
            jitter: Jitter::Full,
            rng: None,
        }
    }

    /// How much the ceiling grows per failed attempt (default 2). A factor
    /// below 1, or one that is not finite, is read as 1 (a constant ceiling).
    pub fn factor(mut self, factor: f64) -> Self {
        self.factor = if factor.is_finite() && factor >= 1.0 {
            factor
        } else {
            1.0
        };
        self
    }

    /// How the wait is spread below its ceiling (default [`Jitter::Full`]).
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Draws the jitter from a generator seeded with `seed`, shared by every
    /// clone: the same calls wait the same times on every run.
    pub fn seed(mut self, seed: u64) -> Self {
        self.rng = Some(Arc::new(Mutex::new(StdRng::seed_from_u64(seed))));
        self
    }

    /// The first ceiling.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The cap.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The ceiling of the wait before retry `attempt` (from 1):
    /// `min(max, base × factor^(attempt-1))`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        if attempt <= 1 || self.factor == 1.0 {
            return self.base.min(self.max);
        }
        let exponent = i32::try_from(attempt - 1).unwrap_or(i32::MAX);
        // In nanoseconds: `base × factor^k ≥ base` holds exactly for k ≥ 0.
        let nanos = nanos(self.base) as f64 * self.factor.powi(exponent);
        // `as` saturates (and reads NaN as 0, which cannot happen here).
        Duration::from_nanos(nanos as u64).min(self.max)
    }

    /// The wait before retry `attempt` (from 1), given `unit`, a number in
    /// `[0, 1]` (clamped) that says where below the ceiling it falls under
    /// [`Jitter::Full`]. Pure: this is what the bounds are tested on.
    pub fn delay_at(&self, attempt: u32, unit: f64) -> Duration {
        let ceiling = self.ceiling(attempt);
        match self.jitter {
            Jitter::None => ceiling,
            Jitter::Full => {
                let unit = if unit.is_nan() {
                    0.0
                } else {
                    unit.clamp(0.0, 1.0)
                };
                Duration::from_nanos((nanos(ceiling) as f64 * unit) as u64).min(ceiling)
            }
        }
    }

    /// The wait before retry `attempt` (from 1), with fresh jitter.
    pub fn delay(&self, attempt: u32) -> Duration {
        let unit = match (self.jitter, &self.rng) {
            (Jitter::None, _) => 1.0,
            (Jitter::Full, Some(rng)) => rng
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .random::<f64>(),
            (Jitter::Full, None) => rand::rng().random::<f64>(),
        };
        self.delay_at(attempt, unit)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(500), Duration::from_secs(30))
    }
}

impl fmt::Debug for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backoff")
            .field("base", &self.base)
            .field("max", &self.max)
            .field("factor", &self.factor)
            .field("jitter", &self.jitter)
            .field("seeded", &self.rng.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_backoffs_repeat_their_waits() {
        let a = Backoff::default().seed(7);
        let b = Backoff::default().seed(7);
        let first: Vec<_> = (1..6).map(|n| a.delay(n)).collect();
        let second: Vec<_> = (1..6).map(|n| b.delay(n)).collect();
        assert_eq!(first, second);
        // Clones draw from the one shared sequence.
        let c = Backoff::default().seed(7);
        let d = c.clone();
        assert_eq!(c.delay(1), first[0]);
        assert_eq!(d.delay(2), first[1]);
    }

    #[test]
    fn odd_inputs_are_read_sensibly() {
        let b = Backoff::new(Duration::from_secs(2), Duration::from_secs(1))
            .factor(f64::NAN)
            .jitter(Jitter::None);
        assert_eq!(b.max(), Duration::from_secs(2));
        assert_eq!(b.delay(1), Duration::from_secs(2));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(2));
        let full = Backoff::default();
        assert_eq!(full.delay_at(1, f64::NAN), Duration::ZERO);
        assert_eq!(full.delay_at(1, 5.0), Duration::from_millis(500));
        assert_eq!(full.delay_at(0, 1.0), Duration::from_millis(500));
    }
}
