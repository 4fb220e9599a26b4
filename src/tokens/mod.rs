//! Token counting: the [`TokenCounter`] trait, a real BPE tokenizer
//! ([`BpeCounter`], feature `tokenizer`, on by default), a cheap
//! [`EstimateCounter`], a per-model choice ([`TokenCounters`]) and
//! incremental counts of a conversation ([`TokenTally`]).
//!
//! Trimming, compaction, budgets and the rate limiter's reservation read
//! token counts from here. A [`TokenTally`] remembers the count of every
//! message it has seen, so asking again after a turn appended a message
//! counts only that message, whatever the length of the thread.
//!
//! ```
//! use tower_agent::tokens::{TokenCounter, TokenCounters, TokenTally};
//! use tower_agent::types::{History, Message};
//!
//! let counters = TokenCounters::openai();
//! let counter = counters.for_model("gpt-4o-mini");
//! assert_eq!(counter.name(), "o200k_base");
//! assert_eq!(counter.count("hello world"), 2);
//!
//! let tally = TokenTally::new(counter);
//! let mut history = History::from(vec![Message::system("Be brief."), Message::user("Hi!")]);
//! let before = tally.count(&history);
//! history.push(Message::assistant("Hello."));
//! // Only the new message is counted.
//! assert_eq!(tally.count(&history), before + tally.message(&history[2]));
//! ```
//!
//! # Which counter
//!
//! The BPE counter is exact for OpenAI's models (`o200k_base` for the GPT-4o,
//! GPT-4.1, GPT-5 and o-series families, `cl100k_base` for GPT-4 and
//! GPT-3.5). For other providers' models it is a close estimate; the
//! [`EstimateCounter`] (a token per four bytes) costs almost nothing and is
//! what to use where an upper-bound guess is enough.

#[cfg(feature = "tokenizer")]
mod bpe;
mod choice;
mod model_info;
mod run;
mod tally;

#[cfg(feature = "tokenizer")]
pub use bpe::BpeCounter;
pub use choice::TokenCounters;
pub use model_info::{ModelInfo, ModelInfoTable};
pub use run::{request_tokens, Conversation};
pub use tally::{Counts, TokenTally};

use std::fmt;

use crate::types::{ContentPart, Message, MessageContent, ToolSpec};

/// Tokens every chat message costs beyond its text (role and delimiters), in
/// OpenAI's chat format.
pub const TOKENS_PER_MESSAGE: usize = 3;
/// Tokens a message's `name` costs beyond its text.
pub const TOKENS_PER_NAME: usize = 1;
/// Tokens that prime the model's reply, counted once per request.
pub const REPLY_PRIMING: usize = 3;
/// Tokens an image part is counted as when its detail is `low`.
pub const IMAGE_TOKENS_LOW: usize = 85;
/// Tokens an image part is counted as otherwise (a 1024×1024 image at high
/// detail; the real figure depends on its size, which a URL does not say).
pub const IMAGE_TOKENS: usize = 765;

/// Counts the tokens of a text, a message and a request.
///
/// Implement [`count`](Self::count); the provided methods add the chat
/// format's per-message overhead.
pub trait TokenCounter: Send + Sync + fmt::Debug + 'static {
    /// What the counter is, such as `o200k_base` or `estimate`.
    fn name(&self) -> &str;

    /// The tokens of `text`.
    fn count(&self, text: &str) -> usize;

    /// The tokens of one message: its text, its tool calls, its name and the
    /// chat format's overhead.
    fn count_message(&self, message: &Message) -> usize {
        let mut tokens = TOKENS_PER_MESSAGE;
        match &message.content {
            None => {}
            Some(MessageContent::Text(text)) => tokens += self.count(text),
            Some(MessageContent::Parts(parts)) => {
                for part in parts {
                    tokens += match part {
                        ContentPart::Text { text } => self.count(text),
                        ContentPart::ImageUrl { image_url } => {
                            if image_url.detail.as_deref() == Some("low") {
                                IMAGE_TOKENS_LOW
                            } else {
                                IMAGE_TOKENS
                            }
                        }
                    };
                }
            }
        }
        for call in &message.tool_calls {
            tokens += TOKENS_PER_MESSAGE + self.count(&call.name) + self.count(&call.arguments);
        }
        if let Some(name) = &message.name {
            tokens += TOKENS_PER_NAME + self.count(name);
        }
        tokens
    }

    /// The tokens of the tools a request offers: each one's name,
    /// description and parameter schema.
    fn count_tools(&self, tools: &[ToolSpec]) -> usize {
        tools
            .iter()
            .map(|tool| {
                TOKENS_PER_MESSAGE
                    + self.count(&tool.name)
                    + self.count(&tool.description)
                    + self.count(&tool.parameters.to_string())
            })
            .sum()
    }

    /// The tokens of a whole request's messages, with the reply priming.
    /// Counts every message; a [`TokenTally`] counts incrementally.
    fn count_messages(&self, messages: &[Message]) -> usize {
        REPLY_PRIMING
            + messages
                .iter()
                .map(|m| self.count_message(m))
                .sum::<usize>()
    }
}

/// A cheap estimate: one token per `bytes_per_token` bytes of text (four by
/// default), rounded up. Never reads the text's content, so it runs at
/// memory speed; it over-counts English prose a little and under-counts
/// dense code and non-Latin scripts.
///
/// ```
/// use tower_agent::tokens::{EstimateCounter, TokenCounter};
///
/// assert_eq!(EstimateCounter::new().count("twelve bytes"), 3);
/// assert_eq!(EstimateCounter::new().bytes_per_token(2).count("twelve bytes"), 6);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct EstimateCounter {
    bytes_per_token: usize,
}

impl EstimateCounter {
    /// Four bytes a token.
    pub const fn new() -> Self {
        Self { bytes_per_token: 4 }
    }

    /// `bytes` bytes a token (at least one).
    pub const fn bytes_per_token(mut self, bytes: usize) -> Self {
        self.bytes_per_token = if bytes == 0 { 1 } else { bytes };
        self
    }
}

impl Default for EstimateCounter {
    fn default() -> Self {
        Self::new()
    }
}

impl TokenCounter for EstimateCounter {
    fn name(&self) -> &str {
        "estimate"
    }

    fn count(&self, text: &str) -> usize {
        text.len().div_ceil(self.bytes_per_token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ImageUrl, ToolCall};

    #[test]
    fn message_overhead_covers_text_calls_names_and_images() {
        let counter = EstimateCounter::new();
        assert_eq!(counter.count_message(&Message::user("abcd")), 3 + 1);
        let mut named = Message::user("abcd");
        named.name = Some("ann".into());
        assert_eq!(counter.count_message(&named), 3 + 1 + 1 + 1);
        let calls = Message::assistant_tool_calls(vec![ToolCall::new("c1", "look", "{}")]);
        assert_eq!(counter.count_message(&calls), 3 + 3 + 1 + 1);
        let image = Message {
            content: Some(MessageContent::Parts(vec![
                ContentPart::Text { text: "see".into() },
                ContentPart::ImageUrl {
                    image_url: ImageUrl {
                        url: "https://example.com/a.png".into(),
                        detail: Some("low".into()),
                    },
                },
            ])),
            ..Message::user("")
        };
        assert_eq!(counter.count_message(&image), 3 + 1 + IMAGE_TOKENS_LOW);
        assert_eq!(
            counter.count_messages(&[Message::user("abcd"), Message::user("")]),
            REPLY_PRIMING + 4 + 3
        );
    }

    #[test]
    fn a_zero_byte_estimate_counts_every_byte() {
        assert_eq!(EstimateCounter::new().bytes_per_token(0).count("abc"), 3);
        assert_eq!(EstimateCounter::new().count(""), 0);
    }
}
