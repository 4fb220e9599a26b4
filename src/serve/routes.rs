//! The run endpoints: start a run (JSON or SSE), resume a paused one, read
//! where one stands.

use std::convert::Infallible;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::Stream;
use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use super::runs::{run_body, start, Frame, Started};
use super::{ServedAgent, Shared};
use crate::request::RunRequest;
use crate::types::{ApprovalDecision, History, Message};

/// The body of `POST /v1/agents/{name}/runs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunBody {
    /// The user's message.
    input: String,
    /// The thread the run belongs to.
    #[serde(default)]
    thread_id: Option<String>,
    /// The thread's earlier messages.
    #[serde(default)]
    history: Vec<Message>,
}

/// The body of `POST /v1/runs/{id}/resume`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResumeBody {
    /// A decision per waiting call.
    decisions: Vec<ApprovalDecision>,
    /// The checkpoint version read with the run; when given, a checkpoint
    /// that changed since is a conflict.
    #[serde(default)]
    version: Option<u64>,
}

fn wants_sse(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

pub(crate) async fn create_run(
    State(shared): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Json<RunBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    let agent = shared.agent(&name)?;
    let mut request = RunRequest::new(body.input).history(History::from(body.history));
    if let Some(thread) = body.thread_id {
        request.context = crate::RunContext::builder().thread_id(thread).build();
    }
    run_and_respond(&shared, &name, agent, request, &headers).await
}

pub(crate) async fn resume_run(
    State(shared): State<Shared>,
    Path(run_id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<ResumeBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    let version = match body.version {
        Some(version) => version,
        None => {
            let stored = shared.store.get(&run_id).await?;
            stored
                .ok_or_else(|| ApiError::not_found(format!("no paused run `{run_id}`")))?
                .version
        }
    };
    // The optimistic take: of two resumers, one gets the checkpoint.
    let checkpoint = shared.store.take(&run_id, version).await?;
    let name = checkpoint.agent.clone();
    let agent = match shared.agent(&name) {
        Ok(agent) => agent,
        Err(e) => {
            // Put it back, so a server that has the agent can resume it.
            shared.store.put(checkpoint).await?;
            return Err(e);
        }
    };
    let request = RunRequest::resume(checkpoint, body.decisions);
    run_and_respond(&shared, &name, agent, request, &headers).await
}

pub(crate) async fn get_run(
    State(shared): State<Shared>,
    Path(run_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if let Some(record) = shared.runs.get(&run_id) {
        return Ok(Json(serde_json::to_value(record).unwrap_or_default()));
    }
    // Paused by another server that shares the store.
    match shared.store.get(&run_id).await? {
        Some(stored) => Ok(Json(serde_json::json!({
            "run_id": run_id,
            "agent": stored.checkpoint.agent,
            "status": "paused",
            "pending": stored.checkpoint.pending,
            "version": stored.version,
        }))),
        None => Err(ApiError::not_found(format!("no run `{run_id}`"))),
    }
}

/// Starts `request` on `agent` and answers with the run: JSON, or SSE when
/// the client asked for it.
async fn run_and_respond(
    shared: &Shared,
    name: &str,
    agent: ServedAgent,
    request: RunRequest,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let sse = wants_sse(headers);
    let started = start(
        &shared.runs,
        shared.store.clone(),
        name,
        agent,
        request,
        sse,
    );
    respond(started, sse).await
}

async fn respond(started: Started, sse: bool) -> Result<Response, ApiError> {
    if sse {
        return Ok(Sse::new(sse_stream(started))
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let finished = started.outcome().await?;
    Ok(Json(run_body(&finished)).into_response())
}

/// The SSE frame of one run frame: `event:` the event's type (`delta` for
/// text, `run` for the final run, `error`), `data:` its JSON.
pub(crate) fn sse_event(frame: &Frame) -> Event {
    let (name, data) = match frame {
        Frame::Event(event) => {
            let data = serde_json::to_value(event).unwrap_or_default();
            let name = data
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("event")
                .to_owned();
            (name, data)
        }
        Frame::Delta(delta) => (
            "delta".to_owned(),
            serde_json::to_value(delta).unwrap_or_default(),
        ),
        Frame::Done(Ok(finished)) => ("run".to_owned(), run_body(finished)),
        Frame::Done(Err(error)) => (
            "error".to_owned(),
            serde_json::to_value(error).unwrap_or_default(),
        ),
    };
    Event::default().event(name).data(data.to_string())
}

/// The run's frames as SSE events, ending after the outcome. Dropping the
/// stream (the client went away) cancels the run.
fn sse_stream(started: Started) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold(Some(started), |state| async move {
        let mut started = state?;
        let frame = started.frames.recv().await?;
        let last = matches!(frame, Frame::Done(_));
        let event = sse_event(&frame);
        Some((Ok(event), (!last).then_some(started)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::AgentEvent;
    use crate::types::ModelDelta;

    #[test]
    fn sse_frames_are_typed_with_json_data() {
        let event = AgentEvent::ToolCallStarted {
            run_id: "r".into(),
            call_id: "c".into(),
            tool: "add".into(),
        };
        let framed = format!("{:?}", sse_event(&Frame::Event(event)));
        assert!(framed.contains("tool_call_started"), "{framed}");
        let framed = format!("{:?}", sse_event(&Frame::Delta(ModelDelta::text("hi"))));
        assert!(framed.contains("delta"), "{framed}");
        let framed = format!(
            "{:?}",
            sse_event(&Frame::Done(Err(ApiError::invalid("bad"))))
        );
        assert!(
            framed.contains("error") && framed.contains("INVALID_REQUEST"),
            "{framed}"
        );
    }

    #[test]
    fn the_accept_header_picks_sse() {
        let mut headers = HeaderMap::new();
        assert!(!wants_sse(&headers));
        headers.insert(header::ACCEPT, "text/event-stream".parse().unwrap());
        assert!(wants_sse(&headers));
    }
}
