use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{History, Message, ModelName, Usage};

/// A tool as the model sees it: a name, a description and a JSON Schema of
/// its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments (an object schema).
    pub parameters: Value,
}

impl ToolSpec {
    /// A tool spec.
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            parameters,
        }
    }
}

/// How the model must shape its answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    /// Free text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON matching a schema.
    JsonSchema {
        /// The schema and its name, boxed: every request carries its
        /// settings, and most have no schema.
        json_schema: Box<JsonSchemaFormat>,
    },
}

/// The schema of [`ResponseFormat::JsonSchema`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonSchemaFormat {
    /// A name for the schema.
    pub name: String,
    /// The JSON Schema.
    pub schema: Value,
    /// Whether the provider must follow it strictly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl ResponseFormat {
    /// A strict JSON-schema format.
    pub fn json_schema(name: impl Into<String>, schema: Value) -> Self {
        ResponseFormat::JsonSchema {
            json_schema: Box::new(JsonSchemaFormat {
                name: name.into(),
                schema,
                strict: Some(true),
            }),
        }
    }
}

/// Sampling and shape settings of a model request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelSettings {
    /// Sampling temperature. `None` leaves the provider's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// The most tokens the model may write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Stop sequences.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// The answer's shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// Whether the model may call several tools in one turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// Whether, and which, tools the model must call. `None` leaves the
    /// provider's default (`auto` when tools are offered). Sent only with
    /// tools: a request without tools carries no choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
}

/// Whether, and which, tools the model must call in a turn: what
/// [`ModelSettings::tool_choice`] sends as OpenAI's `tool_choice` and
/// Anthropic's `tool_choice`.
///
/// ```
/// use tower_agent::types::ToolChoice;
///
/// let forced: ToolChoice = serde_json::from_str(r#"{"tool": "search"}"#).unwrap();
/// assert_eq!(forced, ToolChoice::tool("search"));
/// assert_eq!(serde_json::to_string(&ToolChoice::Required).unwrap(), r#""required""#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides whether to call tools.
    Auto,
    /// The model must not call tools (it still sees them).
    None,
    /// The model must call at least one tool.
    Required,
    /// The model must call this tool.
    Tool(String),
}

impl ToolChoice {
    /// The model must call the tool `name`.
    pub fn tool(name: impl Into<String>) -> Self {
        ToolChoice::Tool(name.into())
    }

    /// The tool a [`ToolChoice::Tool`] names.
    pub fn tool_name(&self) -> Option<&str> {
        match self {
            ToolChoice::Tool(name) => Some(name),
            _ => None,
        }
    }
}

/// What one model call is asked: the model, the messages, the tools and the
/// settings.
///
/// `messages` is a [`History`]: cloning a request is O(1) whatever the length
/// of the conversation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelRequest {
    /// The model's name as the provider knows it (shared: a retry, a
    /// fallback or a cache key copies a pointer, not the name).
    pub model: ModelName,
    /// The conversation so far.
    pub messages: History,
    /// The tools the model may call.
    #[serde(default)]
    pub tools: Arc<[ToolSpec]>,
    /// Sampling and shape settings, shared like the tools: an agent's
    /// requests all point to its one copy, and a retry, a fallback or a
    /// cache key copies a pointer. To change them for one request,
    /// [`settings_mut`](Self::settings_mut) (copy on write).
    #[serde(default)]
    pub settings: Arc<ModelSettings>,
}

impl ModelRequest {
    /// A request to `model` with `messages`, no tools and default settings.
    pub fn new(model: impl Into<ModelName>, messages: impl Into<History>) -> Self {
        Self {
            model: model.into(),
            messages: messages.into(),
            tools: Arc::from([]),
            settings: Arc::default(),
        }
    }

    /// The settings of this request, to change: copied first if another
    /// request shares them.
    ///
    /// ```
    /// use tower_agent::types::{Message, ModelRequest};
    ///
    /// let mut request = ModelRequest::new("gpt-4o-mini", vec![Message::user("hi")]);
    /// let shared = request.clone();
    /// request.settings_mut().max_tokens = Some(64);
    /// assert_eq!(request.settings.max_tokens, Some(64));
    /// assert_eq!(shared.settings.max_tokens, None);
    /// ```
    pub fn settings_mut(&mut self) -> &mut ModelSettings {
        Arc::make_mut(&mut self.settings)
    }
}

/// Why the model stopped writing.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A natural end, or a stop sequence.
    Stop,
    /// `max_tokens` was reached.
    Length,
    /// The model called tools.
    ToolCalls,
    /// The provider filtered the content.
    ContentFilter,
    /// Anything else the provider said.
    #[serde(untagged)]
    Other(String),
}

/// The answer of one model call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// The assistant message: text, tool calls or both.
    pub message: Message,
    /// What the call cost.
    #[serde(default)]
    pub usage: Usage,
    /// Why the model stopped.
    pub finish_reason: FinishReason,
    /// The model that answered (after any fallback).
    pub model: ModelName,
    /// Whether `usage` was already recorded into the run's ledger.
    ///
    /// The point of the model stack that reaches the backend records usage
    /// (the providers and [`ScriptedModel`](crate::ScriptedModel) do) and sets
    /// this; a layer that answers without the backend (a cache hit) sets it
    /// too, having recorded nothing. The run records the usage of a response
    /// that arrives with it unset, so a model service of your own needs
    /// nothing special.
    #[serde(skip)]
    pub usage_recorded: bool,
}

impl ModelResponse {
    /// A response carrying `message` from `model`, with no usage.
    pub fn new(model: impl Into<ModelName>, message: Message) -> Self {
        let finish_reason = if message.tool_calls.is_empty() {
            FinishReason::Stop
        } else {
            FinishReason::ToolCalls
        };
        Self {
            message,
            usage: Usage::default(),
            finish_reason,
            model: model.into(),
            usage_recorded: false,
        }
    }

    /// Sets the usage.
    pub fn usage(mut self, usage: Usage) -> Self {
        self.usage = usage;
        self
    }
}

/// One piece of a streamed answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ModelDelta {
    /// A piece of the answer's text.
    Text {
        /// The text.
        text: String,
    },
    /// A piece of a tool call; pieces with the same `index` belong together.
    ToolCall {
        /// Which call of the turn.
        index: usize,
        /// The call id, on its first piece.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// The tool name, on its first piece.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// A piece of the arguments' JSON text.
        arguments: String,
    },
    /// A piece of visible reasoning.
    Reasoning {
        /// The text.
        text: String,
    },
    /// Not from the model: a user message queued into the running run
    /// ([`RunHandle::send`](crate::RunHandle::send)) joined the conversation.
    UserMessage {
        /// The message's text.
        text: String,
    },
}

impl ModelDelta {
    /// A text delta.
    pub fn text(text: impl Into<String>) -> Self {
        ModelDelta::Text { text: text.into() }
    }
}
