//! `OpenAiChat` over real HTTP against a tiny local server (tests/support)
//! that answers with recorded chat-completions bodies: the request it sends,
//! streaming, error statuses, timeouts. Needs no peers.
#![cfg(feature = "openai")]

mod support;

use std::time::Duration;

use serde_json::json;
use tower::ServiceExt;
use tower_agent::error::{find, kind_of, retry_after, TimeoutSource};
use tower_agent::service::openai::{BrokenResponse, OpenAiChat};
use tower_agent::types::{FinishReason, Message, ModelDelta, ModelRequest, ToolCall, Usage};
use tower_agent::{AgentError, DeltaSink, ErrorKind, ModelCall, RunContext};

use support::{Reply, TestServer};

fn call(text: &str) -> ModelCall {
    ModelCall::new(
        ModelRequest::new("", vec![Message::user(text)]),
        RunContext::new(),
    )
}

fn completion(text: &str) -> String {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-test-2025",
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
            "prompt_tokens_details": {"cached_tokens": 8},
            "completion_tokens_details": {"reasoning_tokens": 1}}
    })
    .to_string()
}

#[tokio::test]
async fn posts_the_request_and_records_the_usage() {
    let server = TestServer::start(vec![Reply::json(200, completion("hello"))]).await;
    let chat = OpenAiChat::builder(format!("{}/v1/", server.url))
        .api_key("sk-test")
        .model("gpt-test")
        .header("OpenAI-Organization", "org-1")
        .build()
        .unwrap();
    let call = call("hi");
    let ctx = call.context.clone();
    let response = chat.oneshot(call).await.unwrap();

    assert_eq!(response.message.text(), "hello");
    assert_eq!(response.model, "gpt-test-2025");
    assert_eq!(response.finish_reason, FinishReason::Stop);
    let usage = Usage {
        input_tokens: 12,
        output_tokens: 3,
        cached_input_tokens: 8,
        reasoning_tokens: 1,
    };
    assert_eq!(response.usage, usage);
    assert!(response.usage_recorded);
    assert_eq!(ctx.usage(), usage);
    assert_eq!(ctx.usage_entries()[0].model, "gpt-test-2025");

    let sent = &server.received()[0];
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(sent.header("authorization"), Some("Bearer sk-test"));
    assert_eq!(sent.header("openai-organization"), Some("org-1"));
    assert_eq!(sent.header("content-type"), Some("application/json"));
    assert_eq!(
        sent.json(),
        json!({"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]})
    );
}

const STREAM: &str = concat!(
    "data: {\"model\":\"gpt-test-2025\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\"\"}}]}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":9}}\n\n",
    "data: [DONE]\n\n",
);

/// `STREAM` cut into uneven pieces, some inside a line.
fn stream_chunks(stream: &str) -> Vec<Vec<u8>> {
    stream.as_bytes().chunks(37).map(<[u8]>::to_vec).collect()
}

fn collect(rx: &mut tokio::sync::mpsc::UnboundedReceiver<ModelDelta>) -> Vec<ModelDelta> {
    let mut deltas = Vec::new();
    while let Ok(delta) = rx.try_recv() {
        deltas.push(delta);
    }
    deltas
}

#[tokio::test]
async fn streams_deltas_and_reads_the_usage_chunk() {
    let server = TestServer::start(vec![Reply::sse(stream_chunks(STREAM))]).await;
    let chat = OpenAiChat::builder(&server.url).build().unwrap();
    let (sink, mut rx) = DeltaSink::channel();
    let mut call = call("hi");
    call.stream = Some(sink);
    let ctx = call.context.clone();
    let response = chat.oneshot(call).await.unwrap();

    assert_eq!(response.message.text(), "Hello");
    assert_eq!(
        response.message.tool_calls,
        vec![ToolCall::new("call_1", "f", r#"{"a":1}"#)]
    );
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    assert_eq!(ctx.usage(), Usage::new(20, 9));
    let deltas = collect(&mut rx);
    assert_eq!(
        deltas[..2],
        [ModelDelta::text("Hel"), ModelDelta::text("lo")]
    );
    assert_eq!(deltas.len(), 4);

    let sent = &server.received()[0];
    assert_eq!(sent.path, "/chat/completions");
    assert_eq!(sent.header("accept"), Some("text/event-stream"));
    let body = sent.json();
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
}

#[tokio::test]
async fn a_server_that_ignores_stream_is_read_whole() {
    let server = TestServer::start(vec![Reply::json(200, completion("whole"))]).await;
    let chat = OpenAiChat::builder(&server.url).build().unwrap();
    let (sink, mut rx) = DeltaSink::channel();
    let mut call = call("hi");
    call.stream = Some(sink);
    let response = chat.oneshot(call).await.unwrap();
    assert_eq!(response.message.text(), "whole");
    assert_eq!(collect(&mut rx), vec![ModelDelta::text("whole")]);
}

#[tokio::test]
async fn a_truncated_stream_fails_and_keeps_the_usage_it_saw() {
    let cut = STREAM.replace("data: [DONE]\n\n", "");
    let server = TestServer::start(vec![Reply::sse(stream_chunks(&cut))]).await;
    let chat = OpenAiChat::builder(&server.url).build().unwrap();
    let (sink, mut rx) = DeltaSink::channel();
    let mut call = call("hi");
    call.stream = Some(sink);
    let ctx = call.context.clone();
    let err = chat.oneshot(call).await.unwrap_err();

    assert_eq!(kind_of(err.as_ref()), ErrorKind::Unavailable);
    let broken = find::<BrokenResponse>(err.as_ref()).expect("a BrokenResponse source");
    assert_eq!(broken.deltas_sent(), collect(&mut rx).len());
    assert_eq!(broken.deltas_sent(), 4);
    // The provider reported (and billed) the usage before the cut.
    assert_eq!(ctx.usage(), Usage::new(20, 9));
}

#[tokio::test]
async fn maps_error_statuses_with_retry_after() {
    let error = |kind: &str, code: &str, message: &str| {
        json!({"error": {"message": message, "type": kind, "code": code}}).to_string()
    };
    let script = vec![
        Reply::json(429, error("requests", "rate_limit_exceeded", "slow down"))
            .header("retry-after", "2"),
        Reply::json(
            429,
            error("insufficient_quota", "insufficient_quota", "no credit"),
        ),
        Reply::json(
            400,
            error(
                "invalid_request_error",
                "context_length_exceeded",
                "too long",
            ),
        ),
        Reply::json(
            400,
            error("invalid_request_error", "invalid_value", "bad temperature"),
        ),
        Reply::json(
            401,
            error("invalid_request_error", "invalid_api_key", "bad key"),
        ),
        Reply::json(503, "upstream connect error").header("retry-after-ms", "1500"),
        Reply::json(200, "{\"choices\": [oops"),
    ];
    let expected = [
        (ErrorKind::RateLimited, Some(Duration::from_secs(2))),
        (ErrorKind::QuotaExhausted, None),
        (ErrorKind::ContextLength, None),
        (ErrorKind::InvalidRequest, None),
        (ErrorKind::Auth, None),
        (ErrorKind::Unavailable, Some(Duration::from_millis(1500))),
        (ErrorKind::Unavailable, None),
    ];
    let server = TestServer::start(script).await;
    let chat = OpenAiChat::builder(&server.url).build().unwrap();
    for (kind, after) in expected {
        let err = chat.clone().oneshot(call("hi")).await.unwrap_err();
        assert_eq!(kind_of(err.as_ref()), kind, "{err}");
        assert_eq!(retry_after(err.as_ref()), after, "{err}");
        let agent_err = AgentError::classify(err);
        assert_eq!(agent_err.code(), kind.code());
    }
}

#[tokio::test]
async fn a_refused_connection_is_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let chat = OpenAiChat::builder(url).build().unwrap();
    let err = chat.oneshot(call("hi")).await.unwrap_err();
    assert_eq!(kind_of(err.as_ref()), ErrorKind::Unavailable);
}

#[tokio::test(start_paused = true)]
async fn a_stalled_server_times_out_at_the_shorter_of_timeout_and_deadline() {
    let server = TestServer::start(vec![Reply::stall(), Reply::stall()]).await;
    let chat = OpenAiChat::builder(&server.url)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let err = chat.clone().oneshot(call("hi")).await.unwrap_err();
    assert_eq!(kind_of(err.as_ref()), ErrorKind::Timeout);

    // A run deadline shorter than the service's timeout wins.
    let ctx = RunContext::builder()
        .timeout(Duration::from_secs(2))
        .build();
    let started = tokio::time::Instant::now();
    let call = ModelCall::new(ModelRequest::new("m", vec![Message::user("hi")]), ctx);
    let err = chat.oneshot(call).await.unwrap_err();
    assert_eq!(kind_of(err.as_ref()), ErrorKind::Timeout);
    assert!(started.elapsed() < Duration::from_secs(30));
    // It says so: the run's deadline fired, after the run's 2 s.
    assert_eq!(
        AgentError::classify(err).timeout_source(),
        Some((TimeoutSource::RunDeadline, Some(Duration::from_secs(2))))
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_that_stops_coming_times_out_naming_the_time_allowed() {
    let first = STREAM
        .split_inclusive("\n\n")
        .next()
        .unwrap()
        .as_bytes()
        .to_vec();
    let server = TestServer::start(vec![
        Reply::sse(vec![first]).then_stall(),
        Reply::json(200, &br#"{"id": "chatcmpl-1", "choices": ["#[..]).then_stall(),
    ])
    .await;
    let chat = OpenAiChat::builder(&server.url)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();

    // A stream that stops after its first delta.
    let (sink, mut rx) = DeltaSink::channel();
    let mut streamed = call("hi");
    streamed.stream = Some(sink);
    let err = AgentError::classify(chat.clone().oneshot(streamed).await.unwrap_err());
    assert_eq!(
        err.timeout_source(),
        Some((TimeoutSource::Provider, Some(Duration::from_secs(30))))
    );
    assert_eq!(collect(&mut rx), vec![ModelDelta::text("Hel")]);

    // A whole body that stops half way.
    let err = AgentError::classify(chat.oneshot(call("hi")).await.unwrap_err());
    assert_eq!(
        err.timeout_source(),
        Some((TimeoutSource::Provider, Some(Duration::from_secs(30))))
    );
}

#[test]
fn from_env_reads_the_three_variables() {
    // The only test of this binary that touches OPENAI_*.
    std::env::remove_var("OPENAI_BASE_URL");
    assert!(OpenAiChat::from_env().is_none());
    std::env::set_var("OPENAI_BASE_URL", "http://127.0.0.1:9/v1");
    std::env::set_var("OPENAI_MODEL", "env-model");
    let chat = OpenAiChat::from_env().unwrap().unwrap();
    assert_eq!(chat.url(), "http://127.0.0.1:9/v1/chat/completions");
    assert_eq!(chat.default_model(), "env-model");
    std::env::set_var("OPENAI_BASE_URL", "not a url");
    assert!(matches!(
        OpenAiChat::from_env(),
        Some(Err(AgentError::Config(_)))
    ));
    std::env::remove_var("OPENAI_BASE_URL");
    std::env::remove_var("OPENAI_MODEL");
}
