//! The configuration of a quota: [`Rate`] and [`Limits`].

use std::time::Duration;

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

    pub(super) fn is_valid(&self) -> bool {
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

    pub(super) fn is_valid(&self) -> bool {
        self.requests.is_none_or(|r| r.is_valid()) && self.tokens.is_none_or(|r| r.is_valid())
    }
}
