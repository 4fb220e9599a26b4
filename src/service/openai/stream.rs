//! Streamed chat completions: the chunks, and their accumulation into one
//! response, tool-call pieces joined by their `index`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::wire::{arguments_text, finish_reason, WireUsage};
use crate::error::ProviderError;
use crate::request::DeltaSink;
use crate::service::http::error::classify_event;
use crate::service::http::{response, Decoder, Deltas, Flow};
use crate::types::{ModelDelta, ModelResponse, ToolCall, Usage};

#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    choices: Option<Vec<ChunkChoice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<DeltaToolCall>>,
}

#[derive(Debug, Deserialize)]
struct DeltaToolCall {
    #[serde(default)]
    index: Option<usize>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<DeltaFunction>,
}

#[derive(Debug, Deserialize)]
struct DeltaFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Accumulates the chunks of one streamed answer.
#[derive(Debug)]
pub(crate) struct ChunkAccumulator {
    model: String,
    text: String,
    refusal: String,
    calls: BTreeMap<usize, PartialCall>,
    last_call: Option<usize>,
    finish: Option<String>,
    usage: Option<Usage>,
    deltas: Deltas,
}

impl ChunkAccumulator {
    /// An accumulator for an answer asked of `model`.
    pub(crate) fn new(model: &str) -> Self {
        Self {
            model: model.to_owned(),
            text: String::new(),
            refusal: String::new(),
            calls: BTreeMap::new(),
            last_call: None,
            finish: None,
            usage: None,
            deltas: Deltas::default(),
        }
    }

    fn tool_call(&mut self, piece: DeltaToolCall, sink: Option<&DeltaSink>) {
        // Servers that leave out `index` continue the last call, unless the
        // piece brings a new id.
        let index = match piece.index {
            Some(index) => index,
            None => match self.last_call {
                Some(last)
                    if piece.id.as_deref().is_none_or(|id| {
                        id.is_empty() || self.calls.get(&last).is_some_and(|c| c.id == id)
                    }) =>
                {
                    last
                }
                Some(last) => last.saturating_add(1),
                None => 0,
            },
        };
        self.last_call = Some(index);
        let (name, arguments) = match piece.function {
            Some(f) => (f.name, arguments_text(f.arguments.as_ref())),
            None => (None, String::new()),
        };
        let id = piece.id.filter(|id| !id.is_empty());
        let name = name.filter(|n| !n.is_empty());
        let call = self.calls.entry(index).or_default();
        if let Some(id) = &id {
            call.id.clone_from(id);
        }
        if let Some(name) = &name {
            // Some servers repeat the name on every piece; a new one replaces it.
            call.name.clone_from(name);
        }
        call.arguments.push_str(&arguments);
        if id.is_some() || name.is_some() || !arguments.is_empty() {
            self.deltas.send(
                sink,
                ModelDelta::ToolCall {
                    index,
                    id,
                    name,
                    arguments,
                },
            );
        }
    }
}

impl Decoder for ChunkAccumulator {
    fn event(
        &mut self,
        event: &str,
        data: &str,
        sink: Option<&DeltaSink>,
    ) -> Result<Flow, ProviderError> {
        let data = data.trim();
        if data == "[DONE]" {
            return Ok(Flow::Done);
        }
        if data.is_empty() {
            return Ok(Flow::More);
        }
        let value: Value = serde_json::from_str(data).map_err(|e| {
            self.deltas
                .broken(format!("a stream chunk is not JSON: {e}"))
        })?;
        if event == "error" || value.get("error").is_some_and(|e| !e.is_null()) {
            return Err(classify_event(&value, self.deltas.sent()));
        }
        let chunk: Chunk = serde_json::from_value(value).map_err(|e| {
            self.deltas
                .broken(format!("a stream chunk has the wrong shape: {e}"))
        })?;
        debug_assert!(chunk.error.is_none());
        if let Some(model) = chunk.model.filter(|m| !m.is_empty()) {
            self.model = model;
        }
        if let Some(usage) = &chunk.usage {
            self.usage = Some(Usage::from(usage));
        }
        for choice in chunk.choices.unwrap_or_default() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            let delta = choice.delta.unwrap_or_default();
            if let Some(text) = delta.reasoning_content.or(delta.reasoning) {
                if !text.is_empty() {
                    self.deltas.send(sink, ModelDelta::Reasoning { text });
                }
            }
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                self.text.push_str(&text);
                self.deltas.send(sink, ModelDelta::Text { text });
            }
            if let Some(text) = delta.refusal.filter(|t| !t.is_empty()) {
                self.refusal.push_str(&text);
            }
            for piece in delta.tool_calls.unwrap_or_default() {
                self.tool_call(piece, sink);
            }
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                self.finish = Some(reason);
            }
        }
        Ok(Flow::More)
    }

    fn finish(self) -> Result<ModelResponse, ProviderError> {
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (index, call) in self.calls {
            if call.name.is_empty() {
                let detail = format!("the tool call at index {index} has no name");
                return Err(self.deltas.broken(detail));
            }
            tool_calls.push(ToolCall {
                id: call.id,
                name: call.name,
                arguments: call.arguments,
            });
        }
        let text = if self.text.is_empty() {
            self.refusal
        } else {
            self.text
        };
        let finish = finish_reason(self.finish.as_deref(), !tool_calls.is_empty());
        let usage = self.usage.unwrap_or_default();
        Ok(response(None, &self.model, text, tool_calls, finish, usage))
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn deltas(&self) -> &Deltas {
        &self.deltas
    }
}

/// Fuzzing entry of the chat-completions decoder: `data`'s first 8 bytes
/// choose where the rest is cut; any chunking must give the same outcome,
/// with deltas that add up to the answer. No input may make it panic
/// otherwise.
#[doc(hidden)]
pub fn fuzz_openai_stream(data: &[u8]) {
    crate::service::http::fuzz_one(data, || ChunkAccumulator::new("fuzz"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::service::http::{decode_chunks, decode_collect, split};
    use crate::types::FinishReason;

    const TOOL_STREAM: &str = concat!(
        "data: {\"id\":\"c\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Let me \"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"check.\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"type\":\"function\",\"function\":{\"name\":\"weather\",\"arguments\":\"\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_b\",\"type\":\"function\",\"function\":{\"name\":\"time\",\"arguments\":\"{\\\"tz\\\":\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"city\\\":\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"Paris\\\"}\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\"\\\"CET\\\"}\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        ": keep-alive comment\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":12,\"prompt_tokens_details\":{\"cached_tokens\":32},\"completion_tokens_details\":{\"reasoning_tokens\":0}}}\n\n",
        "data: [DONE]\n\n",
    );

    fn decode(chunks: &[&[u8]]) -> (Result<ModelResponse, ProviderError>, Vec<ModelDelta>) {
        decode_collect(chunks, ChunkAccumulator::new("asked"))
    }

    #[test]
    fn accumulates_text_and_tool_calls_by_index() {
        let (result, deltas) = decode(&[TOOL_STREAM.as_bytes()]);
        let response = result.unwrap();
        assert_eq!(response.model, "gpt-x");
        assert_eq!(response.message.text(), "Let me check.");
        assert_eq!(
            response.message.tool_calls,
            vec![
                ToolCall::new("call_a", "weather", r#"{"city":"Paris"}"#),
                ToolCall::new("call_b", "time", r#"{"tz":"CET"}"#),
            ]
        );
        assert_eq!(response.finish_reason, FinishReason::ToolCalls);
        assert_eq!(response.usage.input_tokens, 50);
        assert_eq!(response.usage.cached_input_tokens, 32);
        assert_eq!(
            deltas[..2],
            [ModelDelta::text("Let me "), ModelDelta::text("check.")]
        );
        assert_eq!(
            deltas[2],
            ModelDelta::ToolCall {
                index: 0,
                id: Some("call_a".into()),
                name: Some("weather".into()),
                arguments: String::new()
            }
        );
        assert_eq!(deltas.len(), 7);
    }

    #[test]
    fn any_chunking_gives_the_same_answer_and_deltas() {
        let (whole, whole_deltas) = decode(&[TOOL_STREAM.as_bytes()]);
        let whole = whole.unwrap();
        for seed in 0..200 {
            let (result, deltas) = decode(&split(TOOL_STREAM.as_bytes(), seed));
            assert_eq!(result.unwrap(), whole, "seed {seed}");
            assert_eq!(deltas, whole_deltas, "seed {seed}");
        }
    }

    #[test]
    fn a_stream_cut_before_done_is_an_error_and_keeps_seen_usage() {
        let cut = TOOL_STREAM.replace("data: [DONE]\n\n", "");
        let failed = decode_chunks(&[cut.as_bytes()], ChunkAccumulator::new("m"), None, 1 << 20)
            .unwrap_err();
        assert_eq!(failed.error.kind(), ErrorKind::Unavailable);
        assert_eq!(failed.usage.map(|u| u.output_tokens), Some(12));

        let (sink, _rx) = DeltaSink::channel();
        let early = &TOOL_STREAM.as_bytes()[..300];
        let failed =
            decode_chunks(&[early], ChunkAccumulator::new("m"), Some(&sink), 1 << 20).unwrap_err();
        let broken =
            crate::error::find::<crate::service::http::BrokenResponse>(&failed.error).unwrap();
        assert!(broken.deltas_sent() > 0);
        assert_eq!(failed.usage, None);
    }

    #[test]
    fn malformed_chunks_and_error_events_are_errors() {
        let (result, _) = decode(&[b"data: {\"choices\": [\n\n"]);
        assert_eq!(result.unwrap_err().kind(), ErrorKind::Unavailable);
        let (result, _) = decode(&[b"data: {\"choices\": 3}\n\n"]);
        assert_eq!(result.unwrap_err().kind(), ErrorKind::Unavailable);
        let (result, _) = decode(&[
            b"data: {\"error\": {\"message\": \"Rate limit\", \"type\": \"rate_limit_error\"}}\n\n",
        ]);
        assert_eq!(result.unwrap_err().kind(), ErrorKind::RateLimited);
        let (result, _) = decode(&[b"event: error\ndata: {\"message\": \"boom\"}\n\n"]);
        assert_eq!(result.unwrap_err().kind(), ErrorKind::Unavailable);
        // A tool call that never got a name.
        let (result, _) = decode(&[
            b"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]}}]}\n\ndata: [DONE]\n\n",
        ]);
        assert_eq!(result.unwrap_err().kind(), ErrorKind::Unavailable);
    }

    #[test]
    fn pieces_without_an_index_follow_their_id() {
        let stream = concat!(
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"a\",\"function\":{\"name\":\"f\",\"arguments\":\"{\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"b\",\"function\":{\"name\":\"g\",\"arguments\":{\"x\":1}}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"other choice\"}}]}\n\n",
            "data: [DONE]\n\n",
        );
        let (result, _) = decode(&[stream.as_bytes()]);
        let response = result.unwrap();
        assert_eq!(
            response.message.tool_calls,
            vec![
                ToolCall::new("a", "f", "{}"),
                ToolCall::new("b", "g", r#"{"x":1}"#)
            ]
        );
        assert_eq!(response.message.content, None);
        assert_eq!(response.model, "asked");
        assert_eq!(response.usage, Usage::default());
    }

    #[test]
    fn forwards_reasoning_and_ignores_what_follows_done() {
        let stream = concat!(
            "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hmm\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n",
            "data: garbage\n\n",
        );
        let (result, deltas) = decode(&[stream.as_bytes()]);
        assert_eq!(result.unwrap().message.text(), "ok");
        assert_eq!(
            deltas,
            vec![
                ModelDelta::Reasoning { text: "hmm".into() },
                ModelDelta::text("ok")
            ]
        );
    }
}
