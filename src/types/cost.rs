use std::collections::HashMap;
use std::fmt;
use std::iter::Sum;
use std::ops::{Add, AddAssign};
use std::str::FromStr;

pub use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use super::Usage;

/// An amount of money, in a [`Decimal`] (never a float summed call after
/// call), in the currency of the [`PriceTable`] that priced it.
///
/// Serializes as a string (`"0.0125"`), so no precision is lost in JSON;
/// parses from a string or a number.
///
/// ```
/// use tower_agent::types::Cost;
///
/// let a: Cost = "0.10".parse().unwrap();
/// let b: Cost = "0.20".parse().unwrap();
/// assert_eq!(a + b, "0.30".parse().unwrap()); // exactly, unlike 0.1 + 0.2 in f64
/// ```
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Cost(Decimal);

impl Cost {
    /// Nothing.
    pub const ZERO: Cost = Cost(Decimal::ZERO);

    /// An amount.
    pub const fn new(amount: Decimal) -> Self {
        Self(amount)
    }

    /// The amount.
    pub const fn amount(self) -> Decimal {
        self.0
    }

    /// What is left of `self` after `other`, never below zero.
    pub fn saturating_sub(self, other: Cost) -> Cost {
        Cost((self.0 - other.0).max(Decimal::ZERO))
    }
}

impl From<Decimal> for Cost {
    fn from(amount: Decimal) -> Self {
        Self(amount)
    }
}

impl FromStr for Cost {
    type Err = rust_decimal::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Decimal::from_str_exact(s).map(Cost)
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.normalize(), f)
    }
}

impl Add for Cost {
    type Output = Cost;

    fn add(self, rhs: Cost) -> Cost {
        Cost(self.0 + rhs.0)
    }
}

impl AddAssign for Cost {
    fn add_assign(&mut self, rhs: Cost) {
        self.0 += rhs.0;
    }
}

impl Sum for Cost {
    fn sum<I: Iterator<Item = Cost>>(iter: I) -> Cost {
        iter.fold(Cost::ZERO, Add::add)
    }
}

/// What a budget counts: money or tokens. Names a limit and a spend in
/// [`BudgetExceeded`](crate::error::BudgetExceeded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Amount {
    /// Money.
    Cost(Cost),
    /// Input plus output tokens.
    Tokens(u64),
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Amount::Cost(cost) => write!(f, "{cost}"),
            Amount::Tokens(tokens) => write!(f, "{tokens} tokens"),
        }
    }
}

/// A model's prices per million tokens: input, cached input, output and
/// reasoning. Cached input defaults to the input price, reasoning to the
/// output price.
///
/// Cached input tokens are a part of `input_tokens`, reasoning tokens a
/// part of `output_tokens` (as providers report them), so each token is
/// priced once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Price {
    /// Per million input tokens.
    pub input: Decimal,
    /// Per million cached input tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<Decimal>,
    /// Per million output tokens.
    pub output: Decimal,
    /// Per million reasoning tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Decimal>,
}

const MILLION: Decimal = Decimal::from_parts(1_000_000, 0, 0, false, 0);

impl Price {
    /// `input` and `output` per million tokens.
    pub fn new(input: Decimal, output: Decimal) -> Self {
        Self {
            input,
            cached_input: None,
            output,
            reasoning: None,
        }
    }

    /// The price per million cached input tokens.
    pub fn cached_input(mut self, price: Decimal) -> Self {
        self.cached_input = Some(price);
        self
    }

    /// The price per million reasoning tokens.
    pub fn reasoning(mut self, price: Decimal) -> Self {
        self.reasoning = Some(price);
        self
    }

    /// The cost of `usage`.
    pub fn cost(&self, usage: &Usage) -> Cost {
        let cached = usage.cached_input_tokens.min(usage.input_tokens);
        let reasoning = usage.reasoning_tokens.min(usage.output_tokens);
        let tokens = |n: u64, price: Decimal| Decimal::from(n) * price;
        let total = tokens(usage.input_tokens - cached, self.input)
            + tokens(cached, self.cached_input.unwrap_or(self.input))
            + tokens(usage.output_tokens - reasoning, self.output)
            + tokens(reasoning, self.reasoning.unwrap_or(self.output));
        Cost(total / MILLION)
    }

    /// The most `usage` could cost, were its output all of the dearer
    /// kind and no input cached: what a reservation assumes.
    pub fn ceiling(&self, input_tokens: u64, output_tokens: u64) -> Cost {
        let input = self.input.max(self.cached_input.unwrap_or(self.input));
        let output = self.output.max(self.reasoning.unwrap_or(self.output));
        Cost(
            (Decimal::from(input_tokens) * input + Decimal::from(output_tokens) * output) / MILLION,
        )
    }
}

/// Prices per model, from code or JSON.
///
/// A model is found by its exact name, else by the longest entry ending in
/// `*` that prefixes it (`"gpt-4o*"` prices `gpt-4o-2024-08-06`).
///
/// ```
/// use tower_agent::types::{PriceTable, Usage};
///
/// let prices = PriceTable::from_json(r#"{
///     "gpt-4o*": {"input": "2.50", "cached_input": "1.25", "output": "10.00"}
/// }"#).unwrap();
/// let usage = Usage { input_tokens: 1_000, cached_input_tokens: 400, ..Usage::new(1_000, 200) };
/// // 600 × 2.50 + 400 × 1.25 + 200 × 10.00, per million
/// assert_eq!(prices.cost("gpt-4o-mini", &usage).unwrap().to_string(), "0.004");
/// assert_eq!(prices.cost("claude", &usage), None);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PriceTable {
    models: HashMap<String, Price>,
}

impl PriceTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the price of `model` (a name, or a prefix ending in `*`).
    pub fn price(mut self, model: impl Into<String>, price: Price) -> Self {
        self.models.insert(model.into(), price);
        self
    }

    /// A table from JSON: an object of model names to prices, each price an
    /// object with `input`, `output` and optionally `cached_input` and
    /// `reasoning`, per million tokens (strings or numbers).
    ///
    /// # Errors
    ///
    /// The JSON does not have that shape.
    pub fn from_json(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }

    /// The price of `model`, if the table has one.
    pub fn get(&self, model: &str) -> Option<&Price> {
        if let Some(price) = self.models.get(model) {
            return Some(price);
        }
        self.models
            .iter()
            .filter_map(|(name, price)| {
                let prefix = name.strip_suffix('*')?;
                model.starts_with(prefix).then_some((prefix.len(), price))
            })
            .max_by_key(|(len, _)| *len)
            .map(|(_, price)| price)
    }

    /// The cost of `usage` on `model`, if the table prices it.
    pub fn cost(&self, model: &str, usage: &Usage) -> Option<Cost> {
        self.get(model).map(|price| price.cost(usage))
    }

    /// Whether the table prices no model.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(s: &str) -> Decimal {
        Decimal::from_str_exact(s).unwrap()
    }

    #[test]
    fn every_kind_of_token_is_priced_once() {
        let price = Price::new(dec("3"), dec("15"))
            .cached_input(dec("0.30"))
            .reasoning(dec("20"));
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 100_000,
            cached_input_tokens: 500_000,
            reasoning_tokens: 50_000,
        };
        // 0.5 M × 3 + 0.5 M × 0.30 + 0.05 M × 15 + 0.05 M × 20
        assert_eq!(price.cost(&usage), Cost(dec("3.4")));
        assert_eq!(price.ceiling(1_000_000, 100_000), Cost(dec("5")));
    }

    #[test]
    fn sums_are_exact_and_json_keeps_every_digit() {
        let tenth: Cost = "0.1".parse().unwrap();
        let sum: Cost = std::iter::repeat_n(tenth, 10).sum();
        assert_eq!(sum, "1".parse().unwrap());
        let json = serde_json::to_string(&"0.0000125".parse::<Cost>().unwrap()).unwrap();
        assert_eq!(json, "\"0.0000125\"");
        assert_eq!(
            serde_json::from_str::<Cost>("0.25").unwrap(),
            Cost(dec("0.25"))
        );
    }

    #[test]
    fn exact_names_beat_prefixes_and_longer_prefixes_win() {
        let table = PriceTable::new()
            .price("gpt*", Price::new(dec("1"), dec("1")))
            .price("gpt-4o*", Price::new(dec("2"), dec("2")))
            .price("gpt-4o-mini", Price::new(dec("3"), dec("3")));
        assert_eq!(table.get("gpt-4o-mini").unwrap().input, dec("3"));
        assert_eq!(table.get("gpt-4o-2024").unwrap().input, dec("2"));
        assert_eq!(table.get("gpt-5").unwrap().input, dec("1"));
        assert!(table.get("claude").is_none());
        assert!(PriceTable::from_json(r#"{"m": {"input": "x", "output": 1}}"#).is_err());
    }
}
