//! What both wire formats build their answers from: token counts and the
//! response itself.

use crate::types::{FinishReason, Message, ModelName, ModelResponse, ToolCall, Usage};

/// The most tokens one count may claim: larger is no token count, and is
/// clamped so that summing a run's usage cannot overflow.
pub(crate) const MAX_TOKENS: u64 = 1 << 40;

/// A token count from the wire: absent is zero, absurd is clamped.
pub(crate) fn tokens(count: Option<u64>) -> u64 {
    count.unwrap_or(0).min(MAX_TOKENS)
}

/// The assistant message of text (possibly empty) and tool calls.
pub(crate) fn assistant(text: String, tool_calls: Vec<ToolCall>) -> Message {
    let mut message = Message::assistant_tool_calls(tool_calls);
    if !text.is_empty() || message.tool_calls.is_empty() {
        message.set_text(text);
    }
    message
}

/// The answer: from the model the body names (`answered`), else the one
/// asked for.
pub(crate) fn response(
    answered: Option<String>,
    asked: &str,
    text: String,
    tool_calls: Vec<ToolCall>,
    finish_reason: FinishReason,
    usage: Usage,
) -> ModelResponse {
    let model = match answered {
        Some(model) if !model.is_empty() => ModelName::from(model),
        _ => ModelName::from(asked),
    };
    let mut response = ModelResponse::new(model, assistant(text, tool_calls));
    response.finish_reason = finish_reason;
    response.usage = usage;
    response
}
