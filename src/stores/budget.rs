//! The budget ledger: [`BudgetStore`], reserve before a call and settle
//! after it, atomically per budget line and window; [`MemoryBudgetStore`]
//! in one process.
//!
//! A *line* is one budget kept for one key (`tenant:acme`, `thread:t-1`,
//! `run:run_…`) over one window (a day, or the whole time). A reservation
//! holds an amount on every line of a call or on none: the store checks,
//! for each line, that what was spent plus what calls in flight hold plus
//! the new amount stays within the line's limits, and refuses with
//! [`BudgetExceeded`] (`BUDGET_EXCEEDED`) naming the first line that would
//! pass. Settling gives the held amount back and charges what the call
//! really spent.
//!
//! ```
//! use std::sync::Arc;
//! use tower_agent::stores::budget::{BudgetLine, BudgetStore, MemoryBudgetStore, Spend};
//! use tower_agent::types::Cost;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_agent::BoxError> {
//! let store = MemoryBudgetStore::new();
//! let line = BudgetLine::new("daily", "tenant:acme").max_cost("1.00".parse()?);
//! let lines = [line.clone()];
//!
//! let held = store.reserve(&lines, Spend::cost("0.60".parse()?)).await?;
//! // A second call needing 0.60 does not fit next to the first one's hold.
//! assert!(store.reserve(&lines, Spend::cost("0.60".parse()?)).await.is_err());
//! store.settle(held, Spend::cost("0.25".parse()?)).await?;
//! assert_eq!(store.state(&line).await?.spent.cost, "0.25".parse::<Cost>()?);
//! # Ok(()) }
//! ```
//!
//! # Windows
//!
//! A line with a window counts from the start of the current window only.
//! [`MemoryBudgetStore`] starts its windows when it is created and lays
//! them back to back on tokio's clock (so tests run them under a paused
//! clock); a store shared across processes aligns them to wall-clock time.
//! A call settled after its window ended is charged to the current one.

use std::collections::HashMap;
use std::fmt;
use std::ops::{Add, AddAssign};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::{self, BoxFuture};
use tokio::time::Instant;

use crate::error::{AgentError, BoxError, BudgetExceeded};
use crate::types::{Amount, Cost};

/// Money and tokens, spent or reserved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spend {
    /// Money.
    pub cost: Cost,
    /// Input plus output tokens.
    pub tokens: u64,
}

impl Spend {
    /// Nothing.
    pub const ZERO: Spend = Spend {
        cost: Cost::ZERO,
        tokens: 0,
    };

    /// `cost` and `tokens`.
    pub const fn new(cost: Cost, tokens: u64) -> Self {
        Self { cost, tokens }
    }

    /// Money only.
    pub const fn cost(cost: Cost) -> Self {
        Self::new(cost, 0)
    }

    /// Tokens only.
    pub const fn tokens(tokens: u64) -> Self {
        Self::new(Cost::ZERO, tokens)
    }

    fn saturating_sub(self, other: Spend) -> Spend {
        Spend {
            cost: self.cost.saturating_sub(other.cost),
            tokens: self.tokens.saturating_sub(other.tokens),
        }
    }
}

impl Add for Spend {
    type Output = Spend;

    fn add(self, rhs: Spend) -> Spend {
        Spend::new(self.cost + rhs.cost, self.tokens + rhs.tokens)
    }
}

impl AddAssign for Spend {
    fn add_assign(&mut self, rhs: Spend) {
        *self = *self + rhs;
    }
}

/// One budget kept for one key over one window. See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BudgetLine {
    /// The budget's name.
    pub budget: Arc<str>,
    /// What it is kept for, e.g. `tenant:acme`.
    pub key: String,
    /// The window it counts over; `None`: the whole time.
    pub window: Option<Duration>,
    /// The most money it allows.
    pub max_cost: Option<Cost>,
    /// The most tokens it allows.
    pub max_tokens: Option<u64>,
}

impl BudgetLine {
    /// A line of `budget` for `key`, over the whole time, with no limits yet.
    pub fn new(budget: impl Into<Arc<str>>, key: impl Into<String>) -> Self {
        Self {
            budget: budget.into(),
            key: key.into(),
            window: None,
            max_cost: None,
            max_tokens: None,
        }
    }

    /// Counts over windows of `window`.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = Some(window);
        self
    }

    /// At most `cost`.
    pub fn max_cost(mut self, cost: Cost) -> Self {
        self.max_cost = Some(cost);
        self
    }

    /// At most `tokens`.
    pub fn max_tokens(mut self, tokens: u64) -> Self {
        self.max_tokens = Some(tokens);
        self
    }

    /// The refusal of `requested` on this line, if it does not fit.
    pub fn check(&self, held: Spend, requested: Spend) -> Result<(), BudgetExceeded> {
        let refuse = |limit, spent, requested| BudgetExceeded {
            budget: self.budget.to_string(),
            key: self.key.clone(),
            limit,
            spent,
            requested,
        };
        if let Some(max) = self.max_cost {
            if held.cost + requested.cost > max {
                return Err(refuse(
                    Amount::Cost(max),
                    Amount::Cost(held.cost),
                    Amount::Cost(requested.cost),
                ));
            }
        }
        if let Some(max) = self.max_tokens {
            if held.tokens.saturating_add(requested.tokens) > max {
                return Err(refuse(
                    Amount::Tokens(max),
                    Amount::Tokens(held.tokens),
                    Amount::Tokens(requested.tokens),
                ));
            }
        }
        Ok(())
    }
}

/// A line a reservation holds, in the window it was made in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLine {
    /// The budget's name.
    pub budget: Arc<str>,
    /// Its key.
    pub key: String,
    /// The window the hold is in (0 for a line without windows).
    pub window: u64,
}

/// An amount held on some lines until it is [settled](BudgetStore::settle).
/// Settle every reservation once, also when the call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The amount held on each line.
    pub amount: Spend,
    /// The lines.
    pub lines: Vec<HeldLine>,
}

/// What a line holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LineState {
    /// Settled spend in the current window.
    pub spent: Spend,
    /// Held by calls in flight.
    pub reserved: Spend,
}

/// The budget ledger. See the [module docs](self).
///
/// Object-safe (`Arc<dyn BudgetStore>`); each method returns a boxed future
/// so that a store across the network can wait.
///
/// # Errors
///
/// [`reserve`](Self::reserve) refuses with an [`AgentError::BudgetExceeded`]
/// (boxed); any other error is the store's own trouble, which the budget
/// layer treats as its fail-open setting says.
pub trait BudgetStore: Send + Sync + 'static {
    /// Holds `amount` on every line of `lines`, or on none. Lines without
    /// limits are held too, so that they count.
    fn reserve<'a>(
        &'a self,
        lines: &'a [BudgetLine],
        amount: Spend,
    ) -> BoxFuture<'a, Result<Reservation, BoxError>>;

    /// Gives the held amount back and charges `actual` on the same lines.
    fn settle(
        &self,
        reservation: Reservation,
        actual: Spend,
    ) -> BoxFuture<'_, Result<(), BoxError>>;

    /// What `line` holds now.
    fn state<'a>(&'a self, line: &'a BudgetLine) -> BoxFuture<'a, Result<LineState, BoxError>>;
}

#[derive(Debug, Default)]
struct Entry {
    window: u64,
    state: LineState,
}

/// A [`BudgetStore`] in one process: one lock over every line, so a
/// reservation is atomic across its lines. Never fails.
///
/// # Clone
///
/// Clones share the ledger.
#[derive(Clone)]
pub struct MemoryBudgetStore {
    inner: Arc<Memory>,
}

struct Memory {
    origin: Instant,
    lines: Mutex<HashMap<(Arc<str>, String), Entry>>,
    reservations: AtomicU64,
}

impl fmt::Debug for MemoryBudgetStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBudgetStore")
            .field(
                "reservations",
                &self.inner.reservations.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

impl Default for MemoryBudgetStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBudgetStore {
    /// An empty ledger; windows start now.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Memory {
                origin: Instant::now(),
                lines: Mutex::default(),
                reservations: AtomicU64::new(0),
            }),
        }
    }

    fn window_of(&self, window: Option<Duration>) -> u64 {
        match window {
            Some(w) if !w.is_zero() => {
                (self.inner.origin.elapsed().as_nanos() / w.as_nanos()) as u64
            }
            _ => 0,
        }
    }

    /// Reserves at once: the synchronous form of [`BudgetStore::reserve`].
    ///
    /// # Errors
    ///
    /// The first line the amount does not fit.
    pub fn reserve_now(
        &self,
        lines: &[BudgetLine],
        amount: Spend,
    ) -> Result<Reservation, BudgetExceeded> {
        let mut entries = self
            .inner
            .lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let windows: Vec<u64> = lines.iter().map(|l| self.window_of(l.window)).collect();
        for (line, &window) in lines.iter().zip(&windows) {
            if let Some(entry) = entries.get(&(line.budget.clone(), line.key.clone())) {
                if entry.window == window {
                    line.check(entry.state.spent + entry.state.reserved, amount)?;
                    continue;
                }
            }
            line.check(Spend::ZERO, amount)?;
        }
        let mut held = Vec::with_capacity(lines.len());
        for (line, window) in lines.iter().zip(windows) {
            let entry = entries
                .entry((line.budget.clone(), line.key.clone()))
                .or_default();
            if entry.window != window {
                *entry = Entry {
                    window,
                    state: LineState::default(),
                };
            }
            entry.state.reserved += amount;
            held.push(HeldLine {
                budget: line.budget.clone(),
                key: line.key.clone(),
                window,
            });
        }
        self.inner.reservations.fetch_add(1, Ordering::Relaxed);
        Ok(Reservation {
            amount,
            lines: held,
        })
    }

    /// Settles at once: the synchronous form of [`BudgetStore::settle`].
    pub fn settle_now(&self, reservation: Reservation, actual: Spend) {
        let mut entries = self
            .inner
            .lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for held in reservation.lines {
            let entry = entries.entry((held.budget, held.key)).or_default();
            if entry.window == held.window {
                entry.state.reserved = entry.state.reserved.saturating_sub(reservation.amount);
            }
            // A window that ended meanwhile took the hold with it; the
            // spend counts in the current one.
            entry.state.spent += actual;
        }
    }

    /// What `line` holds now, at once.
    pub fn state_now(&self, line: &BudgetLine) -> LineState {
        let window = self.window_of(line.window);
        let entries = self
            .inner
            .lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match entries.get(&(line.budget.clone(), line.key.clone())) {
            Some(entry) if entry.window == window => entry.state,
            _ => LineState::default(),
        }
    }
}

impl BudgetStore for MemoryBudgetStore {
    fn reserve<'a>(
        &'a self,
        lines: &'a [BudgetLine],
        amount: Spend,
    ) -> BoxFuture<'a, Result<Reservation, BoxError>> {
        let result = self
            .reserve_now(lines, amount)
            .map_err(|e| Box::new(AgentError::BudgetExceeded(e)) as BoxError);
        Box::pin(future::ready(result))
    }

    fn settle(
        &self,
        reservation: Reservation,
        actual: Spend,
    ) -> BoxFuture<'_, Result<(), BoxError>> {
        self.settle_now(reservation, actual);
        Box::pin(future::ready(Ok(())))
    }

    fn state<'a>(&'a self, line: &'a BudgetLine) -> BoxFuture<'a, Result<LineState, BoxError>> {
        Box::pin(future::ready(Ok(self.state_now(line))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(s: &str) -> Cost {
        s.parse().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn reserves_on_every_line_or_on_none() {
        let store = MemoryBudgetStore::new();
        let wide = BudgetLine::new("wide", "tenant:a").max_cost(cost("10"));
        let narrow = BudgetLine::new("narrow", "run:r").max_tokens(100);
        let lines = [wide.clone(), narrow.clone()];
        let first = store
            .reserve(&lines, Spend::new(cost("1"), 80))
            .await
            .unwrap();
        let err = store
            .reserve(&lines, Spend::new(cost("1"), 30))
            .await
            .unwrap_err();
        match AgentError::classify(err) {
            AgentError::BudgetExceeded(e) => {
                assert_eq!(e.budget, "narrow");
                assert_eq!(e.limit, Amount::Tokens(100));
                assert_eq!(e.spent, Amount::Tokens(80));
                assert_eq!(e.requested, Amount::Tokens(30));
            }
            other => panic!("expected BUDGET_EXCEEDED, got {other:?}"),
        }
        // The refused call held nothing on the line that had room.
        assert_eq!(store.state_now(&wide).reserved, Spend::new(cost("1"), 80));
        store.settle_now(first, Spend::new(cost("0.4"), 20));
        assert_eq!(
            store.state_now(&wide),
            LineState {
                spent: Spend::new(cost("0.4"), 20),
                reserved: Spend::ZERO
            }
        );
        store
            .reserve(&lines, Spend::new(cost("1"), 80))
            .await
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_starts_afresh_and_a_late_settlement_counts_in_the_new_one() {
        let store = MemoryBudgetStore::new();
        let daily = BudgetLine::new("daily", "tenant:a")
            .window(Duration::from_secs(86_400))
            .max_cost(cost("1"));
        let lines = [daily.clone()];
        let held = store.reserve_now(&lines, Spend::cost(cost("0.9"))).unwrap();
        assert!(store.reserve_now(&lines, Spend::cost(cost("0.2"))).is_err());

        tokio::time::advance(Duration::from_secs(86_400)).await;
        assert_eq!(store.state_now(&daily), LineState::default());
        let next = store.reserve_now(&lines, Spend::cost(cost("0.2"))).unwrap();
        store.settle_now(held, Spend::cost(cost("0.5")));
        store.settle_now(next, Spend::cost(cost("0.1")));
        assert_eq!(
            store.state_now(&daily),
            LineState {
                spent: Spend::cost(cost("0.6")),
                reserved: Spend::ZERO
            }
        );
    }
}
