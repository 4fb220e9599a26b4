//! One breaker's state machine: closed, open, half-open.

use std::time::Duration;

use tokio::time::Instant;

use super::Config;

/// The state of one breaker, as [`CircuitBreakerLayer::state`] reports it.
///
/// [`CircuitBreakerLayer::state`]: super::CircuitBreakerLayer::state
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Calls go through; failures are counted.
    Closed,
    /// Calls are refused at once until `until`.
    Open {
        /// When the breaker lets a probe call through.
        until: Instant,
    },
    /// Probe calls go through (up to the configured number at once); the
    /// first success closes the breaker, a failure opens it again.
    HalfOpen,
}

/// How a call through the breaker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The provider answered (also with an error that is not its failure,
    /// such as an invalid request).
    Success,
    /// The provider failed.
    Failure,
    /// Nothing to learn: the call was dropped or cancelled.
    Abandoned,
}

/// What the breaker says about a new call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admission {
    /// Through, as an ordinary call.
    Pass,
    /// Through, as a half-open probe.
    Probe,
    /// Refused; the next probe may go `retry_after` from now.
    Reject { retry_after: Duration },
}

/// Outcomes over a sliding window, in `BUCKETS` buckets: O(1) memory.
#[derive(Debug)]
struct Window {
    origin: Instant,
    bucket: Duration,
    /// `(bucket index, successes, failures)`.
    slots: [(u64, u32, u32); BUCKETS],
}

const BUCKETS: usize = 10;

impl Window {
    fn new(window: Duration, now: Instant) -> Self {
        let bucket = (window / BUCKETS as u32).max(Duration::from_millis(1));
        Self {
            origin: now,
            bucket,
            slots: [(u64::MAX, 0, 0); BUCKETS],
        }
    }

    fn index(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin);
        (elapsed.as_nanos() / self.bucket.as_nanos()) as u64
    }

    fn record(&mut self, now: Instant, failed: bool) {
        let index = self.index(now);
        let slot = &mut self.slots[(index % BUCKETS as u64) as usize];
        if slot.0 != index {
            *slot = (index, 0, 0);
        }
        if failed {
            slot.2 += 1;
        } else {
            slot.1 += 1;
        }
    }

    /// `(calls, failures)` in the window ending now.
    fn counts(&self, now: Instant) -> (u32, u32) {
        let index = self.index(now);
        self.slots
            .iter()
            .filter(|(i, ..)| *i != u64::MAX && *i + (BUCKETS as u64) > index)
            .fold((0, 0), |(calls, failures), (_, ok, failed)| {
                (calls + ok + failed, failures + failed)
            })
    }

    fn clear(&mut self) {
        self.slots = [(u64::MAX, 0, 0); BUCKETS];
    }
}

/// One key's breaker.
#[derive(Debug)]
pub(super) struct Breaker {
    state: CircuitState,
    consecutive: u32,
    probes: u32,
    window: Option<Window>,
}

impl Breaker {
    pub(super) fn new(config: &Config, now: Instant) -> Self {
        Self {
            state: CircuitState::Closed,
            consecutive: 0,
            probes: 0,
            window: config.rate.map(|rate| Window::new(rate.window, now)),
        }
    }

    /// The state now (an open breaker whose time is up reads half-open).
    pub(super) fn state(&self, now: Instant) -> CircuitState {
        match self.state {
            CircuitState::Open { until } if now >= until => CircuitState::HalfOpen,
            state => state,
        }
    }

    /// Whether a new call may go; reads the clock only when not closed.
    pub(super) fn admit(&mut self, config: &Config, now: impl FnOnce() -> Instant) -> Admission {
        if self.state == CircuitState::Closed {
            return Admission::Pass;
        }
        let now = now();
        match self.state {
            CircuitState::Closed => Admission::Pass,
            CircuitState::Open { until } if now < until => Admission::Reject {
                retry_after: until - now,
            },
            CircuitState::Open { .. } | CircuitState::HalfOpen => {
                self.state = CircuitState::HalfOpen;
                if self.probes < config.probes {
                    self.probes += 1;
                    Admission::Probe
                } else {
                    Admission::Reject {
                        retry_after: Duration::ZERO,
                    }
                }
            }
        }
    }

    /// Records how a call ended; returns the new state when it changed.
    /// Reads the clock only when it needs the time (a window, or opening).
    pub(super) fn record(
        &mut self,
        config: &Config,
        probe: bool,
        outcome: Outcome,
        now: impl Fn() -> Instant,
    ) -> Option<CircuitState> {
        if probe {
            self.probes = self.probes.saturating_sub(1);
        }
        if outcome == Outcome::Abandoned {
            return None;
        }
        let failed = outcome == Outcome::Failure;
        match self.state {
            CircuitState::HalfOpen if probe => {
                if failed {
                    self.open(config, now())
                } else {
                    self.close()
                }
            }
            // A call let through before the breaker opened, ending after:
            // the breaker already knows.
            CircuitState::Open { .. } | CircuitState::HalfOpen => None,
            CircuitState::Closed => {
                if let Some(window) = &mut self.window {
                    window.record(now(), failed);
                }
                if !failed {
                    self.consecutive = 0;
                    return None;
                }
                self.consecutive += 1;
                if config.consecutive.is_some_and(|n| self.consecutive >= n)
                    || self.rate_exceeded(config, now())
                {
                    self.open(config, now())
                } else {
                    None
                }
            }
        }
    }

    fn rate_exceeded(&self, config: &Config, now: Instant) -> bool {
        let (Some(rate), Some(window)) = (config.rate, &self.window) else {
            return false;
        };
        let (calls, failures) = window.counts(now);
        calls >= rate.min_calls
            && u64::from(failures) * 100 >= u64::from(rate.percent) * u64::from(calls)
    }

    fn open(&mut self, config: &Config, now: Instant) -> Option<CircuitState> {
        self.state = CircuitState::Open {
            until: now + config.open_for,
        };
        self.consecutive = 0;
        if let Some(window) = &mut self.window {
            window.clear();
        }
        Some(self.state)
    }

    fn close(&mut self) -> Option<CircuitState> {
        self.state = CircuitState::Closed;
        self.consecutive = 0;
        Some(self.state)
    }
}
