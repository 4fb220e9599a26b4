use std::ops::{Add, AddAssign};

use serde::{Deserialize, Serialize};

/// Token counts of one model call, or the sum of many.
///
/// `cached_input_tokens` and `reasoning_tokens` are subsets of
/// `input_tokens` and `output_tokens`, as the providers report them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens the model read (the prompt).
    pub input_tokens: u64,
    /// Tokens the model wrote (the completion).
    pub output_tokens: u64,
    /// Input tokens served from the provider's prompt cache.
    #[serde(default)]
    pub cached_input_tokens: u64,
    /// Output tokens spent on hidden reasoning.
    #[serde(default)]
    pub reasoning_tokens: u64,
}

impl Usage {
    /// Usage of `input` prompt and `output` completion tokens.
    pub const fn new(input_tokens: u64, output_tokens: u64) -> Self {
        Self {
            input_tokens,
            output_tokens,
            cached_input_tokens: 0,
            reasoning_tokens: 0,
        }
    }

    /// Input plus output tokens.
    pub const fn total_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    /// Whether every count is zero.
    pub const fn is_zero(&self) -> bool {
        self.input_tokens == 0
            && self.output_tokens == 0
            && self.cached_input_tokens == 0
            && self.reasoning_tokens == 0
    }
}

impl Add for Usage {
    type Output = Usage;

    fn add(mut self, rhs: Usage) -> Usage {
        self += rhs;
        self
    }
}

impl AddAssign for Usage {
    fn add_assign(&mut self, rhs: Usage) {
        self.input_tokens += rhs.input_tokens;
        self.output_tokens += rhs.output_tokens;
        self.cached_input_tokens += rhs.cached_input_tokens;
        self.reasoning_tokens += rhs.reasoning_tokens;
    }
}

impl std::iter::Sum for Usage {
    fn sum<I: Iterator<Item = Usage>>(iter: I) -> Usage {
        iter.fold(Usage::default(), Add::add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_every_field() {
        let a = Usage {
            input_tokens: 10,
            output_tokens: 5,
            cached_input_tokens: 2,
            reasoning_tokens: 1,
        };
        let total: Usage = [a, a, Usage::new(1, 1)].into_iter().sum();
        assert_eq!(
            total,
            Usage {
                input_tokens: 21,
                output_tokens: 11,
                cached_input_tokens: 4,
                reasoning_tokens: 2
            }
        );
        assert_eq!(total.total_tokens(), 32);
        assert!(Usage::default().is_zero());
    }
}
