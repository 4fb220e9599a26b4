//! [`ContextCompressionMiddleware`]: condenses older messages into a summary
//! once the conversation grows past a threshold.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use serde_json::json;

use crate::context::RunContext;
use crate::error::BoxError;
use crate::hooks::Compaction;
use crate::lifecycle::{Hook, Middleware};
use crate::types::{History, Message, Role};

const SUMMARY_HEADER: &str = "Summary of the earlier conversation:";

/// Whether `message` is a summary this middleware wrote.
fn is_summary(message: &Message) -> bool {
    message.role == Role::System && message.text().starts_with(SUMMARY_HEADER)
}

/// Writes the summary of older messages. A summarizer that calls a model
/// should send its call with the run's context (`ModelCall::new(request,
/// ctx.clone())`), so that the call's usage lands in the run's ledger.
pub trait Summarizer: Send + Sync + 'static {
    /// A summary of `messages`.
    fn summarize<'a>(
        &'a self,
        ctx: &'a RunContext,
        messages: &'a [Message],
    ) -> BoxFuture<'a, Result<String, BoxError>>;
}

/// The default [`Summarizer`]: each message as `role: text`, cut to a
/// number of characters, one per line. Deterministic and model-free.
#[derive(Debug, Clone, Copy)]
pub struct ConcatSummarizer {
    max_chars: usize,
}

impl ConcatSummarizer {
    /// Keeps at most `max_chars` characters of each message.
    pub fn new(max_chars: usize) -> Self {
        Self { max_chars }
    }
}

impl Default for ConcatSummarizer {
    fn default() -> Self {
        Self::new(200)
    }
}

impl Summarizer for ConcatSummarizer {
    fn summarize<'a>(
        &'a self,
        _: &'a RunContext,
        messages: &'a [Message],
    ) -> BoxFuture<'a, Result<String, BoxError>> {
        let lines: Vec<String> = messages
            .iter()
            .map(|m| {
                let text = m.text();
                let mut line: String = text.chars().take(self.max_chars).collect();
                if line.len() < text.len() {
                    line.push('…');
                }
                if line.is_empty() && !m.tool_calls.is_empty() {
                    let names: Vec<&str> = m.tool_calls.iter().map(|c| c.name.as_str()).collect();
                    line = format!("called {}", names.join(", "));
                }
                format!("{}: {line}", m.role.as_str())
            })
            .collect();
        Box::pin(std::future::ready(Ok(lines.join("\n"))))
    }
}

/// When [`ContextCompressionMiddleware`] compresses, and what it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SummarizationPolicy {
    /// Compress once the conversation's text ([`History::text_len`]) is
    /// longer than this many bytes.
    pub trigger_text_len: u64,
    /// How many of the latest messages stay verbatim.
    pub keep_last: usize,
}

impl SummarizationPolicy {
    /// Compress past `trigger_text_len` bytes, keeping the last 6 messages.
    pub fn new(trigger_text_len: u64) -> Self {
        Self {
            trigger_text_len,
            keep_last: 6,
        }
    }

    /// How many of the latest messages stay verbatim.
    pub fn keep_last(mut self, keep_last: usize) -> Self {
        self.keep_last = keep_last;
        self
    }
}

/// One compression that ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryRecord {
    /// The run.
    pub run_id: Arc<str>,
    /// The turn it ran before.
    pub iteration: u32,
    /// Messages before.
    pub messages_before: usize,
    /// Messages after.
    pub messages_after: usize,
    /// The summary that replaced the older messages.
    pub summary: String,
}

/// Condenses older messages into a summary in `before_model`, once the
/// conversation's text passes [`SummarizationPolicy::trigger_text_len`].
///
/// Below the threshold it costs one incremental length check. Above it, it
/// asks the run's `before_compaction` hooks (any `false` skips it), condenses
/// the messages between the leading system messages and the recent window
/// with its [`Summarizer`] into one system message, keeps system messages
/// and the recent window verbatim, never splits a tool call from its result,
/// records a [`SummaryRecord`], tells the `after_compaction` hooks and logs
/// a `compressed` custom event. The run goes on from the compressed
/// conversation.
///
/// ```
/// use tower_agent::lifecycle::builtin::{ContextCompressionMiddleware, SummarizationPolicy};
/// use tower_agent::lifecycle::MiddlewareStack;
///
/// let compression = ContextCompressionMiddleware::new(SummarizationPolicy::new(8_000).keep_last(4));
/// let stack = MiddlewareStack::new().push(compression.clone());
/// assert!(compression.records().is_empty());
/// # let _ = stack;
/// ```
///
/// # Clone
///
/// Clones share the summarizer and the records.
#[derive(Clone)]
pub struct ContextCompressionMiddleware {
    policy: SummarizationPolicy,
    summarizer: Arc<dyn Summarizer>,
    records: Arc<Mutex<Vec<SummaryRecord>>>,
}

impl ContextCompressionMiddleware {
    /// Compresses under `policy` with the [`ConcatSummarizer`].
    pub fn new(policy: SummarizationPolicy) -> Self {
        Self {
            policy,
            summarizer: Arc::new(ConcatSummarizer::default()),
            records: Arc::default(),
        }
    }

    /// Summarizes with `summarizer` instead.
    pub fn summarizer(mut self, summarizer: impl Summarizer) -> Self {
        self.summarizer = Arc::new(summarizer);
        self
    }

    /// The compressions so far, oldest first.
    pub fn records(&self) -> Vec<SummaryRecord> {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Where the older part starts and ends, if there is one worth
    /// compressing: after the leading system messages (an earlier summary is
    /// compressed again), up to a window start that is not a tool result.
    fn plan(&self, messages: &History) -> Option<(usize, usize)> {
        let lead = messages
            .iter()
            .take_while(|m| m.role == Role::System && !is_summary(m))
            .count();
        let mut cut = messages.len().saturating_sub(self.policy.keep_last);
        while cut > lead && messages[cut].role == Role::Tool {
            cut -= 1;
        }
        (cut > lead + 1).then_some((lead, cut))
    }

    async fn compress(&self, ctx: &RunContext, messages: &mut History) -> Result<(), BoxError> {
        let Some((lead, cut)) = self.plan(messages) else {
            return Ok(());
        };
        if !crate::hooks::before_compaction(ctx, messages).await? {
            return Ok(());
        }
        let (kept_system, older): (Vec<Message>, Vec<Message>) = messages
            .iter()
            .skip(lead)
            .take(cut - lead)
            .cloned()
            .partition(|m| m.role == Role::System && !is_summary(m));
        let summary = self.summarizer.summarize(ctx, &older).await?;
        let before = messages.len();
        let mut compressed = Vec::with_capacity(lead + kept_system.len() + 1 + before - cut);
        compressed.extend(messages.iter().take(lead).cloned());
        compressed.extend(kept_system);
        compressed.push(Message::system(format!("{SUMMARY_HEADER}\n{summary}")));
        compressed.extend(messages.iter().skip(cut).cloned());
        *messages = History::from(compressed);
        let record = SummaryRecord {
            run_id: ctx.run_id().clone(),
            iteration: ctx.iteration(),
            messages_before: before,
            messages_after: messages.len(),
            summary: summary.clone(),
        };
        ctx.log_event(
            "compressed",
            json!({"messages_before": before, "messages_after": messages.len()}),
        );
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(record);
        let compaction = Compaction {
            by: Middleware::name(self).to_owned(),
            messages_before: before,
            messages_after: messages.len(),
            summary: Some(summary),
        };
        crate::hooks::after_compaction(ctx, &compaction).await?;
        Ok(())
    }
}

impl fmt::Debug for ContextCompressionMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContextCompressionMiddleware")
            .field("policy", &self.policy)
            .field("records", &self.records().len())
            .finish_non_exhaustive()
    }
}

impl Middleware for ContextCompressionMiddleware {
    fn name(&self) -> &str {
        "context-compression"
    }

    fn before_model<'a>(&'a self, ctx: &'a RunContext, messages: &'a mut History) -> Hook<'a, ()> {
        if messages.text_len() <= self.policy.trigger_text_len {
            return Hook::ok(());
        }
        Hook::new(self.compress(ctx, messages))
    }
}
