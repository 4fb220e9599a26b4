//! `OpenAiChat` over real HTTP.
//!
//! The first tests run everywhere: a tiny local server (tests/support)
//! answers with recorded bodies. The `aimock_*` tests need the real protocol
//! mock of `scripts/peers/start.sh` (`@copilotkit/aimock`, fixtures in
//! `tests/fixtures/aimock/`) and are `#[ignore]`d so a plain `cargo test`
//! lists them as ignored; run them with `cargo test -- --ignored` once the
//! peers are up.
//!
//! The aimock runs go through a model stack of tower's own `Retry` (with a
//! small LLM-aware policy written here), `Timeout`, and a two-service
//! fallback written here; the crate's own retry and fallback layers can
//! replace them in `stack()` without touching the tests.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::json;
use tower::retry::{Policy, RetryLayer};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent::error::{find, kind_of, retry_after};
use tower_agent::service::openai::{BrokenResponse, OpenAiChat};
use tower_agent::service::{box_model, BoxModel};
use tower_agent::types::{FinishReason, Message, ModelDelta, ModelRequest, Role, ToolCall, Usage};
use tower_agent::{
    tool_sync, Agent, AgentError, AgentRun, BoxError, DeltaSink, ErrorKind, ModelCall, RunContext,
    RunRequest, ToolRouter,
};

use support::{Reply, TestServer};

// ---------------------------------------------------------------------------
// Against the local recorded server: no peers needed.

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

// ---------------------------------------------------------------------------
// Against aimock, through retry ▸ timeout ▸ fallback, in full agent runs.

/// What the retry policy saw, one entry per failed attempt.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    kind: ErrorKind,
    retry_after: Option<Duration>,
    deltas_sent: Option<usize>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// A small LLM-aware retry policy on tower's `Retry`: retryable kinds only,
/// honouring `Retry-After`, at most `retries` times, and (optionally) only
/// while no delta of the failed answer reached the sink.
#[derive(Clone)]
struct LlmRetry {
    retries: usize,
    before_first_delta: bool,
    log: Log,
}

impl Policy<ModelCall, tower_agent::types::ModelResponse, BoxError> for LlmRetry {
    type Future = BoxFuture<'static, ()>;

    fn retry(
        &mut self,
        _req: &mut ModelCall,
        result: &mut Result<tower_agent::types::ModelResponse, BoxError>,
    ) -> Option<Self::Future> {
        let err = result.as_ref().err()?;
        let seen = Seen {
            kind: kind_of(err.as_ref()),
            retry_after: retry_after(err.as_ref()),
            deltas_sent: find::<BrokenResponse>(err.as_ref()).map(BrokenResponse::deltas_sent),
        };
        self.log.lock().unwrap().push(seen.clone());
        let shown = seen.deltas_sent.unwrap_or(0) > 0;
        if !seen.kind.is_retryable() || self.retries == 0 || (self.before_first_delta && shown) {
            return None;
        }
        self.retries -= 1;
        let wait = seen
            .retry_after
            .unwrap_or(Duration::from_millis(20))
            .min(Duration::from_secs(2));
        Some(Box::pin(tokio::time::sleep(wait)))
    }

    fn clone_request(&mut self, req: &ModelCall) -> Option<ModelCall> {
        Some(req.clone())
    }
}

/// Calls `primary`; on a retryable failure, `backup`.
#[derive(Clone)]
struct Fallback {
    primary: BoxModel,
    backup: Option<BoxModel>,
}

impl Service<ModelCall> for Fallback {
    type Response = tower_agent::types::ModelResponse;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ModelCall) -> Self::Future {
        let primary = self.primary.clone();
        let backup = self.backup.clone();
        Box::pin(async move {
            match primary.oneshot(call.clone()).await {
                Err(err) if kind_of(err.as_ref()).is_retryable() => match backup {
                    Some(backup) => backup.oneshot(call).await,
                    None => Err(err),
                },
                other => other,
            }
        })
    }
}

fn aimock(model: &str, test_id: &str) -> OpenAiChat {
    OpenAiChat::builder(support::require_peer("AIMOCK_URL"))
        .api_key("sk-aimock-test")
        .model(model)
        .header("x-test-id", test_id)
        .build()
        .unwrap()
}

/// retry ▸ timeout ▸ fallback ▸ aimock.
fn stack(primary: OpenAiChat, backup: Option<OpenAiChat>, retry: LlmRetry) -> BoxModel {
    box_model(
        ServiceBuilder::new()
            .layer(RetryLayer::new(retry))
            .timeout(Duration::from_secs(2))
            .service(Fallback {
                primary: box_model(primary),
                backup: backup.map(box_model),
            }),
    )
}

fn retry(retries: usize) -> (LlmRetry, Log) {
    let log = Log::default();
    (
        LlmRetry {
            retries,
            before_first_delta: false,
            log: log.clone(),
        },
        log,
    )
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct City {
    city: String,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Booking {
    city: String,
    nights: u32,
}

fn agent(model: BoxModel) -> Agent {
    let tools = ToolRouter::new()
        .tool(tool_sync("weather", "The weather in a city", |c: City| {
            Ok::<_, BoxError>(format!("{}: sunny, 21C", c.city))
        }))
        .tool(tool_sync("book_hotel", "Books a hotel", |b: Booking| {
            Ok::<_, BoxError>(format!("booked {} nights in {}", b.nights, b.city))
        }));
    Agent::builder("planner")
        .instructions("You plan trips.")
        .model(model)
        .tools(tools)
        .build()
        .unwrap()
}

async fn run_agent(
    agent: &Agent,
    input: &str,
    streamed: bool,
) -> (Result<AgentRun, AgentError>, String) {
    let mut request = RunRequest::new(input);
    let (sink, mut rx) = DeltaSink::channel();
    if streamed {
        request = request.stream(sink);
    }
    let result = agent.clone().oneshot(request).await;
    let text: String = collect(&mut rx)
        .into_iter()
        .filter_map(|d| match d {
            ModelDelta::Text { text } => Some(text),
            _ => None,
        })
        .collect();
    (result, text)
}

fn tool_messages(run: &AgentRun) -> Vec<(String, String)> {
    run.messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| {
            (
                m.tool_call_id.clone().unwrap_or_default(),
                m.text().into_owned(),
            )
        })
        .collect()
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_multi_turn_tool_calls_streamed_and_not() {
    for streamed in [false, true] {
        let (policy, log) = retry(2);
        let model = stack(
            aimock("test-model", &support::unique("multi")),
            None,
            policy,
        );
        let (result, text) = run_agent(&agent(model), "Plan a night in Paris", streamed).await;
        let run = result.unwrap_or_else(|e| panic!("streamed={streamed}: {e}"));

        assert_eq!(
            run.output,
            "Booked one night in Paris; it will be sunny and 21C."
        );
        assert_eq!((run.counters.turns, run.counters.tool_calls), (3, 2));
        assert_eq!(
            tool_messages(&run),
            vec![
                ("call_weather".to_owned(), "Paris: sunny, 21C".to_owned()),
                (
                    "call_hotel".to_owned(),
                    "booked 1 nights in Paris".to_owned()
                ),
            ]
        );
        let assistant: Vec<&Message> = run
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .collect();
        assert_eq!(assistant.len(), 3);
        assert_eq!(assistant[1].text(), "Sunny there. ");
        assert_eq!(
            assistant[1].tool_calls[0].arguments,
            r#"{"city":"Paris","nights":1}"#
        );
        // The fixtures' usage, whether read from the body or the usage chunk.
        assert_eq!(run.usage, Usage::new(180, 36), "streamed={streamed}");
        assert!(log.lock().unwrap().is_empty());
        if streamed {
            assert_eq!(text, format!("Sunny there. {}", run.output));
        } else {
            assert!(text.is_empty());
        }
    }
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_parallel_tool_calls_streamed_and_not() {
    for streamed in [false, true] {
        let (policy, _log) = retry(1);
        let model = stack(
            aimock("test-model", &support::unique("parallel")),
            None,
            policy,
        );
        let (result, _) = run_agent(&agent(model), "Weather in Paris and Rome", streamed).await;
        let run = result.unwrap();
        assert_eq!(run.output, "Paris is sunny and 21C; Rome is sunny and 21C.");
        assert_eq!((run.counters.turns, run.counters.tool_calls), (2, 2));
        let calls = &run.messages[2].tool_calls;
        assert_eq!(
            calls.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
            ["call_paris", "call_rome"]
        );
        assert_eq!(
            tool_messages(&run),
            vec![
                ("call_paris".to_owned(), "Paris: sunny, 21C".to_owned()),
                ("call_rome".to_owned(), "Rome: sunny, 21C".to_owned()),
            ]
        );
        assert_eq!(run.usage, Usage::new(100, 35));
    }
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_a_429_is_retried_after_its_retry_after() {
    let (policy, log) = retry(2);
    let model = stack(aimock("test-model", &support::unique("429")), None, policy);
    let (result, _) = run_agent(&agent(model), "Rate limited once", false).await;
    assert_eq!(result.unwrap().output, "Answered after waiting.");
    assert_eq!(
        *log.lock().unwrap(),
        vec![Seen {
            kind: ErrorKind::RateLimited,
            retry_after: Some(Duration::from_secs(1)),
            deltas_sent: None
        }]
    );
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_insufficient_quota_is_not_retried() {
    let (policy, log) = retry(2);
    let model = stack(
        aimock("test-model", &support::unique("quota")),
        None,
        policy,
    );
    let (result, _) = run_agent(&agent(model), "Out of quota", false).await;
    let err = result.unwrap_err();
    assert_eq!(err.code(), "QUOTA_EXHAUSTED");
    assert_eq!(log.lock().unwrap().len(), 1, "tried once, not retried");
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_a_500_falls_back_to_the_backup_model() {
    let id = support::unique("fallback");
    let (policy, log) = retry(1);
    let model = stack(
        aimock("primary-model", &id),
        Some(aimock("backup-model", &id)),
        policy,
    );
    let (result, _) = run_agent(&agent(model), "Primary is down", false).await;
    let run = result.unwrap();
    assert_eq!(run.output, "Served by the backup.");
    let answers: Vec<String> = run
        .messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .map(|m| m.text().into_owned())
        .collect();
    assert_eq!(answers, ["Served by the backup."]);
    assert_eq!(run.usage, Usage::new(8, 4));
    assert!(
        log.lock().unwrap().is_empty(),
        "the fallback answered; no retry"
    );
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_chaos_500_and_disconnect_are_retried() {
    for (input, answer, kind) in [
        (
            "Dropped with a 500 once",
            "Answered on the second try.",
            ErrorKind::Unavailable,
        ),
        (
            "Disconnected once",
            "Connected again.",
            ErrorKind::Unavailable,
        ),
    ] {
        let (policy, log) = retry(2);
        let model = stack(
            aimock("test-model", &support::unique("chaos")),
            None,
            policy,
        );
        let (result, _) = run_agent(&agent(model), input, false).await;
        assert_eq!(result.unwrap().output, answer);
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 1, "{input}");
        assert_eq!(log[0].kind, kind, "{input}");
    }
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_malformed_json_is_unavailable_and_retried() {
    for streamed in [false, true] {
        let (policy, log) = retry(2);
        let model = stack(
            aimock("test-model", &support::unique("malformed")),
            None,
            policy,
        );
        let (result, _) = run_agent(&agent(model), "Malformed once", streamed).await;
        assert_eq!(result.unwrap().output, "Well-formed at last.");
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].kind, ErrorKind::Unavailable);
        assert_eq!(
            log[0].deltas_sent,
            Some(0),
            "a BrokenResponse, nothing shown"
        );
    }
    // Without a retry it reaches the caller as PROVIDER_UNAVAILABLE.
    let (policy, _log) = retry(0);
    let model = stack(
        aimock("test-model", &support::unique("malformed")),
        None,
        policy,
    );
    let (result, _) = run_agent(&agent(model), "Always malformed", false).await;
    assert_eq!(result.unwrap_err().code(), "PROVIDER_UNAVAILABLE");
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_a_dropped_stream_stays_out_of_the_transcript() {
    const ANSWER: &str =
        "The quick brown fox jumps over the lazy dog, then naps in the sun for a long while before dinner.";
    // A policy that retries even after deltas went out: the transcript still
    // holds only the complete answer; the sink saw the cut attempt's prefix.
    let (policy, log) = retry(2);
    let model = stack(aimock("test-model", &support::unique("cut")), None, policy);
    let (result, text) = run_agent(&agent(model), "Stream cut once", true).await;
    let run = result.unwrap();
    assert_eq!(run.output, ANSWER);
    let assistant: Vec<&Message> = run
        .messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .collect();
    assert_eq!(assistant.len(), 1);
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].kind, ErrorKind::Unavailable);
    let shown = log[0].deltas_sent.expect("a BrokenResponse");
    let prefix = text
        .strip_suffix(ANSWER)
        .expect("the full answer was streamed last");
    assert!(
        ANSWER.starts_with(prefix),
        "the cut attempt showed a prefix: {prefix:?}"
    );
    assert_eq!(prefix.is_empty(), shown == 0);

    // A policy that retries only before the first delta: when the cut
    // attempt had shown text, the run fails rather than repeat it.
    let (mut policy, log) = retry(2);
    policy.before_first_delta = true;
    let model = stack(aimock("test-model", &support::unique("cut")), None, policy);
    let (result, text) = run_agent(&agent(model), "Stream cut once", true).await;
    let shown = log.lock().unwrap()[0].deltas_sent.unwrap_or(0);
    match result {
        Err(err) => {
            assert!(shown > 0);
            assert_eq!(err.code(), "PROVIDER_UNAVAILABLE");
            assert!(ANSWER.starts_with(&text) && text.len() < ANSWER.len());
        }
        Ok(run) => {
            assert_eq!(shown, 0);
            assert_eq!(run.output, ANSWER);
        }
    }
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_a_slow_answer_times_out_and_is_retried() {
    let (policy, log) = retry(2);
    let model = stack(aimock("test-model", &support::unique("slow")), None, policy);
    let (result, _) = run_agent(&agent(model), "Slow once", false).await;
    assert_eq!(result.unwrap().output, "In time.");
    assert_eq!(log.lock().unwrap()[0].kind, ErrorKind::Timeout);
}
