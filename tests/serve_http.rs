//! The HTTP server end to end on ScriptedModel: JSON and SSE runs, pause and
//! resume through the checkpoint store, errors as JSON with mapped statuses,
//! malformed bodies, a client that disconnects, graceful shutdown, and the
//! OpenAI-compatible endpoint's shapes.
#![cfg(feature = "server")]

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use serde_json::{json, Value};
use tower::{Layer, ServiceExt};
use tower_agent::hooks::{ToolDecision, ToolVerdict};
use tower_agent::lifecycle::{Hook, LifecycleLayer, Middleware, MiddlewareStack};
use tower_agent::serve::AgentServer;
use tower_agent::types::ToolCall;
use tower_agent::{
    tool_sync, Agent, BoxError, RunContext, ScriptedModel, ScriptedTurn, ToolRouter,
};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Sum {
    a: i64,
    b: i64,
}

fn tools() -> ToolRouter {
    ToolRouter::new()
        .tool(tool_sync("add", "Adds", |s: Sum| {
            Ok::<_, BoxError>(s.a + s.b)
        }))
        .tool(tool_sync("pay", "Pays", |s: Sum| {
            Ok::<_, BoxError>(format!("paid {}", s.a))
        }))
}

/// Defers every call of `pay`: the run pauses for a person.
struct DeferPay;

impl Middleware for DeferPay {
    fn name(&self) -> &str {
        "defer-pay"
    }

    fn before_tool<'a>(
        &'a self,
        _: &'a RunContext,
        call: &'a ToolCall,
        resumed: bool,
    ) -> Hook<'a, ToolVerdict> {
        if call.name == "pay" && !resumed {
            Hook::ok(ToolVerdict::decision(ToolDecision::Defer))
        } else {
            Hook::ok(ToolVerdict::proceed())
        }
    }
}

fn server() -> AgentServer {
    let calc = Agent::builder("calc")
        .model(ScriptedModel::from_fn(|req| {
            if req
                .messages
                .iter()
                .any(|m| m.role == tower_agent::types::Role::Tool)
            {
                ScriptedTurn::text("2 + 3 = 5")
            } else {
                ScriptedTurn::tool_call("add", r#"{"a": 2, "b": 3}"#)
            }
        }))
        .tools(tools())
        .build()
        .unwrap();
    let payer = LifecycleLayer::new(MiddlewareStack::new().push(DeferPay)).layer(
        Agent::builder("payer")
            .model(ScriptedModel::from_fn(|req| {
                match req.messages.last().map(|m| m.text().into_owned()) {
                    Some(t) if t.starts_with("paid") => ScriptedTurn::text("payment sent"),
                    Some(t) if t.contains("declined") => ScriptedTurn::text("payment declined"),
                    _ => ScriptedTurn::tool_call("pay", r#"{"a": 30, "b": 0}"#),
                }
            }))
            .tools(tools())
            .build()
            .unwrap(),
    );
    let limited = Agent::builder("limited")
        .model(ScriptedModel::from_fn(|_| {
            ScriptedTurn::rate_limited(Duration::from_millis(2500))
        }))
        .build()
        .unwrap();
    let slow = Agent::builder("slow")
        .model(ScriptedModel::from_fn(|_| {
            ScriptedTurn::text("late").delay(Duration::from_secs(30))
        }))
        .build()
        .unwrap();
    AgentServer::new()
        .agent("calc", calc)
        .agent("payer", payer)
        .agent("limited", limited)
        .agent("slow", slow)
}

async fn post(
    app: &axum::Router,
    path: &str,
    body: &str,
    sse: bool,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let mut request = Request::post(path).header(header::CONTENT_TYPE, "application/json");
    if sse {
        request = request.header(header::ACCEPT, "text/event-stream");
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 22)
        .await
        .unwrap();
    (status, headers, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn get(app: &axum::Router, path: &str) -> (StatusCode, String) {
    let response = app
        .clone()
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 22)
        .await
        .unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn a_json_run_answers_the_run() {
    let app = server().router();
    let (status, _, body) = post(
        &app,
        "/v1/agents/calc/runs",
        r#"{"input": "2+3?", "thread_id": "t1"}"#,
        false,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let run: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(run["status"], "completed");
    assert_eq!(run["output"], "2 + 3 = 5");
    assert_eq!(run["counters"]["tool_calls"], 1);
    let id = run["run_id"].as_str().unwrap();
    let (status, body) = get(&app, &format!("/v1/runs/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    let record: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(record["status"], "completed");
    assert_eq!(record["output"], "2 + 3 = 5");
}

#[tokio::test]
async fn an_sse_run_streams_typed_events_and_ends_with_the_run() {
    let app = server().router();
    let (status, headers, body) =
        post(&app, "/v1/agents/calc/runs", r#"{"input": "2+3?"}"#, true).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events: Vec<(&str, Value)> = body
        .split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|frame| {
            let name = frame
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap();
            let data = frame
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap();
            (name, serde_json::from_str(data).unwrap())
        })
        .collect();
    let names: Vec<&str> = events.iter().map(|(n, _)| *n).collect();
    assert_eq!(names.first(), Some(&"run_started"));
    assert!(names.contains(&"model_call_started"));
    assert!(names.contains(&"tool_call_completed"));
    assert!(names.contains(&"delta"), "text deltas stream: {names:?}");
    assert_eq!(
        names.iter().filter(|n| **n == "run_started").count(),
        names.iter().filter(|n| **n == "run_completed").count()
    );
    let (last, run) = events.last().unwrap();
    assert_eq!(*last, "run");
    assert_eq!(run["output"], "2 + 3 = 5");
    let text: String = events
        .iter()
        .filter(|(n, _)| *n == "delta")
        .filter_map(|(_, d)| d["text"].as_str())
        .collect();
    assert_eq!(text, "2 + 3 = 5");
}

#[tokio::test]
async fn a_paused_run_resumes_once_with_its_decisions() {
    let app = server().router();
    let (status, _, body) = post(&app, "/v1/agents/payer/runs", r#"{"input": "pay"}"#, false).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let run: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(run["status"], "paused");
    let id = run["checkpoint"]["id"].as_str().unwrap().to_owned();
    let version = run["checkpoint"]["version"].as_u64().unwrap();
    let call_id = run["checkpoint"]["pending"][0]["call"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let hash = run["checkpoint"]["pending"][0]["arguments_hash"]
        .as_str()
        .unwrap()
        .to_owned();

    let (status, body) = get(&app, &format!("/v1/runs/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["status"],
        "paused"
    );

    // A stale version is a conflict and leaves the run paused.
    let stale =
        json!({"decisions": [{"call_id": call_id, "approved": true}], "version": version + 7})
            .to_string();
    let (status, _, body) = post(&app, &format!("/v1/runs/{id}/resume"), &stale, false).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    let resume = json!({"decisions": [{"call_id": call_id, "arguments_hash": hash, "approved": true}], "version": version}).to_string();
    let (status, _, body) = post(&app, &format!("/v1/runs/{id}/resume"), &resume, false).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let resumed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(resumed["status"], "completed");
    assert_eq!(resumed["output"], "payment sent");
    assert_eq!(resumed["run_id"], id.as_str());

    // The checkpoint was taken: a second resumer finds nothing.
    let (status, _, body) = post(&app, &format!("/v1/runs/{id}/resume"), &resume, false).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

#[tokio::test]
async fn two_concurrent_resumers_never_both_resume() {
    let app = server().router();
    let (_, _, body) = post(&app, "/v1/agents/payer/runs", r#"{"input": "pay"}"#, false).await;
    let run: Value = serde_json::from_str(&body).unwrap();
    let id = run["checkpoint"]["id"].as_str().unwrap().to_owned();
    let call_id = run["checkpoint"]["pending"][0]["call"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let resume =
        json!({"decisions": [{"call_id": call_id, "approved": false, "reason": "no"}]}).to_string();
    let path = format!("/v1/runs/{id}/resume");
    let (a, b) = tokio::join!(
        post(&app, &path, &resume, false),
        post(&app, &path, &resume, false)
    );
    let statuses = [a.0, b.0];
    assert_eq!(
        statuses.iter().filter(|s| **s == StatusCode::OK).count(),
        1,
        "{statuses:?}"
    );
    assert!(statuses
        .iter()
        .any(|s| *s == StatusCode::NOT_FOUND || *s == StatusCode::CONFLICT));
    let winner = if a.0 == StatusCode::OK { a.2 } else { b.2 };
    assert_eq!(
        serde_json::from_str::<Value>(&winner).unwrap()["output"],
        "payment declined"
    );
}

#[tokio::test]
async fn errors_are_json_with_mapped_statuses_and_malformed_bodies_are_400() {
    let app = server().router();
    let (status, headers, body) =
        post(&app, "/v1/agents/limited/runs", r#"{"input": "x"}"#, false).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(headers[header::RETRY_AFTER], "3");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["code"], "RATE_LIMITED");
    assert!(error["message"].is_string());

    for bad in ["{", r#"{"input": 7}"#, r#"{"text": "hi"}"#, ""] {
        let (status, _, body) = post(&app, "/v1/agents/calc/runs", bad, false).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}: {body}");
        let error: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(error["code"], "INVALID_REQUEST");
        assert!(!error["message"].as_str().unwrap().is_empty());
    }
    let (status, _, body) = post(&app, "/v1/agents/nobody/runs", r#"{"input": "x"}"#, false).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("calc"), "names the agents: {body}");
    let (status, _) = get(&app, "/v1/runs/no-such-run").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn chat_completions_answer_in_the_openai_shape() {
    let app = server().router();
    let body =
        json!({"model": "calc", "messages": [{"role": "user", "content": "2+3?"}]}).to_string();
    let (status, _, body) = post(&app, "/v1/chat/completions", &body, false).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let completion: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(completion["object"], "chat.completion");
    assert_eq!(completion["choices"][0]["message"]["content"], "2 + 3 = 5");
    assert_eq!(completion["choices"][0]["finish_reason"], "stop");

    let stream = json!({"model": "calc", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "2+3?"}]})
    .to_string();
    let (status, _, body) = post(&app, "/v1/chat/completions", &stream, false).await;
    assert_eq!(status, StatusCode::OK);
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "2 + 3 = 5");
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "stop"));
    assert!(chunks.last().unwrap()["usage"]["total_tokens"].is_u64());

    let bad = json!({"model": "calc", "messages": []}).to_string();
    assert_eq!(
        post(&app, "/v1/chat/completions", &bad, false).await.0,
        StatusCode::BAD_REQUEST
    );
}

/// A real socket: the client goes away mid-run, and the run is cancelled.
#[tokio::test]
async fn a_client_that_disconnects_cancels_its_run_and_shutdown_waits_for_a_deadline() {
    let server = server();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = {
        let server = server.clone();
        tokio::spawn(async move {
            server
                .serve(
                    listener,
                    server.router(),
                    async {
                        let _ = stop_rx.await;
                    },
                    Duration::from_millis(300),
                )
                .await
        })
    };

    // A raw HTTP/1.1 client that sends a run of the slow agent and hangs up.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = r#"{"input": "wait"}"#;
    let request = format!(
        "POST /v1/agents/slow/runs HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\naccept: text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut buf = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let head = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(server.runs_in_flight(), 1);
    drop(socket);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.runs_in_flight() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run was not cancelled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Shutdown: a run still going after the grace period is cancelled and
    // answered; then the server returns.
    let client = tokio::spawn(async move {
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "POST /v1/agents/slow/runs HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        socket.read_to_string(&mut answer).await.unwrap();
        answer
    });
    while server.runs_in_flight() == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop_tx.send(()).unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), client)
        .await
        .unwrap()
        .unwrap();
    assert!(answer.contains("CANCELLED"), "{answer}");
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
