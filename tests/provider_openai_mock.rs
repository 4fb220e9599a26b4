//! `OpenAiChat` against the real protocol mock of `scripts/peers/start.sh`
//! (`@copilotkit/aimock`, fixtures in `tests/fixtures/aimock/`), in full
//! agent runs. The tests are `#[ignore]`d so a plain `cargo test` lists them
//! as ignored; run them with `cargo test -- --ignored` once the peers are up
//! (they fail, loudly, when `AIMOCK_URL` is missing).
//!
//! The model stack is the crate's own, retry ▸ timeout ▸ fallback ▸ aimock
//! (`stack()`), built with `ServiceBuilderExt`:
//!
//! - `layers::retry::RetryLayer` with a `RetryPolicy`: a few attempts, a
//!   fixed 20 ms `Backoff` without jitter, a `Retry-After` honoured up to
//!   2 s; it retries a streamed call only while none of its deltas reached
//!   the caller (its stream guard);
//! - `layers::timeout::TimeoutLayer`, 2 s per attempt;
//! - `layers::fallback::FallbackLayer`, to a second model on the same aimock
//!   (`FallbackLayer::models`) or to a second `OpenAiChat`
//!   (`FallbackLayer::service_as`); without targets it passes calls through.
//!
//! What the layers did is read from what the crate exposes: the
//! `AgentEvent::RetryAttempt` and `AgentEvent::FallbackUsed` events of a
//! `CollectingSink` on the run's context, the run's usage ledger
//! (`RunContext::usage_entries`), and the final error (its code, and the
//! `BrokenResponse` in its source chain).
#![cfg(feature = "openai")]

mod support;

use std::time::Duration;

use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_agent::context::UsageEntry;
use tower_agent::error::{find, kind_of};
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::layers::fallback::FallbackLayer;
use tower_agent::layers::retry::{Backoff, Jitter, RetryPolicy};
use tower_agent::layers::ServiceBuilderExt;
use tower_agent::lifecycle::{LifecycleLayer, Middleware, MiddlewareStack};
use tower_agent::service::openai::{BrokenResponse, OpenAiChat};
use tower_agent::service::{box_model, BoxModel};
use tower_agent::types::{Message, ModelDelta, Role, Usage};
use tower_agent::{
    tool_sync, Agent, AgentError, AgentRun, BoxError, DeltaSink, ErrorKind, RunContext, RunRequest,
    ToolRouter,
};

/// The wait between attempts when the provider names none.
const BACKOFF: Duration = Duration::from_millis(20);
/// Each attempt's timeout (the "slow" fixture answers after 3 s).
const TIMEOUT: Duration = Duration::from_secs(2);

fn aimock(model: &str, test_id: &str) -> OpenAiChat {
    OpenAiChat::builder(support::require_peer("AIMOCK_URL"))
        .api_key("sk-aimock-test")
        .model(model)
        .header("x-test-id", test_id)
        .build()
        .unwrap()
}

/// At most `attempts` calls, [`BACKOFF`] apart unless the provider says how
/// long to wait (up to 2 s).
fn policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::new()
        .max_attempts(attempts)
        .backoff(Backoff::new(BACKOFF, BACKOFF).jitter(Jitter::None))
        .max_retry_after(Duration::from_secs(2))
}

/// retry ▸ timeout ▸ fallback ▸ aimock, from the crate's layers.
fn stack(chat: OpenAiChat, attempts: u32, fallback: FallbackLayer<OpenAiChat>) -> BoxModel {
    box_model(
        ServiceBuilder::new()
            .llm_retry(policy(attempts))
            .call_timeout(TIMEOUT)
            .fallback(fallback)
            .service(chat),
    )
}

/// [`stack`] with no fallback target.
fn retrying(chat: OpenAiChat, attempts: u32) -> BoxModel {
    stack(chat, attempts, FallbackLayer::new())
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

/// A run and what it showed of itself.
struct Observed {
    result: Result<AgentRun, AgentError>,
    /// The text deltas that reached the caller's sink, joined.
    streamed: String,
    /// How many text deltas reached it.
    pieces: usize,
    events: Vec<AgentEvent>,
    /// The run's usage ledger: one entry per call that reached aimock and
    /// was billed.
    ledger: Vec<UsageEntry>,
}

impl Observed {
    fn run(&self) -> &AgentRun {
        match &self.result {
            Ok(run) => run,
            Err(err) => panic!("the run failed: {err}"),
        }
    }

    fn err(&self) -> &AgentError {
        match &self.result {
            Ok(run) => panic!("the run succeeded: {:?}", run.output),
            Err(err) => err,
        }
    }

    /// `(attempt, code, delay)` of every `RetryAttempt` event.
    fn retries(&self) -> Vec<(u32, &'static str, Duration)> {
        self.events
            .iter()
            .filter_map(|e| match e {
                AgentEvent::RetryAttempt {
                    attempt,
                    code,
                    delay,
                    ..
                } => Some((*attempt, *code, *delay)),
                _ => None,
            })
            .collect()
    }

    /// `(from, to, code)` of every `FallbackUsed` event.
    fn fallbacks(&self) -> Vec<(String, String, &'static str)> {
        self.events
            .iter()
            .filter_map(|e| match e {
                AgentEvent::FallbackUsed { from, to, code, .. } => {
                    Some((from.to_string(), to.to_string(), *code))
                }
                _ => None,
            })
            .collect()
    }

    /// `(model, usage)` of every ledger entry.
    fn billed(&self) -> Vec<(String, Usage)> {
        self.ledger
            .iter()
            .map(|e| (e.model.to_string(), e.usage))
            .collect()
    }
}

/// Runs `input` through `service` in a context collecting its events,
/// streamed to a sink or not.
async fn observe<S>(service: S, input: &str, streamed: bool) -> Observed
where
    S: Service<RunRequest, Response = AgentRun>,
    S::Error: Into<BoxError>,
{
    let events = CollectingSink::new();
    let ctx = RunContext::builder().events(events.clone()).build();
    let mut request = RunRequest::new(input).context(ctx.clone());
    let (sink, mut rx) = DeltaSink::channel();
    if streamed {
        request = request.stream(sink);
    }
    let result = service
        .oneshot(request)
        .await
        .map_err(|e| AgentError::classify(e.into()));
    let mut text = Vec::new();
    while let Ok(delta) = rx.try_recv() {
        if let ModelDelta::Text { text: piece } = delta {
            text.push(piece);
        }
    }
    Observed {
        result,
        streamed: text.concat(),
        pieces: text.len(),
        events: events.events(),
        ledger: ctx.usage_entries(),
    }
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

fn assistant_texts(run: &AgentRun) -> Vec<String> {
    run.messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .map(|m| m.text().into_owned())
        .collect()
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_multi_turn_tool_calls_streamed_and_not() {
    for streamed in [false, true] {
        let model = retrying(aimock("test-model", &support::unique("multi")), 3);
        let seen = observe(agent(model), "Plan a night in Paris", streamed).await;
        let run = seen.run();

        assert_eq!(
            run.output,
            "Booked one night in Paris; it will be sunny and 21C."
        );
        assert_eq!((run.counters.turns, run.counters.tool_calls), (3, 2));
        assert_eq!(
            tool_messages(run),
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
        // The fixtures' usage, whether read from the body or the usage
        // chunk: one ledger entry per turn, summing to the run's usage.
        assert_eq!(run.usage, Usage::new(180, 36), "streamed={streamed}");
        assert_eq!(
            seen.ledger.iter().map(|e| e.usage).collect::<Vec<_>>(),
            [Usage::new(40, 10), Usage::new(60, 12), Usage::new(80, 14)],
            "streamed={streamed}"
        );
        assert_eq!(seen.retries(), [], "streamed={streamed}");
        assert_eq!(seen.fallbacks(), [], "streamed={streamed}");
        if streamed {
            assert_eq!(seen.streamed, format!("Sunny there. {}", run.output));
        } else {
            assert!(seen.streamed.is_empty());
        }
    }
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_parallel_tool_calls_streamed_and_not() {
    for streamed in [false, true] {
        let model = retrying(aimock("test-model", &support::unique("parallel")), 2);
        let seen = observe(agent(model), "Weather in Paris and Rome", streamed).await;
        let run = seen.run();
        assert_eq!(run.output, "Paris is sunny and 21C; Rome is sunny and 21C.");
        assert_eq!((run.counters.turns, run.counters.tool_calls), (2, 2));
        let calls = &run.messages[2].tool_calls;
        assert_eq!(
            calls.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
            ["call_paris", "call_rome"]
        );
        assert_eq!(
            tool_messages(run),
            vec![
                ("call_paris".to_owned(), "Paris: sunny, 21C".to_owned()),
                ("call_rome".to_owned(), "Rome: sunny, 21C".to_owned()),
            ]
        );
        assert_eq!(run.usage, Usage::new(100, 35));
        assert_eq!(seen.ledger.len(), 2, "streamed={streamed}");
        assert_eq!(seen.retries(), [], "streamed={streamed}");
    }
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_a_429_is_retried_after_its_retry_after() {
    let model = retrying(aimock("test-model", &support::unique("429")), 3);
    let seen = observe(agent(model), "Rate limited once", false).await;
    assert_eq!(seen.run().output, "Answered after waiting.");
    // One retry, after the 429's `Retry-After: 1` rather than the backoff.
    assert_eq!(
        seen.retries(),
        [(1, "RATE_LIMITED", Duration::from_secs(1))]
    );
    // The 429 was not billed: the ledger holds the answer only.
    assert_eq!(seen.billed(), [("test-model".to_owned(), Usage::new(9, 4))]);
    assert_eq!(seen.run().usage, Usage::new(9, 4));
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_insufficient_quota_is_not_retried() {
    let model = retrying(aimock("test-model", &support::unique("quota")), 3);
    let seen = observe(agent(model), "Out of quota", false).await;
    let err = seen.err();
    assert_eq!(err.code(), "QUOTA_EXHAUSTED");
    assert_eq!(kind_of(err), ErrorKind::QuotaExhausted);
    assert_eq!(seen.retries(), [], "tried once, not retried");
    assert_eq!(seen.fallbacks(), []);
    assert_eq!(seen.ledger, []);
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_a_500_falls_back_to_the_backup_model() {
    // The backup as another model of the same aimock, and as a second
    // `OpenAiChat`.
    for second_service in [false, true] {
        let id = support::unique("fallback");
        let fallback = if second_service {
            FallbackLayer::new().service_as("backup-model", aimock("backup-model", &id))
        } else {
            FallbackLayer::new().models(["backup-model"])
        };
        let model = stack(aimock("primary-model", &id), 2, fallback);
        let agent = Agent::builder("planner")
            .model(model)
            .model_name("primary-model")
            .build()
            .unwrap();
        let seen = observe(agent, "Primary is down", false).await;
        let run = seen.run();
        assert_eq!(run.output, "Served by the backup.");
        assert_eq!(assistant_texts(run), ["Served by the backup."]);
        assert_eq!(
            seen.fallbacks(),
            [(
                "primary-model".to_owned(),
                "backup-model".to_owned(),
                "PROVIDER_UNAVAILABLE"
            )],
            "second_service={second_service}"
        );
        assert_eq!(seen.retries(), [], "the fallback answered; no retry");
        // Only the backup's answer was billed.
        assert_eq!(
            seen.billed(),
            [("backup-model".to_owned(), Usage::new(8, 4))]
        );
        assert_eq!(run.usage, Usage::new(8, 4));
    }
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_chaos_500_and_disconnect_are_retried() {
    for (input, answer) in [
        ("Dropped with a 500 once", "Answered on the second try."),
        ("Disconnected once", "Connected again."),
    ] {
        for streamed in [false, true] {
            let model = retrying(aimock("test-model", &support::unique("chaos")), 3);
            let seen = observe(agent(model), input, streamed).await;
            assert_eq!(seen.run().output, answer, "{input} streamed={streamed}");
            // Nothing of the failed attempt reached the caller, so the
            // retry layer sent the call again, after its backoff.
            assert_eq!(
                seen.retries(),
                [(1, "PROVIDER_UNAVAILABLE", BACKOFF)],
                "{input} streamed={streamed}"
            );
            assert_eq!(seen.ledger.len(), 1, "{input} streamed={streamed}");
            if streamed {
                assert_eq!(seen.streamed, answer);
            }
        }
    }
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_malformed_json_is_unavailable_and_retried() {
    for streamed in [false, true] {
        let model = retrying(aimock("test-model", &support::unique("malformed")), 3);
        let seen = observe(agent(model), "Malformed once", streamed).await;
        assert_eq!(seen.run().output, "Well-formed at last.");
        assert_eq!(
            seen.retries(),
            [(1, "PROVIDER_UNAVAILABLE", BACKOFF)],
            "streamed={streamed}"
        );
        assert_eq!(seen.ledger.len(), 1, "streamed={streamed}");
        if streamed {
            assert_eq!(seen.streamed, "Well-formed at last.");
        }
    }
    // Without a retry it reaches the caller as PROVIDER_UNAVAILABLE, a
    // `BrokenResponse` that showed nothing.
    for streamed in [false, true] {
        let model = retrying(aimock("test-model", &support::unique("malformed")), 1);
        let seen = observe(agent(model), "Always malformed", streamed).await;
        let err = seen.err();
        assert_eq!(err.code(), "PROVIDER_UNAVAILABLE", "streamed={streamed}");
        assert_eq!(
            find::<BrokenResponse>(err).map(BrokenResponse::deltas_sent),
            Some(0),
            "streamed={streamed}"
        );
        assert_eq!(seen.retries(), []);
        assert_eq!(seen.ledger, []);
    }
    // With every attempt malformed, the retries run out: three attempts,
    // then the last one's error.
    let model = retrying(aimock("test-model", &support::unique("malformed")), 3);
    let seen = observe(agent(model), "Always malformed", false).await;
    assert_eq!(seen.err().code(), "PROVIDER_UNAVAILABLE");
    assert!(find::<BrokenResponse>(seen.err()).is_some());
    assert_eq!(
        seen.retries(),
        [
            (1, "PROVIDER_UNAVAILABLE", BACKOFF),
            (2, "PROVIDER_UNAVAILABLE", BACKOFF)
        ]
    );
}

/// Holds each turn's streamed text until the hooks saw the answer: the run
/// streams to a provisional sink, and sends the final text in one piece.
struct HoldStream;

impl Middleware for HoldStream {
    fn name(&self) -> &str {
        "hold-stream"
    }

    fn holds_stream(&self) -> bool {
        true
    }
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_a_dropped_stream_stays_out_of_the_transcript() {
    const ANSWER: &str =
        "The quick brown fox jumps over the lazy dog, then naps in the sun for a long while before dinner.";

    // Streamed straight to the caller: the cut attempt's first deltas
    // reached the sink, so the retry layer does not send the call again
    // (the user would see the text twice); the run fails, and its broken
    // answer is in no transcript.
    let model = retrying(aimock("test-model", &support::unique("cut")), 3);
    let seen = observe(agent(model), "Stream cut once", true).await;
    let err = seen.err();
    assert_eq!(err.code(), "PROVIDER_UNAVAILABLE");
    let broken = find::<BrokenResponse>(err).expect("a BrokenResponse");
    assert!(
        broken.deltas_sent() > 0,
        "the cut came after the first delta"
    );
    assert_eq!(seen.pieces, broken.deltas_sent());
    assert!(
        !seen.streamed.is_empty()
            && seen.streamed.len() < ANSWER.len()
            && ANSWER.starts_with(&seen.streamed),
        "the caller saw a strict prefix: {:?}",
        seen.streamed
    );
    assert_eq!(seen.retries(), [], "not replay-safe: not retried");
    assert_eq!(seen.ledger, []);

    // With a middleware holding the stream, the deltas only reached the
    // run's provisional sink: the call is replay-safe and retried. The
    // transcript holds the complete answer once, and the caller gets it in
    // one piece, nothing of the cut attempt.
    let model = retrying(aimock("test-model", &support::unique("cut")), 3);
    let held = LifecycleLayer::new(MiddlewareStack::new().push(HoldStream)).layer(agent(model));
    let seen = observe(held, "Stream cut once", true).await;
    let run = seen.run();
    assert_eq!(run.output, ANSWER);
    assert_eq!(assistant_texts(run), [ANSWER]);
    assert_eq!(seen.retries(), [(1, "PROVIDER_UNAVAILABLE", BACKOFF)]);
    assert_eq!((seen.pieces, seen.streamed.as_str()), (1, ANSWER));
    assert_eq!(seen.ledger.len(), 1);
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_a_slow_answer_times_out_and_is_retried() {
    let model = retrying(aimock("test-model", &support::unique("slow")), 3);
    let seen = observe(agent(model), "Slow once", false).await;
    assert_eq!(seen.run().output, "In time.");
    // The first attempt hit the layer's 2 s timeout; the second answered.
    assert_eq!(seen.retries(), [(1, "TIMEOUT", BACKOFF)]);
    assert_eq!(assistant_texts(seen.run()), ["In time."]);
    assert_eq!(seen.ledger.len(), 1);

    // Without a retry the run fails with TIMEOUT.
    let model = retrying(aimock("test-model", &support::unique("slow")), 1);
    let seen = observe(agent(model), "Slow once", false).await;
    assert_eq!(seen.err().code(), "TIMEOUT");
    assert_eq!(seen.ledger, []);
}
