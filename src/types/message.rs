use std::borrow::Cow;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions from the developer.
    System,
    /// The user's turn.
    User,
    /// The model's turn: text, tool calls or both.
    Assistant,
    /// The result of one tool call, answering `tool_call_id`.
    Tool,
}

impl Role {
    /// The wire name: `system`, `user`, `assistant` or `tool`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One message of a conversation, in the OpenAI chat-completions shape.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Text, or content parts; `None` for an assistant turn that only calls tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    /// The tool calls of an assistant turn, in the order the model made them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a tool message, the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An optional participant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Marked by a middleware as coming from an untrusted source (a
    /// retrieved document, an e-mail): a guard that scans untrusted messages
    /// reads it (the injection guard's `untrusted_messages`). Kept in the
    /// process only: never sent to a provider, nor serialized.
    #[serde(skip)]
    pub untrusted: bool,
}

/// Field by field, as derived, but an empty tool-call list (most messages
/// have none) is made without going through `Vec::clone`.
impl Clone for Message {
    #[inline]
    fn clone(&self) -> Self {
        let Message {
            role,
            content,
            tool_calls,
            tool_call_id,
            name,
            untrusted,
        } = self;
        Self {
            role: *role,
            content: content.clone(),
            tool_calls: if tool_calls.is_empty() {
                Vec::new()
            } else {
                tool_calls.clone()
            },
            tool_call_id: tool_call_id.clone(),
            name: name.clone(),
            untrusted: *untrusted,
        }
    }
}

impl Message {
    fn with_text(role: Role, text: impl Into<String>) -> Self {
        Self {
            role,
            content: Some(MessageContent::Text(text.into())),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            untrusted: false,
        }
    }

    /// A system message.
    pub fn system(text: impl Into<String>) -> Self {
        Self::with_text(Role::System, text)
    }

    /// A user message.
    pub fn user(text: impl Into<String>) -> Self {
        Self::with_text(Role::User, text)
    }

    /// An assistant message with text only.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::with_text(Role::Assistant, text)
    }

    /// An assistant message that calls tools and says nothing.
    pub fn assistant_tool_calls(tool_calls: Vec<ToolCall>) -> Self {
        Self {
            role: Role::Assistant,
            content: None,
            tool_calls,
            tool_call_id: None,
            name: None,
            untrusted: false,
        }
    }

    /// A tool result answering the call `tool_call_id`.
    pub fn tool(tool_call_id: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            tool_call_id: Some(tool_call_id.into()),
            ..Self::with_text(Role::Tool, text)
        }
    }

    /// The message's text: the text content, or its text parts joined.
    /// Empty when it has none.
    pub fn text(&self) -> Cow<'_, str> {
        match &self.content {
            None => Cow::Borrowed(""),
            Some(MessageContent::Text(text)) => Cow::Borrowed(text),
            Some(MessageContent::Parts(parts)) => {
                let mut texts = parts.iter().filter_map(ContentPart::as_text);
                match (texts.next(), texts.next()) {
                    (None, _) => Cow::Borrowed(""),
                    (Some(only), None) => Cow::Borrowed(only),
                    (Some(first), Some(second)) => {
                        let mut joined = format!("{first}{second}");
                        texts.for_each(|t| joined.push_str(t));
                        Cow::Owned(joined)
                    }
                }
            }
        }
    }

    /// This message, marked as coming from an untrusted source: see
    /// [`untrusted`](Self::untrusted).
    ///
    /// ```
    /// use tower_agent::Message;
    ///
    /// let page = Message::user("<retrieved page>").mark_untrusted();
    /// assert!(page.untrusted && !Message::user("hi").untrusted);
    /// ```
    pub fn mark_untrusted(mut self) -> Self {
        self.untrusted = true;
        self
    }

    /// Replaces the content with plain text.
    pub fn set_text(&mut self, text: impl Into<String>) {
        self.content = Some(MessageContent::Text(text.into()));
    }

    /// The number of bytes of text, tool names and arguments: a cheap size
    /// measure that token estimates are derived from.
    pub fn text_len(&self) -> usize {
        let content = match &self.content {
            None => 0,
            Some(MessageContent::Text(text)) => text.len(),
            Some(MessageContent::Parts(parts)) => parts
                .iter()
                .map(|p| match p {
                    ContentPart::Text { text } => text.len(),
                    ContentPart::ImageUrl { image_url } => image_url.url.len().min(1024),
                })
                .sum(),
        };
        content
            + self
                .tool_calls
                .iter()
                .map(|c| c.name.len() + c.arguments.len() + c.id.len())
                .sum::<usize>()
    }
}

/// The content of a message: a string, or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Text and image parts.
    Parts(Vec<ContentPart>),
}

impl From<String> for MessageContent {
    fn from(text: String) -> Self {
        MessageContent::Text(text)
    }
}

impl From<&str> for MessageContent {
    fn from(text: &str) -> Self {
        MessageContent::Text(text.to_owned())
    }
}

/// One part of a multi-part message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// A text part.
    Text {
        /// The text.
        text: String,
    },
    /// An image, by URL or `data:` URI.
    ImageUrl {
        /// Where the image is.
        image_url: ImageUrl,
    },
}

impl ContentPart {
    /// The text of a text part.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            ContentPart::Text { text } => Some(text),
            ContentPart::ImageUrl { .. } => None,
        }
    }
}

/// An image reference of a [`ContentPart::ImageUrl`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageUrl {
    /// An `https:` or `data:` URL.
    pub url: String,
    /// `low`, `high` or `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A tool call as the model made it.
///
/// `arguments` is the raw JSON text the model wrote: it may be invalid, and the
/// run reports that to the model rather than failing. On the wire it is
/// `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ToolCall {
    /// The provider's id for the call; the tool message answers it.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// A call of tool `name` with `arguments` (JSON text).
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }
}

#[derive(Serialize, Deserialize)]
struct WireFunction<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    arguments: Cow<'a, str>,
}

#[derive(Serialize, Deserialize)]
struct WireToolCall<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(rename = "type", default = "function_type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    function: WireFunction<'a>,
}

fn function_type() -> Cow<'static, str> {
    Cow::Borrowed("function")
}

impl Serialize for ToolCall {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        WireToolCall {
            id: Cow::Borrowed(&self.id),
            kind: Cow::Borrowed("function"),
            function: WireFunction {
                name: Cow::Borrowed(&self.name),
                arguments: Cow::Borrowed(&self.arguments),
            },
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ToolCall {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireToolCall::deserialize(deserializer)?;
        Ok(ToolCall {
            id: wire.id.into_owned(),
            name: wire.function.name.into_owned(),
            arguments: wire.function.arguments.into_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_call_uses_the_wire_shape() {
        let message = Message::assistant_tool_calls(vec![ToolCall::new("c1", "f", "{\"a\":1}")]);
        let value = serde_json::to_value(&message).unwrap();
        assert_eq!(
            value,
            json!({"role": "assistant", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}
            ]})
        );
    }

    #[test]
    fn reads_content_parts_and_null_content() {
        let message: Message = serde_json::from_value(json!({
            "role": "user",
            "content": [
                {"type": "text", "text": "look "},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                {"type": "text", "text": "here"}
            ]
        }))
        .unwrap();
        assert_eq!(message.text(), "look here");
        let message: Message =
            serde_json::from_value(json!({"role": "assistant", "content": null})).unwrap();
        assert_eq!(message.content, None);
        assert_eq!(message.text(), "");
    }
}
