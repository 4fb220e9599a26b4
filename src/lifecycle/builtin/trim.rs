//! [`MessageTrimMiddleware`]: keeps the conversation within a window.

use futures::future::BoxFuture;

use crate::context::RunContext;
use crate::error::BoxError;
use crate::lifecycle::{Hook, Middleware, ModelMiddleware, ModelNext};
use crate::request::ModelCall;
use crate::types::{History, Message, ModelResponse, Role};

/// How [`trim_messages`] trims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrimStrategy {
    /// The leading system messages and the last `n` messages.
    LastMessages(usize),
    /// The leading system messages and as many of the latest messages as
    /// fit in this many bytes of text ([`Message::text_len`]).
    MaxTextLen(usize),
}

/// Trims `messages` under `strategy`: `None` when nothing needs to go.
///
/// The leading system messages stay, and the last message always does. The
/// kept window never starts with a tool result: it is widened back to the assistant turn that made the
/// calls, so every tool call keeps its result and every result its call.
///
/// ```
/// use tower_agent::lifecycle::builtin::{trim_messages, TrimStrategy};
/// use tower_agent::types::{Message, ToolCall};
///
/// let messages = vec![
///     Message::system("Be brief."),
///     Message::user("one"),
///     Message::assistant_tool_calls(vec![ToolCall::new("c1", "lookup", "{}")]),
///     Message::tool("c1", "found"),
///     Message::assistant("two"),
/// ];
/// let kept = trim_messages(&messages, TrimStrategy::LastMessages(2)).unwrap();
/// // The last two would start at the tool result: its call is kept too.
/// assert_eq!(kept.len(), 4);
/// assert_eq!(kept[1].tool_calls[0].id, "c1");
/// assert!(trim_messages(&messages, TrimStrategy::LastMessages(10)).is_none());
/// ```
pub fn trim_messages(messages: &[Message], strategy: TrimStrategy) -> Option<Vec<Message>> {
    let lead = messages
        .iter()
        .take_while(|m| m.role == Role::System)
        .count();
    let mut start = match strategy {
        TrimStrategy::LastMessages(n) => messages.len().saturating_sub(n).max(lead),
        TrimStrategy::MaxTextLen(budget) => {
            let mut used = 0;
            let mut start = messages.len();
            while start > lead && used + messages[start - 1].text_len() <= budget {
                start -= 1;
                used += messages[start].text_len();
            }
            start
        }
    };
    // The last message always stays: it is what the model answers.
    start = start.min(messages.len().saturating_sub(1)).max(lead);
    while start > lead && messages[start].role == Role::Tool {
        start -= 1;
    }
    if start == lead {
        return None;
    }
    let mut kept = Vec::with_capacity(lead + messages.len() - start);
    kept.extend_from_slice(&messages[..lead]);
    kept.extend_from_slice(&messages[start..]);
    Some(kept)
}

/// Keeps the conversation within a [`TrimStrategy`] window.
///
/// Two placements, one type:
/// - [`push`](crate::lifecycle::MiddlewareStack::push) it: in `before_model`
///   it trims the run's conversation, which goes on from the trimmed one
///   (the transcript too);
/// - [`push_model`](crate::lifecycle::MiddlewareStack::push_model) it: it
///   trims each model request only, and the run keeps every message.
///
/// ```
/// use tower_agent::lifecycle::builtin::{MessageTrimMiddleware, TrimStrategy};
/// use tower_agent::lifecycle::MiddlewareStack;
///
/// let per_request = MiddlewareStack::new()
///     .push_model(MessageTrimMiddleware::new(TrimStrategy::LastMessages(20)));
/// # let _ = per_request;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct MessageTrimMiddleware {
    strategy: TrimStrategy,
}

impl MessageTrimMiddleware {
    /// Trims under `strategy`.
    pub fn new(strategy: TrimStrategy) -> Self {
        Self { strategy }
    }
}

impl Middleware for MessageTrimMiddleware {
    fn name(&self) -> &str {
        "message-trim"
    }

    fn before_model<'a>(&'a self, _: &'a RunContext, messages: &'a mut History) -> Hook<'a, ()> {
        if let Some(kept) = trim_messages(&messages.to_contiguous(), self.strategy) {
            *messages = History::from(kept);
        }
        Hook::ok(())
    }
}

impl ModelMiddleware for MessageTrimMiddleware {
    fn name(&self) -> &str {
        "message-trim"
    }

    fn wrap_model<'a>(
        &'a self,
        mut call: ModelCall,
        next: ModelNext,
    ) -> BoxFuture<'a, Result<ModelResponse, BoxError>> {
        if let Some(kept) = trim_messages(&call.request.messages.to_contiguous(), self.strategy) {
            call.request.messages = History::from(kept);
        }
        Box::pin(next.run(call))
    }
}
