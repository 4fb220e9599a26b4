//! `OpenAiChat` against the real protocol mock of `scripts/peers/start.sh`
//! (`@copilotkit/aimock`, fixtures in `tests/fixtures/aimock/`), in full
//! agent runs. The tests are `#[ignore]`d so a plain `cargo test` lists them
//! as ignored; run them with `cargo test -- --ignored` once the peers are up
//! (they fail, loudly, when `AIMOCK_URL` is missing).
//!
//! The model stack is retry ▸ timeout ▸ fallback ▸ aimock, built from
//! tower's own `Retry` (with a small LLM-aware policy written here),
//! `Timeout`, and a two-service fallback written here; the crate's own retry
//! and fallback layers can replace them in `stack()` without touching the
//! tests.
#![cfg(feature = "openai")]

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use tower::retry::{Policy, RetryLayer};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent::error::{find, kind_of, retry_after};
use tower_agent::service::openai::{BrokenResponse, OpenAiChat};
use tower_agent::service::{box_model, BoxModel};
use tower_agent::types::{Message, ModelDelta, ModelResponse, Role, Usage};
use tower_agent::{
    tool_sync, Agent, AgentError, AgentRun, BoxError, DeltaSink, ErrorKind, ModelCall, RunRequest,
    ToolRouter,
};

fn collect(rx: &mut tokio::sync::mpsc::UnboundedReceiver<ModelDelta>) -> Vec<ModelDelta> {
    let mut deltas = Vec::new();
    while let Ok(delta) = rx.try_recv() {
        deltas.push(delta);
    }
    deltas
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

impl Policy<ModelCall, ModelResponse, BoxError> for LlmRetry {
    type Future = BoxFuture<'static, ()>;

    fn retry(
        &mut self,
        _req: &mut ModelCall,
        result: &mut Result<ModelResponse, BoxError>,
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
    type Response = ModelResponse;
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
