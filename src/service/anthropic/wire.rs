//! The Messages API JSON: the request body, the response, the usage.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::service::http::{response, tokens};
use crate::types::{
    ContentPart, FinishReason, MessageContent, ModelRequest, ModelResponse, ModelSettings,
    ResponseFormat, Role, ToolCall, ToolChoice, ToolSpec, Usage,
};

/// The request body.
#[derive(Debug, Serialize)]
pub(crate) struct MessagesRequest<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<System>,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop_sequences: &'a [String],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    /// The system texts in order, and how many lead (come before the first
    /// other message): what prompt caching splits `system` by.
    #[serde(skip)]
    system_parts: Vec<Cow<'a, str>>,
    #[serde(skip)]
    system_lead: usize,
}

/// `system`: one string, or text blocks when a breakpoint marks one.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum System {
    Text(String),
    Blocks(Vec<SystemBlock>),
}

#[derive(Debug, Serialize)]
struct SystemBlock {
    #[serde(rename = "type")]
    kind: &'static str,
    text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

/// A prompt-cache breakpoint: the prefix up to and including the block that
/// carries it is cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
struct CacheControl {
    #[serde(rename = "type")]
    kind: &'static str,
}

const EPHEMERAL: CacheControl = CacheControl { kind: "ephemeral" };

/// The most breakpoints the Messages API takes in one request.
pub(crate) const MAX_CACHE_BREAKPOINTS: usize = 4;

#[derive(Debug, Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: Vec<Block<'a>>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: Cow<'a, str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<CacheControl>,
    },
    Image {
        source: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<CacheControl>,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<CacheControl>,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: Cow<'a, str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<CacheControl>,
    },
}

impl Block<'_> {
    /// Puts a breakpoint on this block.
    fn mark(&mut self) {
        let (Block::Text { cache_control, .. }
        | Block::Image { cache_control, .. }
        | Block::ToolUse { cache_control, .. }
        | Block::ToolResult { cache_control, .. }) = self;
        *cache_control = Some(EPHEMERAL);
    }
}

#[derive(Debug, Serialize)]
struct WireTool<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    input_schema: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

/// An image part as an Anthropic image source: a `data:` URI as base64, any
/// other URL by reference.
fn image_source(url: &str) -> Value {
    if let Some(rest) = url.strip_prefix("data:") {
        if let Some((media_type, data)) = rest.split_once(";base64,") {
            return serde_json::json!({"type": "base64", "media_type": media_type, "data": data});
        }
    }
    serde_json::json!({"type": "url", "url": url})
}

fn content_blocks(content: Option<&MessageContent>) -> Vec<Block<'_>> {
    match content {
        None => Vec::new(),
        Some(MessageContent::Text(text)) if text.is_empty() => Vec::new(),
        Some(MessageContent::Text(text)) => vec![Block::Text {
            text: Cow::Borrowed(text),
            cache_control: None,
        }],
        Some(MessageContent::Parts(parts)) => parts
            .iter()
            .filter_map(|part| match part {
                ContentPart::Text { text } if text.is_empty() => None,
                ContentPart::Text { text } => Some(Block::Text {
                    text: Cow::Borrowed(text),
                    cache_control: None,
                }),
                ContentPart::ImageUrl { image_url } => Some(Block::Image {
                    source: image_source(&image_url.url),
                    cache_control: None,
                }),
            })
            .collect(),
    }
}

/// Tool arguments as the object Anthropic requires: the parsed JSON when it
/// is an object, `{}` otherwise (the run already told the model its
/// arguments were invalid).
fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value @ Value::Object(_)) => value,
        _ => Value::Object(Map::new()),
    }
}

impl<'a> MessagesRequest<'a> {
    /// The body for `request` to `model`.
    ///
    /// System messages, wherever they are, go to `system` in order. Tool
    /// results become `tool_result` blocks of a user turn; consecutive turns
    /// of one role are merged, as the API requires alternation. A
    /// `response_format` becomes an instruction in `system`, since the API
    /// has no such field.
    pub(crate) fn new(
        request: &'a ModelRequest,
        model: &'a str,
        default_max_tokens: u32,
        stream: bool,
    ) -> Self {
        let mut system: Vec<Cow<'a, str>> = Vec::new();
        let mut system_lead = 0;
        let mut messages: Vec<WireMessage<'a>> = Vec::new();
        for message in request.messages.iter() {
            let (role, blocks) = match message.role {
                Role::System => {
                    system.push(message.text());
                    if messages.is_empty() {
                        system_lead = system.len();
                    }
                    continue;
                }
                Role::User => ("user", content_blocks(message.content.as_ref())),
                Role::Assistant => {
                    let mut blocks = content_blocks(message.content.as_ref());
                    blocks.extend(message.tool_calls.iter().map(|call| Block::ToolUse {
                        id: &call.id,
                        name: &call.name,
                        input: tool_input(&call.arguments),
                        cache_control: None,
                    }));
                    ("assistant", blocks)
                }
                Role::Tool => (
                    "user",
                    vec![Block::ToolResult {
                        tool_use_id: message.tool_call_id.as_deref().unwrap_or(""),
                        content: message.text(),
                        cache_control: None,
                    }],
                ),
            };
            if blocks.is_empty() {
                continue;
            }
            match messages.last_mut() {
                Some(last) if last.role == role => last.content.extend(blocks),
                _ => messages.push(WireMessage {
                    role,
                    content: blocks,
                }),
            }
        }
        let settings = &request.settings;
        match &settings.response_format {
            Some(ResponseFormat::JsonSchema { json_schema }) => system.push(Cow::Owned(format!(
                "Answer only with JSON that matches this JSON Schema, with no other text:\n{}",
                json_schema.schema
            ))),
            Some(ResponseFormat::JsonObject) => system.push(Cow::Borrowed(
                "Answer only with a JSON object, with no other text.",
            )),
            Some(ResponseFormat::Text) | None => {}
        }
        let tools: Vec<WireTool<'a>> = request.tools.iter().map(WireTool::from).collect();
        let tool_choice = (!tools.is_empty())
            .then(|| wire_tool_choice(settings))
            .flatten();
        Self {
            model,
            max_tokens: settings.max_tokens.unwrap_or(default_max_tokens),
            system: (!system.is_empty()).then(|| System::Text(system.join("\n\n"))),
            messages,
            tools,
            tool_choice,
            temperature: settings.temperature,
            stop_sequences: &settings.stop,
            stream,
            system_parts: system,
            system_lead,
        }
    }

    /// Places prompt-cache breakpoints on the stable prefix, at most
    /// [`MAX_CACHE_BREAKPOINTS`] and at most `max`: the last tool, the
    /// leading system messages (then `system` is sent as text blocks: the
    /// leading ones, and the later ones and the response-format instruction
    /// after them), and the last block of the last two messages (the tail
    /// caches the whole prompt for the next turn, which then reads it; the
    /// one before is the fallback when the tail moved too far). Answers how
    /// many it placed.
    pub(crate) fn cache_breakpoints(&mut self, max: usize) -> usize {
        let mut left = max.min(MAX_CACHE_BREAKPOINTS);
        if left > 0 {
            if let Some(tool) = self.tools.last_mut() {
                tool.cache_control = Some(EPHEMERAL);
                left -= 1;
            }
        }
        if left > 0 && self.system_lead > 0 {
            let (lead, rest) = self.system_parts.split_at(self.system_lead);
            let mut blocks = vec![SystemBlock {
                kind: "text",
                text: lead.join("\n\n"),
                cache_control: Some(EPHEMERAL),
            }];
            if !rest.is_empty() {
                blocks.push(SystemBlock {
                    kind: "text",
                    text: rest.join("\n\n"),
                    cache_control: None,
                });
            }
            self.system = Some(System::Blocks(blocks));
            left -= 1;
        }
        for message in self.messages.iter_mut().rev().take(2) {
            if left == 0 {
                break;
            }
            if let Some(block) = message.content.last_mut() {
                block.mark();
                left -= 1;
            }
        }
        max.min(MAX_CACHE_BREAKPOINTS) - left
    }
}

/// Anthropic's `tool_choice`: `auto`, `any`, `tool` (with its name) or
/// `none`, with `disable_parallel_tool_use` when parallel calls are off.
/// `None` when neither is set.
fn wire_tool_choice(settings: &ModelSettings) -> Option<Value> {
    let serial = settings.parallel_tool_calls == Some(false);
    let mut choice = match &settings.tool_choice {
        None if !serial => return None,
        None | Some(ToolChoice::Auto) => serde_json::json!({"type": "auto"}),
        // `none` takes no `disable_parallel_tool_use`: no call is made.
        Some(ToolChoice::None) => return Some(serde_json::json!({"type": "none"})),
        Some(ToolChoice::Required) => serde_json::json!({"type": "any"}),
        Some(ToolChoice::Tool(name)) => serde_json::json!({"type": "tool", "name": name}),
    };
    if serial {
        choice["disable_parallel_tool_use"] = Value::Bool(true);
    }
    Some(choice)
}

impl<'a> From<&'a ToolSpec> for WireTool<'a> {
    fn from(spec: &'a ToolSpec) -> Self {
        WireTool {
            name: &spec.name,
            description: &spec.description,
            input_schema: &spec.parameters,
            cache_control: None,
        }
    }
}

/// The usage object of a response, or of `message_start` / `message_delta`.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    pub(crate) input_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) output_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) cache_read_input_tokens: Option<u64>,
}

impl WireUsage {
    /// Overwrites the counts `other` has.
    pub(crate) fn merge(&mut self, other: &WireUsage) {
        let take = |mine: &mut Option<u64>, theirs: Option<u64>| {
            if theirs.is_some() {
                *mine = theirs;
            }
        };
        take(&mut self.input_tokens, other.input_tokens);
        take(&mut self.output_tokens, other.output_tokens);
        take(
            &mut self.cache_creation_input_tokens,
            other.cache_creation_input_tokens,
        );
        take(
            &mut self.cache_read_input_tokens,
            other.cache_read_input_tokens,
        );
    }
}

impl From<&WireUsage> for Usage {
    /// Anthropic counts cached and cache-written tokens apart from
    /// `input_tokens`; here they are part of the input, and the cache reads
    /// are the cached subset.
    fn from(wire: &WireUsage) -> Self {
        let read = tokens(wire.cache_read_input_tokens);
        let written = tokens(wire.cache_creation_input_tokens);
        Usage {
            input_tokens: tokens(wire.input_tokens) + read + written,
            output_tokens: tokens(wire.output_tokens),
            cached_input_tokens: read,
            reasoning_tokens: 0,
        }
    }
}

/// Maps a stop reason's wire name.
pub(crate) fn finish_reason(reason: Option<&str>, has_tool_calls: bool) -> FinishReason {
    match reason {
        Some("end_turn" | "stop_sequence") => FinishReason::Stop,
        Some("max_tokens") => FinishReason::Length,
        Some("tool_use") => FinishReason::ToolCalls,
        Some("refusal") => FinishReason::ContentFilter,
        Some(other) => FinishReason::Other(other.to_owned()),
        None if has_tool_calls => FinishReason::ToolCalls,
        None => FinishReason::Stop,
    }
}

/// A non-streamed response.
#[derive(Debug, Deserialize)]
pub(crate) struct MessagesResponse {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    content: Option<Vec<ContentBlock>>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

/// A content block of a response, or the block a stream's
/// `content_block_start` opens.
#[derive(Debug, Deserialize)]
pub(crate) struct ContentBlock {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) text: Option<String>,
    #[serde(default)]
    pub(crate) id: Option<String>,
    #[serde(default)]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) input: Option<Value>,
}

impl MessagesResponse {
    /// The response, reported as from `model` when the body names none.
    pub(crate) fn into_response(self, model: &str) -> Result<ModelResponse, String> {
        let blocks = self.content.ok_or("the response has no content")?;
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        for block in blocks {
            match block.kind.as_str() {
                "text" => text.push_str(block.text.as_deref().unwrap_or("")),
                "tool_use" => {
                    let name = block.name.filter(|n| !n.is_empty());
                    let name = name.ok_or("a tool_use block has no name")?;
                    let input = block.input.unwrap_or_else(|| Value::Object(Map::new()));
                    tool_calls.push(ToolCall {
                        id: block.id.unwrap_or_default(),
                        name,
                        arguments: input.to_string(),
                    });
                }
                // Thinking, redacted thinking and server tools are not part of
                // the transcript.
                _ => {}
            }
        }
        let finish = finish_reason(self.stop_reason.as_deref(), !tool_calls.is_empty());
        let usage = self.usage.as_ref().map(Usage::from).unwrap_or_default();
        Ok(response(self.model, model, text, tool_calls, finish, usage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ImageUrl, Message, ModelSettings};
    use serde_json::json;

    #[test]
    fn writes_the_messages_body() {
        let mut request = ModelRequest::new(
            "claude-test",
            vec![
                Message::system("be brief"),
                Message::user("weather in Paris and Rome?"),
                Message::assistant_tool_calls(vec![
                    ToolCall::new("toolu_1", "weather", r#"{"city":"Paris"}"#),
                    ToolCall::new("toolu_2", "weather", "not json"),
                ]),
                Message::tool("toolu_1", "18C"),
                Message::tool("toolu_2", "21C"),
                Message::system("the user is in a hurry"),
                Message {
                    content: Some(MessageContent::Parts(vec![
                        ContentPart::Text {
                            text: "and this?".into(),
                        },
                        ContentPart::ImageUrl {
                            image_url: ImageUrl {
                                url: "data:image/png;base64,AAAA".into(),
                                detail: None,
                            },
                        },
                    ])),
                    ..Message::user("")
                },
            ],
        );
        request.tools = vec![ToolSpec::new("weather", "", json!({"type": "object"}))].into();
        request.settings = ModelSettings {
            temperature: Some(0.0),
            max_tokens: None,
            stop: vec!["END".into()],
            response_format: Some(ResponseFormat::json_schema("a", json!({"type": "object"}))),
            parallel_tool_calls: Some(false),
            tool_choice: None,
        }
        .into();
        let body = MessagesRequest::new(&request, "claude-test", 1024, true);
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            json!({
                "model": "claude-test",
                "max_tokens": 1024,
                "system": "be brief\n\nthe user is in a hurry\n\nAnswer only with JSON that matches this JSON Schema, with no other text:\n{\"type\":\"object\"}",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "weather in Paris and Rome?"}]},
                    {"role": "assistant", "content": [
                        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {}}
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "21C"},
                        {"type": "text", "text": "and this?"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
                    ]}
                ],
                "tools": [{"name": "weather", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
                "temperature": 0.0,
                "stop_sequences": ["END"],
                "stream": true
            })
        );
    }

    #[test]
    fn writes_each_tool_choice() {
        let mut request = ModelRequest::new("m", vec![crate::types::Message::user("hi")]);
        request.settings_mut().tool_choice = Some(ToolChoice::Required);
        let body = MessagesRequest::new(&request, "m", 16, false);
        assert!(
            serde_json::to_value(&body)
                .unwrap()
                .get("tool_choice")
                .is_none(),
            "no tools, no choice"
        );
        request.tools = vec![ToolSpec::new("weather", "", json!({"type": "object"}))].into();
        for (choice, serial, wire) in [
            (ToolChoice::Auto, false, json!({"type": "auto"})),
            (ToolChoice::None, true, json!({"type": "none"})),
            (ToolChoice::Required, false, json!({"type": "any"})),
            (
                ToolChoice::tool("weather"),
                true,
                json!({"type": "tool", "name": "weather", "disable_parallel_tool_use": true}),
            ),
        ] {
            request.settings_mut().tool_choice = Some(choice);
            request.settings_mut().parallel_tool_calls = Some(!serial);
            let body = MessagesRequest::new(&request, "m", 16, false);
            assert_eq!(serde_json::to_value(&body).unwrap()["tool_choice"], wire);
        }
    }

    #[test]
    fn reads_a_response_with_tool_use_and_cache_usage() {
        let body = json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 7, "cache_creation_input_tokens": 5, "cache_read_input_tokens": 100}
        });
        let response: MessagesResponse = serde_json::from_value(body).unwrap();
        let response = response.into_response("asked").unwrap();
        assert_eq!(response.model, "claude-x");
        assert_eq!(response.message.text(), "Checking.");
        assert_eq!(
            response.message.tool_calls,
            vec![ToolCall::new("toolu_1", "weather", r#"{"city":"Paris"}"#)]
        );
        assert_eq!(response.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            response.usage,
            Usage {
                input_tokens: 115,
                output_tokens: 7,
                cached_input_tokens: 100,
                reasoning_tokens: 0
            }
        );
    }

    fn count_breakpoints(value: &Value) -> usize {
        match value {
            Value::Object(map) => {
                usize::from(map.contains_key("cache_control"))
                    + map.values().map(count_breakpoints).sum::<usize>()
            }
            Value::Array(list) => list.iter().map(count_breakpoints).sum(),
            _ => 0,
        }
    }

    fn cached_request() -> ModelRequest {
        let mut request = ModelRequest::new(
            "claude-test",
            vec![
                Message::system("You report the weather."),
                Message::system("<memory_context>\n- [fact] lives in Paris\n</memory_context>"),
                Message::user("weather?"),
                Message::assistant_tool_calls(vec![ToolCall::new("toolu_1", "weather", "{}")]),
                Message::tool("toolu_1", "18C"),
                Message::system("added later"),
            ],
        );
        request.tools = vec![
            ToolSpec::new("time", "", json!({"type": "object"})),
            ToolSpec::new("weather", "", json!({"type": "object"})),
        ]
        .into();
        request
    }

    #[test]
    fn places_breakpoints_on_tools_the_leading_system_and_the_last_two_messages() {
        let request = cached_request();
        let mut body = MessagesRequest::new(&request, "claude-test", 1024, false);
        assert_eq!(body.cache_breakpoints(4), 4);
        let body = serde_json::to_value(&body).unwrap();
        let ephemeral = json!({"type": "ephemeral"});
        assert_eq!(body["tools"][0].get("cache_control"), None);
        assert_eq!(body["tools"][1]["cache_control"], ephemeral);
        assert_eq!(
            body["system"],
            json!([
                {"type": "text", "text": "You report the weather.\n\n<memory_context>\n- [fact] lives in Paris\n</memory_context>", "cache_control": ephemeral},
                {"type": "text", "text": "added later"}
            ])
        );
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[0]["content"][0].get("cache_control"), None);
        assert_eq!(messages[1]["content"][0]["cache_control"], ephemeral);
        assert_eq!(messages[2]["content"][0]["cache_control"], ephemeral);
        assert_eq!(count_breakpoints(&body), 4);
    }

    #[test]
    fn never_places_more_than_the_api_takes_or_than_asked() {
        let request = cached_request();
        for (max, placed) in [(0, 0), (1, 1), (2, 2), (9, 4)] {
            let mut body = MessagesRequest::new(&request, "claude-test", 1024, false);
            assert_eq!(body.cache_breakpoints(max), placed);
            let value = serde_json::to_value(&body).unwrap();
            assert_eq!(count_breakpoints(&value), placed, "max {max}");
            if max == 1 {
                assert!(
                    value["tools"][1].get("cache_control").is_some(),
                    "tools first"
                );
                assert!(value["system"].is_string(), "system untouched");
            }
        }
        // No tools, no system: the two messages are all there is to mark.
        let request = ModelRequest::new("m", vec![Message::user("hi")]);
        let mut body = MessagesRequest::new(&request, "m", 1024, false);
        assert_eq!(body.cache_breakpoints(4), 1);
        let value = serde_json::to_value(&body).unwrap();
        assert_eq!(
            value["messages"][0]["content"][0]["cache_control"]["type"],
            "ephemeral"
        );
        assert_eq!(value.get("system"), None);
    }

    #[test]
    fn maps_stop_reasons() {
        assert_eq!(finish_reason(Some("end_turn"), false), FinishReason::Stop);
        assert_eq!(
            finish_reason(Some("stop_sequence"), false),
            FinishReason::Stop
        );
        assert_eq!(
            finish_reason(Some("max_tokens"), false),
            FinishReason::Length
        );
        assert_eq!(
            finish_reason(Some("refusal"), false),
            FinishReason::ContentFilter
        );
        assert_eq!(
            finish_reason(Some("pause_turn"), false),
            FinishReason::Other("pause_turn".into())
        );
        assert_eq!(finish_reason(None, true), FinishReason::ToolCalls);
    }
}
