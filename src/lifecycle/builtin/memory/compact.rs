//! Compaction of a saved thread after a run ([`ThreadCompaction`]).

use std::fmt;
use std::sync::Arc;

use crate::context::RunContext;
use crate::error::BoxError;
use crate::lifecycle::builtin::{ConcatSummarizer, Summarizer};
use crate::types::{History, Message, Role};

/// The header of a summary message: the same the context compression
/// writes, so either recognises the other's summary and condenses it again.
pub(crate) const SUMMARY_HEADER: &str = "Summary of the earlier conversation:";

fn is_summary(message: &Message) -> bool {
    message.role == Role::System && message.text().starts_with(SUMMARY_HEADER)
}

/// When and how [`MemoryMiddleware`](super::MemoryMiddleware) compacts a
/// thread once a run completed: past [`max_messages`](Self::max_messages),
/// the messages between the leading system messages and the last
/// [`keep_last`](Self::keep_last) are condensed by a [`Summarizer`] into one
/// system message. System messages and the recent window stay verbatim, a
/// tool call is never split from its result.
///
/// ```
/// use tower_agent::lifecycle::builtin::{ConcatSummarizer, ThreadCompaction};
///
/// let compaction = ThreadCompaction::new(ConcatSummarizer::new(120)).max_messages(60).keep_last(12);
/// # let _ = compaction;
/// ```
///
/// # Clone
///
/// Clones share the summarizer.
#[derive(Clone)]
pub struct ThreadCompaction {
    pub(super) summarizer: Arc<dyn Summarizer>,
    pub(super) max_messages: usize,
    pub(super) keep_last: usize,
}

impl fmt::Debug for ThreadCompaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadCompaction")
            .field("max_messages", &self.max_messages)
            .field("keep_last", &self.keep_last)
            .finish_non_exhaustive()
    }
}

impl Default for ThreadCompaction {
    /// The [`ConcatSummarizer`], past 40 messages, keeping the last 10.
    fn default() -> Self {
        Self::new(ConcatSummarizer::default())
    }
}

impl ThreadCompaction {
    /// Compacts with `summarizer` past 40 messages, keeping the last 10.
    pub fn new(summarizer: impl Summarizer) -> Self {
        Self {
            summarizer: Arc::new(summarizer),
            max_messages: 40,
            keep_last: 10,
        }
    }

    /// Compacts a thread longer than this many messages.
    pub fn max_messages(mut self, max_messages: usize) -> Self {
        self.max_messages = max_messages;
        self
    }

    /// How many of the latest messages stay verbatim.
    pub fn keep_last(mut self, keep_last: usize) -> Self {
        self.keep_last = keep_last;
        self
    }

    /// Where the older part starts and ends, if the thread is long enough
    /// and there is something to condense: after the leading system
    /// messages, up to a window start that is not a tool result.
    pub(super) fn plan(&self, messages: &History) -> Option<(usize, usize)> {
        if messages.len() <= self.max_messages {
            return None;
        }
        let lead = messages
            .iter()
            .take_while(|m| m.role == Role::System && !is_summary(m))
            .count();
        let mut cut = messages.len().saturating_sub(self.keep_last);
        while cut > lead && messages[cut].role == Role::Tool {
            cut -= 1;
        }
        (cut > lead + 1).then_some((lead, cut))
    }

    /// The compacted thread and the summary: the leading system messages,
    /// the system messages of the older part, the summary, the window.
    pub(super) async fn compact(
        &self,
        ctx: &RunContext,
        messages: &History,
        (lead, cut): (usize, usize),
    ) -> Result<(History, String), BoxError> {
        let (kept_system, older): (Vec<Message>, Vec<Message>) = messages
            .iter()
            .skip(lead)
            .take(cut - lead)
            .cloned()
            .partition(|m| m.role == Role::System && !is_summary(m));
        let summary = self.summarizer.summarize(ctx, &older).await?;
        let mut compacted = Vec::with_capacity(lead + kept_system.len() + 1 + messages.len() - cut);
        compacted.extend(messages.iter().take(lead).cloned());
        compacted.extend(kept_system);
        compacted.push(Message::system(format!("{SUMMARY_HEADER}\n{summary}")));
        compacted.extend(messages.iter().skip(cut).cloned());
        let compacted = History::from(compacted);
        compacted.check_integrity().map_err(|problem| {
            format!("the compacted thread would break a tool call's pairing: {problem}")
        })?;
        Ok((compacted, summary))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ToolCall;

    fn thread() -> History {
        let mut messages = vec![Message::system("prompt"), Message::user("u0")];
        for i in 0..5 {
            let id = format!("c{i}");
            messages.push(Message::assistant_tool_calls(vec![ToolCall::new(
                &id, "t", "{}",
            )]));
            messages.push(Message::tool(&id, format!("r{i}")));
        }
        messages.push(Message::assistant("done"));
        History::from(messages)
    }

    #[test]
    fn plans_only_past_the_limit_and_never_starts_the_window_on_a_tool_result() {
        let messages = thread(); // 13 messages
        assert_eq!(ThreadCompaction::default().plan(&messages), None);
        let compaction = ThreadCompaction::default().max_messages(8).keep_last(2);
        // The window would start at index 11 (a tool result): it moves to its call.
        assert_eq!(compaction.plan(&messages), Some((1, 10)));
        assert_eq!(
            ThreadCompaction::default()
                .max_messages(1)
                .keep_last(12)
                .plan(&messages),
            None,
            "nothing left to condense"
        );
    }

    #[tokio::test]
    async fn keeps_system_messages_and_the_window_and_pairs_stay_whole() {
        let mut messages = thread().to_vec();
        messages.insert(3, Message::system("note kept verbatim"));
        let messages = History::from(messages);
        let compaction = ThreadCompaction::default().max_messages(8).keep_last(3);
        let plan = compaction.plan(&messages).unwrap();
        let (compacted, summary) = compaction
            .compact(&RunContext::new(), &messages, plan)
            .await
            .unwrap();
        assert_eq!(compacted[0].text(), "prompt");
        assert_eq!(compacted[1].text(), "note kept verbatim");
        assert!(compacted[2].text().starts_with(SUMMARY_HEADER));
        assert!(summary.contains("user: u0"));
        assert_eq!(compacted.last().unwrap().text(), "done");
        compacted.check_integrity().unwrap();
        assert!(compacted.len() < messages.len());
    }
}
