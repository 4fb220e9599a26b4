//! `POST /v1/chat/completions`: an agent answers as if it were a model, so
//! any OpenAI client can talk to it.

use std::convert::Infallible;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::Stream;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::runs::{start, Finished, Frame, Started};
use super::Shared;
use crate::request::RunRequest;
use crate::types::{History, Message, ModelDelta, Role, RunStatus, Usage};

/// The fields of a chat-completion request the agent reads; the rest
/// (temperature, tools, ...) belong to the agent's own configuration and
/// are ignored.
#[derive(Debug, Deserialize)]
pub(crate) struct ChatRequest {
    model: String,
    messages: Vec<Message>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn usage_json(usage: &Usage) -> Value {
    json!({
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens(),
    })
}

/// The input of the run: the last message, which must be the user's; the
/// messages before it are the thread's history.
pub(crate) fn split_messages(
    mut messages: Vec<Message>,
) -> Result<(Message, Vec<Message>), ApiError> {
    match messages.pop() {
        Some(last) if last.role == Role::User => Ok((last, messages)),
        Some(last) => Err(ApiError::invalid(format!(
            "the last message must be the user's, not a `{}` message",
            serde_json::to_value(last.role)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        ))),
        None => Err(ApiError::invalid("`messages` is empty")),
    }
}

/// A paused run cannot go on over this API: the caller learns how to
/// resume it.
fn paused_error(finished: &Finished) -> Option<ApiError> {
    let RunStatus::Paused(checkpoint) = &finished.run.status else {
        return None;
    };
    Some(
        ApiError::new(
            "CONFLICT",
            "the run paused for approval; resume it at /v1/runs/{id}/resume",
        )
        .details(json!({
            "run_id": finished.run.run_id,
            "version": finished.version,
            "pending": checkpoint.pending,
        })),
    )
}

pub(crate) async fn chat_completions(
    State(shared): State<Shared>,
    body: Result<Json<ChatRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    let (name, agent) = shared.agent_for_model(&body.model)?;
    let (input, history) = split_messages(body.messages)?;
    let request = RunRequest::message(input).history(History::from(history));
    let started = start(
        &shared.runs,
        shared.store.clone(),
        &name,
        agent,
        request,
        false,
    );
    let id = format!("chatcmpl-{}", started.run_id);
    if body.stream {
        let include_usage = body.stream_options.is_some_and(|o| o.include_usage);
        let stream = chunk_stream(started, id, body.model, include_usage);
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let finished = started.outcome().await?;
    if let Some(error) = paused_error(&finished) {
        return Err(error);
    }
    let run = &finished.run;
    Ok(Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": now(),
        "model": body.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": run.output},
            "finish_reason": "stop",
        }],
        "usage": usage_json(&run.usage_total),
    }))
    .into_response())
}

struct ChunkState {
    started: Started,
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    sent_role: bool,
    sent_text: bool,
    queue: Vec<Value>,
    done: bool,
}

impl ChunkState {
    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        })
    }

    fn text(&mut self, text: &str) -> Value {
        let delta = if self.sent_role {
            json!({"content": text})
        } else {
            self.sent_role = true;
            json!({"role": "assistant", "content": text})
        };
        self.sent_text = true;
        self.chunk(delta, None)
    }

    /// The chunks that end the stream for `outcome`.
    fn finish(&mut self, outcome: Result<Finished, ApiError>) -> Vec<Value> {
        let finished = match outcome.map(|f| match paused_error(&f) {
            Some(error) => Err(error),
            None => Ok(f),
        }) {
            Ok(Ok(finished)) => finished,
            Ok(Err(error)) | Err(error) => {
                return vec![json!({"error": error})];
            }
        };
        let mut chunks = Vec::new();
        if !self.sent_text && !finished.run.output.is_empty() {
            // A model that did not stream: the answer in one piece.
            let output = finished.run.output.clone();
            chunks.push(self.text(&output));
        }
        chunks.push(self.chunk(json!({}), Some("stop")));
        if self.include_usage {
            let mut usage = self.chunk(json!({}), None);
            usage["choices"] = json!([]);
            usage["usage"] = usage_json(&finished.run.usage_total);
            chunks.push(usage);
        }
        chunks
    }
}

/// The run as `chat.completion.chunk`s, `data: [DONE]` last. Dropping the
/// stream cancels the run.
fn chunk_stream(
    started: Started,
    id: String,
    model: String,
    include_usage: bool,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let state = ChunkState {
        started,
        id,
        model,
        created: now(),
        include_usage,
        sent_role: false,
        sent_text: false,
        queue: Vec::new(),
        done: false,
    };
    futures::stream::unfold(Some(state), |state| async move {
        let mut state = state?;
        loop {
            if !state.queue.is_empty() {
                let chunk = state.queue.remove(0);
                return Some((Ok(Event::default().data(chunk.to_string())), Some(state)));
            }
            if state.done {
                return Some((Ok(Event::default().data("[DONE]")), None));
            }
            match state.started.frames.recv().await {
                Some(Frame::Delta(ModelDelta::Text { text })) if !text.is_empty() => {
                    let chunk = state.text(&text);
                    state.queue.push(chunk);
                }
                Some(Frame::Done(outcome)) => {
                    state.queue = state.finish(outcome);
                    state.done = true;
                }
                Some(_) => {}
                None => {
                    state.done = true;
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_message_is_the_input_and_the_rest_history() {
        let (input, history) = split_messages(vec![
            Message::system("be brief"),
            Message::user("hi"),
            Message::assistant("hello"),
            Message::user("what is 2+2?"),
        ])
        .unwrap();
        assert_eq!(input.text(), "what is 2+2?");
        assert_eq!(history.len(), 3);
        assert_eq!(split_messages(vec![]).unwrap_err().code, "INVALID_REQUEST");
        let err = split_messages(vec![Message::assistant("x")]).unwrap_err();
        assert!(err.message.contains("assistant"), "{}", err.message);
    }
}
