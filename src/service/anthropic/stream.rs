//! Streamed Messages: the event types and their accumulation into one
//! response.
//!
//! `message_start` → (`content_block_start` → `content_block_delta`* →
//! `content_block_stop`)* → `message_delta` → `message_stop`, with `ping`
//! anywhere and `error` ending the stream. Text deltas go to the sink as
//! [`ModelDelta::Text`], thinking as [`ModelDelta::Reasoning`], tool input
//! as [`ModelDelta::ToolCall`] indexed by the call's position among the
//! answer's tool calls (not by content block). Unknown event and block
//! types are skipped, as the API's versioning policy asks.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::wire::{finish_reason, ContentBlock as StartBlock, WireUsage};
use crate::error::ProviderError;
use crate::request::DeltaSink;
use crate::service::http::error::classify_event;
use crate::service::http::{response, Decoder, Deltas, Flow};
use crate::types::{ModelDelta, ModelResponse, ToolCall, Usage};

#[derive(Debug, Deserialize)]
struct Event {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    message: Option<StartMessage>,
    #[serde(default)]
    content_block: Option<StartBlock>,
    #[serde(default)]
    delta: Option<EventDelta>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Debug, Deserialize)]
struct StartMessage {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Debug, Deserialize)]
struct EventDelta {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    partial_json: Option<String>,
    #[serde(default)]
    thinking: Option<String>,
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Debug)]
enum Block {
    Text,
    Thinking,
    Tool {
        ordinal: usize,
        input: Option<Value>,
        streamed: bool,
        closed: bool,
    },
    Other,
}

/// Accumulates the events of one streamed answer.
#[derive(Debug)]
pub(crate) struct EventAccumulator {
    model: String,
    text: String,
    blocks: BTreeMap<u64, Block>,
    calls: Vec<ToolCall>,
    stop_reason: Option<String>,
    usage: Option<WireUsage>,
    deltas: Deltas,
}

impl EventAccumulator {
    /// An accumulator for an answer asked of `model`.
    pub(crate) fn new(model: &str) -> Self {
        Self {
            model: model.to_owned(),
            text: String::new(),
            blocks: BTreeMap::new(),
            calls: Vec::new(),
            stop_reason: None,
            usage: None,
            deltas: Deltas::default(),
        }
    }

    fn text(&mut self, text: String, sink: Option<&DeltaSink>) {
        if !text.is_empty() {
            self.text.push_str(&text);
            self.deltas.send(sink, ModelDelta::Text { text });
        }
    }

    fn merge_usage(&mut self, usage: Option<&WireUsage>) {
        if let Some(usage) = usage {
            self.usage
                .get_or_insert_with(WireUsage::default)
                .merge(usage);
        }
    }

    fn malformed(&self, detail: impl Into<String>) -> ProviderError {
        self.deltas.broken(detail)
    }

    fn start_block(&mut self, index: u64, block: StartBlock, sink: Option<&DeltaSink>) {
        let state = match block.kind.as_str() {
            "text" => {
                self.text(block.text.unwrap_or_default(), sink);
                Block::Text
            }
            "thinking" => Block::Thinking,
            "tool_use" => {
                let ordinal = self.calls.len();
                let id = block.id.unwrap_or_default();
                let name = block.name.unwrap_or_default();
                self.calls.push(ToolCall::new(id.clone(), name.clone(), ""));
                self.deltas.send(
                    sink,
                    ModelDelta::ToolCall {
                        index: ordinal,
                        id: Some(id).filter(|id| !id.is_empty()),
                        name: Some(name).filter(|n| !n.is_empty()),
                        arguments: String::new(),
                    },
                );
                Block::Tool {
                    ordinal,
                    input: block.input,
                    streamed: false,
                    closed: false,
                }
            }
            _ => Block::Other,
        };
        self.blocks.insert(index, state);
    }

    fn block_delta(
        &mut self,
        index: u64,
        delta: EventDelta,
        sink: Option<&DeltaSink>,
    ) -> Result<(), ProviderError> {
        enum Target {
            Text,
            Thinking,
            Tool(usize),
            Other,
        }
        let target = match self.blocks.get(&index) {
            Some(Block::Text) => Target::Text,
            Some(Block::Thinking) => Target::Thinking,
            Some(Block::Tool {
                ordinal,
                closed: false,
                ..
            }) => Target::Tool(*ordinal),
            _ => Target::Other,
        };
        match (delta.kind.as_deref(), target) {
            (Some("text_delta"), Target::Text) => self.text(delta.text.unwrap_or_default(), sink),
            (Some("thinking_delta"), Target::Thinking) => {
                if let Some(text) = delta.thinking.filter(|t| !t.is_empty()) {
                    self.deltas.send(sink, ModelDelta::Reasoning { text });
                }
            }
            (Some("input_json_delta"), Target::Tool(ordinal)) => {
                let piece = delta.partial_json.unwrap_or_default();
                if piece.is_empty() {
                    return Ok(());
                }
                if let Some(Block::Tool { streamed, .. }) = self.blocks.get_mut(&index) {
                    *streamed = true;
                }
                self.arguments(ordinal, piece, sink);
            }
            (Some("text_delta" | "input_json_delta" | "thinking_delta"), _) => {
                return Err(self.malformed(format!("a delta does not fit content block {index}")));
            }
            // signature_delta, citations_delta and kinds to come.
            _ => {}
        }
        Ok(())
    }

    fn stop_block(&mut self, index: u64, sink: Option<&DeltaSink>) {
        let (ordinal, input) = match self.blocks.get_mut(&index) {
            Some(Block::Tool {
                ordinal,
                input,
                streamed,
                closed: closed @ false,
            }) => {
                *closed = true;
                if *streamed {
                    return;
                }
                (*ordinal, input.take())
            }
            _ => return,
        };
        // No input was streamed: the start block's input is the whole of it.
        let arguments = match input {
            Some(input @ Value::Object(_)) => input.to_string(),
            _ => "{}".to_owned(),
        };
        self.arguments(ordinal, arguments, sink);
    }

    /// Appends a piece of tool call `ordinal`'s arguments, and sends it.
    fn arguments(&mut self, ordinal: usize, piece: String, sink: Option<&DeltaSink>) {
        if let Some(call) = self.calls.get_mut(ordinal) {
            call.arguments.push_str(&piece);
        }
        self.deltas.send(
            sink,
            ModelDelta::ToolCall {
                index: ordinal,
                id: None,
                name: None,
                arguments: piece,
            },
        );
    }
}

impl Decoder for EventAccumulator {
    fn event(
        &mut self,
        event: &str,
        data: &str,
        sink: Option<&DeltaSink>,
    ) -> Result<Flow, ProviderError> {
        let value: Value = serde_json::from_str(data)
            .map_err(|e| self.malformed(format!("an event is not JSON: {e}")))?;
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(event)
            .to_owned();
        if kind == "error" {
            return Err(classify_event(&value, self.deltas.sent()));
        }
        let parsed: Event = serde_json::from_value(value)
            .map_err(|e| self.malformed(format!("a `{kind}` event has the wrong shape: {e}")))?;
        debug_assert!(parsed.kind.as_deref().is_none_or(|k| k == kind));
        let index = parsed.index;
        let need_index = |this: &Self| {
            index.ok_or_else(|| this.malformed(format!("a `{kind}` event has no index")))
        };
        match kind.as_str() {
            "message_start" => {
                let message = parsed
                    .message
                    .ok_or_else(|| self.malformed("`message_start` has no message"))?;
                if let Some(model) = message.model.filter(|m| !m.is_empty()) {
                    self.model = model;
                }
                self.merge_usage(message.usage.as_ref());
            }
            "content_block_start" => {
                let index = need_index(self)?;
                let block = parsed
                    .content_block
                    .ok_or_else(|| self.malformed("`content_block_start` has no block"))?;
                if self.blocks.contains_key(&index) {
                    return Err(self.malformed(format!("content block {index} started twice")));
                }
                self.start_block(index, block, sink);
            }
            "content_block_delta" => {
                let index = need_index(self)?;
                let delta = parsed
                    .delta
                    .ok_or_else(|| self.malformed("`content_block_delta` has no delta"))?;
                self.block_delta(index, delta, sink)?;
            }
            "content_block_stop" => self.stop_block(need_index(self)?, sink),
            "message_delta" => {
                if let Some(reason) = parsed.delta.and_then(|d| d.stop_reason) {
                    self.stop_reason = Some(reason);
                }
                self.merge_usage(parsed.usage.as_ref());
            }
            "message_stop" => return Ok(Flow::Done),
            // ping, and event types to come.
            _ => {}
        }
        Ok(Flow::More)
    }

    fn finish(self) -> Result<ModelResponse, ProviderError> {
        let open = self.blocks.iter().find_map(|(index, block)| match block {
            Block::Tool { closed: false, .. } => Some(*index),
            _ => None,
        });
        if let Some(index) = open {
            return Err(self.malformed(format!("tool_use block {index} was never closed")));
        }
        if let Some(at) = self.calls.iter().position(|c| c.name.is_empty()) {
            return Err(self.malformed(format!("tool call {at} has no name")));
        }
        let finish = finish_reason(self.stop_reason.as_deref(), !self.calls.is_empty());
        let usage = self.usage.as_ref().map(Usage::from).unwrap_or_default();
        Ok(response(
            None,
            &self.model,
            self.text,
            self.calls,
            finish,
            usage,
        ))
    }

    fn usage(&self) -> Option<Usage> {
        self.usage.as_ref().map(Usage::from)
    }

    fn deltas(&self) -> &Deltas {
        &self.deltas
    }
}

/// Fuzzing entry: decodes `data` as a Messages stream (its first 8 bytes
/// choose the chunk boundaries) and checks that any chunking gives the same
/// outcome and that the deltas add up to the answer. Panics only when an
/// invariant breaks; no input may make it panic otherwise.
#[doc(hidden)]
pub fn fuzz_anthropic_stream(data: &[u8]) {
    crate::service::http::fuzz_one(data, || EventAccumulator::new("fuzz"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::service::http::{check_deltas, decode_collect, split};
    use crate::types::FinishReason;

    const STREAM: &str = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-x\",\"stop_reason\":null,\"usage\":{\"input_tokens\":472,\"output_tokens\":2,\"cache_read_input_tokens\":100}}}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: ping\ndata: {\"type\": \"ping\"}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Let me check \"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"the weather.\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_a\",\"name\":\"weather\",\"input\":{}}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \\\"Pa\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"ris\\\"}\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_b\",\"name\":\"clock\",\"input\":{}}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":2}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":89}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );

    fn decode(chunks: &[&[u8]]) -> (Result<ModelResponse, ProviderError>, Vec<ModelDelta>) {
        decode_collect(chunks, EventAccumulator::new("asked"))
    }

    #[test]
    fn accumulates_text_tool_input_and_usage() {
        let (result, deltas) = decode(&[STREAM.as_bytes()]);
        let response = result.unwrap();
        assert_eq!(response.model, "claude-x");
        assert_eq!(response.message.text(), "Let me check the weather.");
        assert_eq!(
            response.message.tool_calls,
            vec![
                ToolCall::new("toolu_a", "weather", r#"{"city": "Paris"}"#),
                ToolCall::new("toolu_b", "clock", "{}"),
            ]
        );
        assert_eq!(response.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            response.usage,
            Usage {
                input_tokens: 572,
                output_tokens: 89,
                cached_input_tokens: 100,
                reasoning_tokens: 0
            }
        );
        assert_eq!(deltas.len(), 7);
        check_deltas(&response, &deltas);
    }

    #[test]
    fn any_chunking_gives_the_same_answer() {
        let (whole, whole_deltas) = decode(&[STREAM.as_bytes()]);
        let whole = whole.unwrap();
        for seed in 0..200 {
            let (result, deltas) = decode(&split(STREAM.as_bytes(), seed));
            assert_eq!(result.unwrap(), whole, "seed {seed}");
            assert_eq!(deltas, whole_deltas, "seed {seed}");
        }
    }

    #[test]
    fn truncation_error_events_and_bad_shapes_fail() {
        let cut = STREAM.replace(
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
            "",
        );
        let (result, _) = decode(&[cut.as_bytes()]);
        assert_eq!(result.unwrap_err().kind(), ErrorKind::Unavailable);

        let overloaded = "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n";
        let (result, _) = decode(&[overloaded.as_bytes()]);
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert_eq!(err.message(), "Overloaded");

        for bad in [
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":9,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\"}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"content_block\":{\"type\":\"text\"}}\n\n",
            "event: message_start\ndata: {\"type\":\"message_start\"}\n\n",
            "event: message_start\ndata: not json\n\n",
            // An unclosed tool block at message_stop.
            "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}}\n\ndata: {\"type\":\"message_stop\"}\n\n",
            // A tool block without a name.
            "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"input\":{}}}\n\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\ndata: {\"type\":\"message_stop\"}\n\n",
        ] {
            let (result, _) = decode(&[bad.as_bytes()]);
            assert_eq!(result.unwrap_err().kind(), ErrorKind::Unavailable, "{bad}");
        }
    }

    #[test]
    fn forwards_thinking_and_skips_unknown_events() {
        let stream = concat!(
            "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hmm\"}}\n\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"x\"}}\n\n",
            "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "data: {\"type\":\"brand_new_event\",\"stuff\":1}\n\n",
            "data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"Hi\"}}\n\n",
            "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3}}\n\n",
            "data: {\"type\":\"message_stop\"}\n\n",
        );
        let (result, deltas) = decode(&[stream.as_bytes()]);
        let response = result.unwrap();
        assert_eq!(response.message.text(), "Hi");
        assert_eq!(response.model, "asked");
        assert_eq!(response.usage, Usage::new(0, 3));
        assert_eq!(
            deltas,
            vec![
                ModelDelta::Reasoning { text: "hmm".into() },
                ModelDelta::text("Hi")
            ]
        );
    }
}
