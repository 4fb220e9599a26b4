//! The configuration of a quota: [`Rate`] and [`Limits`], and everything
//! the layer's setters configure.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::request::ModelCall;
use crate::types::ModelRequest;

/// How a call's key and token estimate are found.
pub(super) type KeyFn = dyn Fn(&ModelCall) -> String + Send + Sync;
pub(super) type EstimateFn = dyn Fn(&ModelRequest) -> u64 + Send + Sync;

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

/// What the setters configure.
#[derive(Clone)]
pub(super) struct Config {
    pub(super) default: Limits,
    pub(super) per_key: HashMap<String, Limits>,
    pub(super) max_wait: Duration,
    pub(super) fixed_key: Option<String>,
    pub(super) key_fn: Option<Arc<KeyFn>>,
    pub(super) estimate: Option<Arc<EstimateFn>>,
    pub(super) default_output_tokens: u64,
    pub(super) idle_keys: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            default: Limits::new(),
            per_key: HashMap::new(),
            max_wait: Duration::from_secs(30),
            fixed_key: None,
            key_fn: None,
            estimate: None,
            default_output_tokens: 1024,
            idle_keys: 1024,
        }
    }
}

impl Config {
    pub(super) fn check(&self) -> Result<(), String> {
        if !self.default.is_valid() {
            return Err("rate limit: amounts and intervals must be above zero".into());
        }
        if let Some((key, _)) = self.per_key.iter().find(|(_, l)| !l.is_valid()) {
            return Err(format!(
                "rate limit of `{key}`: amounts and intervals must be above zero"
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("default", &self.default)
            .field("per_key", &self.per_key)
            .field("max_wait", &self.max_wait)
            .field("fixed_key", &self.fixed_key)
            .field("default_output_tokens", &self.default_output_tokens)
            .field("idle_keys", &self.idle_keys)
            .finish_non_exhaustive()
    }
}
