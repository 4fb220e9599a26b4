//! Copying a response into the memory of one it replaces: an insert into a
//! full store overwrites the evicted response's text in place, so a miss
//! costs no allocation and no free for the text.

use crate::types::{Message, MessageContent, ModelResponse};

/// What an insert stores: a borrowed response is copied, an owned one moved.
pub(crate) trait Fill {
    /// The response, in memory of its own.
    fn make(self) -> ModelResponse;

    /// The response, in `old`'s memory where it fits.
    fn fill(self, old: &mut ModelResponse);
}

impl Fill for &ModelResponse {
    #[inline]
    fn make(self) -> ModelResponse {
        self.clone()
    }

    #[inline]
    fn fill(self, old: &mut ModelResponse) {
        copy_response(old, self);
    }
}

impl Fill for ModelResponse {
    #[inline]
    fn make(self) -> ModelResponse {
        self
    }

    #[inline]
    fn fill(self, old: &mut ModelResponse) {
        *old = self;
    }
}

/// `*to = from.clone()`, reusing `to`'s text buffers. Every field is named,
/// so a field added to the response cannot be left out unnoticed.
fn copy_response(to: &mut ModelResponse, from: &ModelResponse) {
    let ModelResponse {
        message,
        usage,
        finish_reason,
        model,
        usage_recorded,
    } = from;
    copy_message(&mut to.message, message);
    to.usage = *usage;
    // Equal values are kept as they are: no name's reference count moves.
    if to.finish_reason != *finish_reason {
        to.finish_reason.clone_from(finish_reason);
    }
    if to.model != *model {
        to.model.clone_from(model);
    }
    to.usage_recorded = *usage_recorded;
}

fn copy_message(to: &mut Message, from: &Message) {
    let Message {
        role,
        content,
        tool_calls,
        tool_call_id,
        name,
        untrusted,
    } = from;
    to.role = *role;
    match (&mut to.content, content) {
        (Some(MessageContent::Text(to)), Some(MessageContent::Text(from))) => copy_str(to, from),
        (to, from) => *to = from.clone(),
    }
    if tool_calls.is_empty() {
        // Most answers call no tool: nothing to copy, nothing to keep.
        if !to.tool_calls.is_empty() {
            to.tool_calls = Vec::new();
        }
    } else {
        to.tool_calls.clone_from(tool_calls);
    }
    copy_option(&mut to.tool_call_id, tool_call_id);
    copy_option(&mut to.name, name);
    to.untrusted = *untrusted;
}

#[inline]
fn copy_option(to: &mut Option<String>, from: &Option<String>) {
    match (to, from) {
        (None, None) => {}
        (Some(to), Some(from)) => copy_str(to, from),
        (to, from) => *to = from.clone(),
    }
}

/// Copies `from` into `to`'s buffer when it fits and is not much bigger (a
/// slot that once held a long answer does not keep its memory for short
/// ones); into a fresh one otherwise.
#[inline]
fn copy_str(to: &mut String, from: &str) {
    if (from.len()..=2 * from.len() + 64).contains(&to.capacity()) {
        to.clear();
        to.push_str(from);
    } else {
        *to = from.to_owned();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{FinishReason, ToolCall, Usage};

    #[test]
    fn a_copy_equals_the_clone_whatever_it_overwrites() {
        let mut with_all = ModelResponse::new(
            "model-a",
            Message::assistant_tool_calls(vec![ToolCall::new("c1", "search", "{}")]),
        );
        with_all
            .message
            .set_text("a longer answer than the other one");
        with_all.message.tool_call_id = Some("id".into());
        with_all.message.name = Some("bot".into());
        with_all.message.untrusted = true;
        with_all.usage = Usage {
            input_tokens: 3,
            output_tokens: 4,
            ..Usage::default()
        };
        with_all.finish_reason = FinishReason::Other("odd".into());
        with_all.usage_recorded = true;
        let short = ModelResponse::new("m", Message::assistant("ok"));
        let long = ModelResponse::new("m", Message::assistant("x".repeat(1000)));
        let none = ModelResponse::new("m", Message::assistant_tool_calls(vec![]));
        let all = [with_all, short, long, none];
        for from in &all {
            for old in &all {
                let mut to = old.clone();
                copy_response(&mut to, from);
                assert_eq!(&to, from);
            }
        }
    }

    #[test]
    fn a_much_bigger_buffer_is_not_kept() {
        let mut to = "x".repeat(1000);
        copy_str(&mut to, "short");
        assert_eq!(to, "short");
        assert!(to.capacity() < 1000);
        let mut to = String::with_capacity(40);
        let buffer = to.as_ptr();
        copy_str(&mut to, "fits");
        assert_eq!((to.as_str(), to.as_ptr()), ("fits", buffer));
    }
}
