//! The chat-completions JSON: the request body, the response, the usage.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::service::http::{response, tokens};
use crate::types::{
    FinishReason, History, ModelRequest, ModelResponse, ResponseFormat, ToolCall, ToolChoice,
    ToolSpec, Usage,
};

/// Which field carries `max_tokens`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum MaxTokensField {
    /// `max_tokens`: what every compatible server reads.
    #[default]
    MaxTokens,
    /// `max_completion_tokens`: what OpenAI's reasoning models require.
    MaxCompletionTokens,
}

/// The request body, borrowing from the [`ModelRequest`].
#[derive(Debug, Serialize)]
pub(crate) struct ChatRequest<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    model: &'a str,
    messages: &'a History,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<&'a ResponseFormat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    /// Groups requests that share a prefix onto the same cache (OpenAI's
    /// `prompt_cache_key`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) prompt_cache_key: Option<&'a str>,
}

#[derive(Debug, Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Debug, Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunctionSpec<'a>,
}

#[derive(Debug, Serialize)]
struct WireFunctionSpec<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    parameters: &'a Value,
}

impl<'a> ChatRequest<'a> {
    /// The body for `request`, naming `model`; streamed when `stream`.
    pub(crate) fn new(
        request: &'a ModelRequest,
        model: &'a str,
        stream: bool,
        include_usage: bool,
        max_tokens_field: MaxTokensField,
    ) -> Self {
        let settings = &request.settings;
        let tools: Vec<WireTool<'a>> = request.tools.iter().map(WireTool::from).collect();
        let (max_tokens, max_completion_tokens) = match max_tokens_field {
            MaxTokensField::MaxTokens => (settings.max_tokens, None),
            MaxTokensField::MaxCompletionTokens => (None, settings.max_tokens),
        };
        Self {
            model,
            messages: &request.messages,
            // OpenAI refuses `parallel_tool_calls` without tools.
            parallel_tool_calls: settings.parallel_tool_calls.filter(|_| !tools.is_empty()),
            // Nor `tool_choice`.
            tool_choice: settings
                .tool_choice
                .as_ref()
                .filter(|_| !tools.is_empty())
                .map(wire_tool_choice),
            tools,
            temperature: settings.temperature,
            max_tokens,
            max_completion_tokens,
            stop: &settings.stop,
            response_format: settings.response_format.as_ref(),
            stream,
            stream_options: (stream && include_usage).then_some(StreamOptions {
                include_usage: true,
            }),
            prompt_cache_key: None,
        }
    }
}

/// OpenAI's `tool_choice`: a mode, or the function the model must call.
fn wire_tool_choice(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => Value::from("auto"),
        ToolChoice::None => Value::from("none"),
        ToolChoice::Required => Value::from("required"),
        ToolChoice::Tool(name) => {
            serde_json::json!({"type": "function", "function": {"name": name}})
        }
    }
}

impl<'a> From<&'a ToolSpec> for WireTool<'a> {
    fn from(spec: &'a ToolSpec) -> Self {
        WireTool {
            kind: "function",
            function: WireFunctionSpec {
                name: &spec.name,
                description: &spec.description,
                parameters: &spec.parameters,
            },
        }
    }
}

/// The usage object of a response or of the last stream chunk.
#[derive(Debug, Default, Clone, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Debug, Default, Clone, Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Debug, Default, Clone, Deserialize)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl From<&WireUsage> for Usage {
    fn from(wire: &WireUsage) -> Self {
        Usage {
            input_tokens: tokens(wire.prompt_tokens),
            output_tokens: tokens(wire.completion_tokens),
            cached_input_tokens: tokens(
                wire.prompt_tokens_details
                    .as_ref()
                    .and_then(|d| d.cached_tokens),
            ),
            reasoning_tokens: tokens(
                wire.completion_tokens_details
                    .as_ref()
                    .and_then(|d| d.reasoning_tokens),
            ),
        }
    }
}

/// A non-streamed response.
#[derive(Debug, Deserialize)]
pub(crate) struct ChatCompletion {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    message: Option<ChoiceMessage>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct ChoiceMessage {
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Debug, Deserialize)]
struct WireToolCall {
    #[serde(default)]
    id: Option<String>,
    function: WireFunctionCall,
}

#[derive(Debug, Deserialize)]
struct WireFunctionCall {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
}

/// The arguments as JSON text: a string as it is, anything else serialized
/// (some servers send an object), nothing as `""`.
pub(crate) fn arguments_text(arguments: Option<&Value>) -> String {
    match arguments {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

/// The text of a `content`: a string, or the text parts of an array.
fn content_text(content: Option<&Value>) -> Option<String> {
    match content? {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => {
            let text: String = parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            Some(text)
        }
        _ => None,
    }
}

/// Maps a finish reason's wire name.
pub(crate) fn finish_reason(reason: Option<&str>, has_tool_calls: bool) -> FinishReason {
    match reason {
        Some("stop") => FinishReason::Stop,
        Some("length") => FinishReason::Length,
        Some("tool_calls" | "function_call") => FinishReason::ToolCalls,
        Some("content_filter") => FinishReason::ContentFilter,
        Some(other) => FinishReason::Other(other.to_owned()),
        None if has_tool_calls => FinishReason::ToolCalls,
        None => FinishReason::Stop,
    }
}

impl ChatCompletion {
    /// The response, reported as from `model` when the body names none.
    /// `Err` carries what is wrong with the body.
    pub(crate) fn into_response(self, model: &str) -> Result<ModelResponse, String> {
        let choice = self
            .choices
            .and_then(|c| c.into_iter().next())
            .ok_or("the response has no choices")?;
        let message = choice.message.unwrap_or_default();
        let mut tool_calls = Vec::new();
        for call in message.tool_calls.unwrap_or_default() {
            if call.function.name.is_empty() {
                return Err("a tool call has no name".into());
            }
            tool_calls.push(ToolCall {
                id: call.id.unwrap_or_default(),
                name: call.function.name,
                arguments: arguments_text(call.function.arguments.as_ref()),
            });
        }
        let text = content_text(message.content.as_ref())
            .or(message.refusal)
            .unwrap_or_default();
        let finish = finish_reason(choice.finish_reason.as_deref(), !tool_calls.is_empty());
        let usage = self.usage.as_ref().map(Usage::from).unwrap_or_default();
        Ok(response(self.model, model, text, tool_calls, finish, usage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::http::MAX_TOKENS;
    use crate::types::{Message, ModelSettings, Role};
    use serde_json::json;

    fn request() -> ModelRequest {
        let mut request = ModelRequest::new(
            "gpt-test",
            vec![
                Message::system("be brief"),
                Message::user("weather in Paris?"),
                Message::assistant_tool_calls(vec![ToolCall::new(
                    "call_1",
                    "weather",
                    r#"{"city":"Paris"}"#,
                )]),
                Message::tool("call_1", "18C"),
            ],
        );
        request.tools = vec![ToolSpec::new(
            "weather",
            "The weather",
            json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        )]
        .into();
        request.settings = ModelSettings {
            temperature: Some(0.5),
            max_tokens: Some(64),
            stop: vec!["END".into()],
            response_format: Some(ResponseFormat::json_schema(
                "answer",
                json!({"type": "object"}),
            )),
            parallel_tool_calls: Some(false),
            tool_choice: Some(ToolChoice::tool("weather")),
        }
        .into();
        request
    }

    #[test]
    fn writes_the_chat_completions_body() {
        let request = request();
        let body = ChatRequest::new(&request, "gpt-test", true, true, MaxTokensField::MaxTokens);
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            json!({
                "model": "gpt-test",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "weather in Paris?"},
                    {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                    {"role": "tool", "content": "18C", "tool_call_id": "call_1"}
                ],
                "tools": [{"type": "function", "function": {"name": "weather", "description": "The weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
                "temperature": 0.5,
                "max_tokens": 64,
                "stop": ["END"],
                "response_format": {"type": "json_schema", "json_schema": {"name": "answer",
                    "schema": {"type": "object"}, "strict": true}},
                "parallel_tool_calls": false,
                "tool_choice": {"type": "function", "function": {"name": "weather"}},
                "stream": true,
                "stream_options": {"include_usage": true}
            })
        );
    }

    #[test]
    fn writes_each_tool_choice() {
        let mut request = request();
        for (choice, wire) in [
            (ToolChoice::Auto, json!("auto")),
            (ToolChoice::None, json!("none")),
            (ToolChoice::Required, json!("required")),
        ] {
            request.settings_mut().tool_choice = Some(choice);
            let body = ChatRequest::new(&request, "m", false, true, MaxTokensField::MaxTokens);
            assert_eq!(serde_json::to_value(&body).unwrap()["tool_choice"], wire);
        }
    }

    #[test]
    fn leaves_out_what_is_not_set() {
        let mut request = ModelRequest::new("", vec![Message::user("hi")]);
        request.settings_mut().parallel_tool_calls = Some(true);
        request.settings_mut().tool_choice = Some(ToolChoice::Required);
        request.settings_mut().max_tokens = Some(10);
        let body = ChatRequest::new(
            &request,
            "",
            false,
            true,
            MaxTokensField::MaxCompletionTokens,
        );
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10})
        );
    }

    #[test]
    fn reads_a_completion_with_tool_calls_and_usage() {
        let body = json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "gpt-test-2024",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null,
                "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "weather", "arguments": {"city": "Rome"}}}
                ]}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120,
                "prompt_tokens_details": {"cached_tokens": 64},
                "completion_tokens_details": {"reasoning_tokens": 8}}
        });
        let completion: ChatCompletion = serde_json::from_value(body).unwrap();
        let response = completion.into_response("gpt-test").unwrap();
        assert_eq!(response.model, "gpt-test-2024");
        assert_eq!(response.finish_reason, FinishReason::ToolCalls);
        assert_eq!(response.message.role, Role::Assistant);
        assert_eq!(response.message.content, None);
        assert_eq!(
            response.message.tool_calls,
            vec![
                ToolCall::new("call_a", "weather", r#"{"city":"Paris"}"#),
                ToolCall::new("call_b", "weather", r#"{"city":"Rome"}"#),
            ]
        );
        assert_eq!(
            response.usage,
            Usage {
                input_tokens: 100,
                output_tokens: 20,
                cached_input_tokens: 64,
                reasoning_tokens: 8
            }
        );
        assert!(!response.usage_recorded);
    }

    #[test]
    fn reads_text_refusals_and_odd_but_valid_shapes() {
        let read = |v: Value| {
            serde_json::from_value::<ChatCompletion>(v)
                .unwrap()
                .into_response("fallback")
        };
        let r = read(
            json!({"choices": [{"message": {"content": "hi"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": null}}),
        )
        .unwrap();
        assert_eq!(r.message.text(), "hi");
        assert_eq!(r.model, "fallback");
        assert_eq!(r.finish_reason, FinishReason::Length);
        assert_eq!(r.usage, Usage::new(3, 1));

        let r = read(json!({"choices": [{"message": {"content": null, "refusal": "I can't"}, "finish_reason": "stop"}]})).unwrap();
        assert_eq!(r.message.text(), "I can't");

        let r = read(json!({"choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}]})).unwrap();
        assert_eq!(r.message.text(), "ab");
        assert_eq!(r.finish_reason, FinishReason::Stop);

        let r = read(json!({"choices": [{"message": {"content": "x"}, "finish_reason": "eos"}]}))
            .unwrap();
        assert_eq!(r.finish_reason, FinishReason::Other("eos".into()));

        let negative = json!({"choices": [{"message": {"content": "x"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": -1}});
        assert!(serde_json::from_value::<ChatCompletion>(negative).is_err());
        let r = read(json!({"choices": [{"message": {"content": "x"}}],
            "usage": {"prompt_tokens": u64::MAX, "completion_tokens": 2}}))
        .unwrap();
        assert_eq!(r.usage, Usage::new(MAX_TOKENS, 2));

        assert!(read(json!({"choices": []})).is_err());
        assert!(read(json!({"object": "chat.completion"})).is_err());
        assert!(read(
            json!({"choices": [{"message": {"tool_calls": [{"function": {"name": ""}}]}}]})
        )
        .is_err());
    }
}
