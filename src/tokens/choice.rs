//! [`TokenCounters`]: which counter counts for which model.

use std::fmt;
use std::sync::Arc;

use super::TokenCounter;

/// A per-model choice of [`TokenCounter`]: rules matched on the model's
/// name, in order, and a counter for every other model.
///
/// A rule's pattern is a model name, or a prefix ending in `*`
/// (`gpt-4o*`). Provider prefixes such as `openai/` are ignored when
/// matching.
///
/// ```
/// use tower_agent::tokens::{EstimateCounter, TokenCounter, TokenCounters};
///
/// let counters = TokenCounters::new(EstimateCounter::new())
///     .model("my-model*", EstimateCounter::new().bytes_per_token(3));
/// assert_eq!(counters.for_model("my-model-large").count("abcdefgh"), 3);
/// assert_eq!(counters.for_model("other").count("abcdefgh"), 2);
/// ```
#[derive(Clone)]
pub struct TokenCounters {
    rules: Vec<(Pattern, Arc<dyn TokenCounter>)>,
    default: Arc<dyn TokenCounter>,
}

#[derive(Clone, Debug)]
enum Pattern {
    Exact(String),
    Prefix(String),
}

impl Pattern {
    fn parse(pattern: &str) -> Self {
        match pattern.strip_suffix('*') {
            Some(prefix) => Pattern::Prefix(prefix.to_owned()),
            None => Pattern::Exact(pattern.to_owned()),
        }
    }

    fn matches(&self, model: &str) -> bool {
        match self {
            Pattern::Exact(name) => model == name,
            Pattern::Prefix(prefix) => model.starts_with(prefix.as_str()),
        }
    }
}

impl TokenCounters {
    /// `default` for every model, until rules are added.
    pub fn new(default: impl TokenCounter) -> Self {
        Self {
            rules: Vec::new(),
            default: Arc::new(default),
        }
    }

    /// OpenAI's encodings for OpenAI's model families (`o200k_base` for
    /// GPT-4o, GPT-4.1, GPT-4.5, GPT-5, o1, o3 and o4; `cl100k_base` for GPT-4
    /// and GPT-3.5), and `o200k_base` as a close estimate for every other
    /// model. Without the `tokenizer` feature, the [`EstimateCounter`](super::EstimateCounter) for all.
    pub fn openai() -> Self {
        #[cfg(feature = "tokenizer")]
        {
            use super::BpeCounter;
            let o200k = BpeCounter::o200k_base();
            let cl100k = BpeCounter::cl100k_base();
            let mut counters = Self::new(o200k);
            for family in [
                "gpt-4o*", "gpt-4.1*", "gpt-4.5*", "gpt-5*", "o1*", "o3*", "o4*",
            ] {
                counters = counters.model(family, o200k);
            }
            counters.model("gpt-4*", cl100k).model("gpt-3.5*", cl100k)
        }
        #[cfg(not(feature = "tokenizer"))]
        {
            Self::new(super::EstimateCounter::new())
        }
    }

    /// Counts models matching `pattern` with `counter`. Earlier rules win.
    pub fn model(self, pattern: &str, counter: impl TokenCounter) -> Self {
        self.model_arc(pattern, Arc::new(counter))
    }

    /// [`model`](Self::model) with a shared counter.
    pub fn model_arc(mut self, pattern: &str, counter: Arc<dyn TokenCounter>) -> Self {
        self.rules.push((Pattern::parse(pattern), counter));
        self
    }

    /// The counter for `model`.
    pub fn for_model(&self, model: &str) -> Arc<dyn TokenCounter> {
        let bare = model.rsplit_once('/').map_or(model, |(_, name)| name);
        self.rules
            .iter()
            .find(|(pattern, _)| pattern.matches(bare))
            .map_or(&self.default, |(_, counter)| counter)
            .clone()
    }
}

impl Default for TokenCounters {
    /// [`TokenCounters::openai`].
    fn default() -> Self {
        Self::openai()
    }
}

impl fmt::Debug for TokenCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenCounters")
            .field(
                "rules",
                &self
                    .rules
                    .iter()
                    .map(|(pattern, counter)| (pattern, counter.name()))
                    .collect::<Vec<_>>(),
            )
            .field("default", &self.default.name())
            .finish()
    }
}

#[cfg(all(test, feature = "tokenizer"))]
mod tests {
    use super::*;
    use crate::tokens::EstimateCounter;

    #[test]
    fn openai_families_get_their_encoding() {
        let counters = TokenCounters::openai();
        assert_eq!(counters.for_model("gpt-4o-mini").name(), "o200k_base");
        assert_eq!(counters.for_model("openai/gpt-5").name(), "o200k_base");
        assert_eq!(counters.for_model("o3-mini").name(), "o200k_base");
        assert_eq!(counters.for_model("gpt-4-turbo").name(), "cl100k_base");
        assert_eq!(counters.for_model("gpt-3.5-turbo").name(), "cl100k_base");
        assert_eq!(counters.for_model("claude-sonnet-4").name(), "o200k_base");
    }

    #[test]
    fn exact_names_and_earlier_rules_win() {
        let counters = TokenCounters::new(EstimateCounter::new())
            .model("m", EstimateCounter::new().bytes_per_token(1))
            .model("m*", EstimateCounter::new().bytes_per_token(2));
        assert_eq!(counters.for_model("m").count("abcd"), 4);
        assert_eq!(counters.for_model("m2").count("abcd"), 2);
        assert_eq!(counters.for_model("x").count("abcd"), 1);
    }
}
