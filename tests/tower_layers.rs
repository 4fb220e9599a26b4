//! tower's own layers — `TimeoutLayer`, `ConcurrencyLimitLayer`,
//! `LoadShedLayer`, `BufferLayer` — in the model stack and the tool stack of
//! full agent runs, unchanged, and how the run classifies their errors:
//!
//! | error | model stack | tool stack |
//! | --- | --- | --- |
//! | `Elapsed` | run fails `TIMEOUT` | the model reads it, the run goes on |
//! | `Overloaded` | run fails `PROVIDER_UNAVAILABLE` | the model reads it |
//! | `buffer::error::ServiceError` | classified as what it wraps | classified as what it wraps |

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::buffer::BufferLayer;
use tower::limit::ConcurrencyLimitLayer;
use tower::load_shed::LoadShedLayer;
use tower::timeout::TimeoutLayer;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_agent::error::TimeoutSource;
use tower_agent::layers::retry::{Backoff, Jitter, LlmRetryLayer};
use tower_agent::types::ToolCall;
use tower_agent::{
    tool_fn, tripwire, Agent, AgentError, BoxError, ErrorKind, ProviderError, RunRequest,
    ScriptedModel, ScriptedTurn, ToolRouter,
};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The tool results the model read in its request number `n` (from 0).
fn tool_results(model: &ScriptedModel, n: usize) -> Vec<String> {
    model.requests()[n]
        .messages
        .iter()
        .filter(|m| m.tool_call_id.is_some())
        .map(|m| m.text().into_owned())
        .collect()
}

/// A service whose readiness fails with `make()`, like a limiter refusing
/// to wait or a connection that cannot be made.
#[derive(Clone)]
struct Refusing<S> {
    inner: S,
    make: fn() -> BoxError,
}

impl<S, Req> Service<Req> for Refusing<S>
where
    S: Service<Req, Error = BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = S::Future;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Err((self.make)()))
    }

    fn call(&mut self, req: Req) -> S::Future {
        self.inner.call(req)
    }
}

fn refusing<S>(inner: S, make: fn() -> BoxError) -> Refusing<S> {
    Refusing { inner, make }
}

// ---- the model stack ----

#[tokio::test(start_paused = true)]
async fn model_stack_timeout_elapsed_is_a_timeout() {
    let model = ServiceBuilder::new()
        .layer(TimeoutLayer::new(secs(5)))
        .service(ScriptedModel::new([
            ScriptedTurn::text("late").delay(secs(30))
        ]));
    let agent = Agent::builder("a").model(model).build().unwrap();
    let err = agent.run("hi").await.unwrap_err();
    assert_eq!(err.code(), "TIMEOUT");
    assert!(matches!(
        err,
        AgentError::Timeout {
            timer: TimeoutSource::Tower,
            after: None
        }
    ));
    assert_eq!(err.to_string(), "timed out: a tower timeout layer fired");
}

#[tokio::test(start_paused = true)]
async fn model_stack_load_shed_overload_is_provider_unavailable() {
    let model = ServiceBuilder::new()
        .layer(LoadShedLayer::new())
        .layer(ConcurrencyLimitLayer::new(1))
        .service(ScriptedModel::from_fn(|_| {
            ScriptedTurn::text("answer").delay(secs(10))
        }));
    let agent = Agent::builder("a").model(model).build().unwrap();
    // Two runs at once on one model: the limit's permit is shared by clones,
    // so the second call is shed instead of queued.
    let (first, second) = tokio::join!(agent.run("one"), agent.run("two"));
    assert_eq!(first.unwrap().output, "answer");
    let err = second.unwrap_err();
    assert_eq!(err.code(), "PROVIDER_UNAVAILABLE");
    assert_eq!(err.kind(), ErrorKind::Unavailable);
}

#[tokio::test(start_paused = true)]
async fn model_stack_concurrency_limit_queues_without_load_shed() {
    let model = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::new(1))
        .service(ScriptedModel::from_fn(|_| {
            ScriptedTurn::text("answer").delay(secs(10))
        }));
    let agent = Agent::builder("a").model(model).build().unwrap();
    let started = tokio::time::Instant::now();
    let (first, second) = tokio::join!(agent.run("one"), agent.run("two"));
    assert_eq!(first.unwrap().output, "answer");
    assert_eq!(second.unwrap().output, "answer");
    // One at a time.
    assert_eq!(started.elapsed(), secs(20));
}

#[tokio::test(start_paused = true)]
async fn model_stack_buffer_passes_answers_and_errors_through() {
    let model = ServiceBuilder::new()
        .layer(BufferLayer::new(8))
        .layer(TimeoutLayer::new(secs(5)))
        .service(ScriptedModel::new([
            ScriptedTurn::text("fast"),
            ScriptedTurn::rate_limited(secs(3)),
            ScriptedTurn::text("slow").delay(secs(30)),
        ]));
    let agent = Agent::builder("a").model(model).build().unwrap();
    assert_eq!(agent.run("1").await.unwrap().output, "fast");
    match agent.run("2").await.unwrap_err() {
        AgentError::Provider(p) => {
            assert_eq!(p.kind(), ErrorKind::RateLimited);
            assert_eq!(p.retry_after_hint(), Some(secs(3)));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(agent.run("3").await.unwrap_err().code(), "TIMEOUT");
}

#[tokio::test(start_paused = true)]
async fn model_stack_buffer_wrapped_failures_are_looked_through() {
    // The buffered service fails its readiness: Buffer answers every call
    // with `ServiceError`, which the run and the retry policy see through.
    let inner = refusing(
        tower_agent::service::box_model(ScriptedModel::new([ScriptedTurn::text("never")])),
        || ProviderError::rate_limited("limiter refused", Some(secs(2))).into(),
    );
    let buffered = BufferLayer::new(8).layer(inner);
    let agent = Agent::builder("a").model(buffered.clone()).build().unwrap();
    let err = agent.run("hi").await.unwrap_err();
    assert_eq!(err.code(), "RATE_LIMITED");
    assert!(
        matches!(&err, AgentError::Provider(p) if p.retry_after_hint() == Some(secs(2))),
        "{err:?}"
    );
    assert!(err.to_string().contains("buffered service failed"), "{err}");

    let tripped = BufferLayer::new(8).layer(refusing(
        tower_agent::service::box_model(ScriptedModel::new([ScriptedTurn::text("never")])),
        || tripwire("the circuit guard tripped").into(),
    ));
    let agent = Agent::builder("a").model(tripped).build().unwrap();
    assert_eq!(
        agent.run("hi").await.unwrap_err().code(),
        "GUARDRAIL_TRIPPED"
    );
}

#[tokio::test(start_paused = true)]
async fn our_retry_sees_through_tower_layers() {
    // A timed-out attempt (tower's Elapsed, through a Buffer) is retried.
    let model = ServiceBuilder::new()
        .layer(
            LlmRetryLayer::new()
                .backoff(Backoff::new(Duration::from_millis(10), secs(1)).jitter(Jitter::None)),
        )
        .layer(BufferLayer::new(8))
        .layer(TimeoutLayer::new(secs(5)))
        .service(ScriptedModel::new([
            ScriptedTurn::text("late").delay(secs(30)),
            ScriptedTurn::text("on time"),
        ]));
    let agent = Agent::builder("a").model(model).build().unwrap();
    assert_eq!(agent.run("hi").await.unwrap().output, "on time");
}

// ---- the tool stack ----

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Job {
    id: u32,
}

/// A tool that takes `secs` seconds and counts its calls.
fn slow_tool(secs_each: u64) -> (tower_agent::FnTool, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let count = calls.clone();
    let tool = tool_fn("work", "Does a job", move |job: Job| {
        count.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(secs(secs_each)).await;
            Ok::<_, BoxError>(format!("job {} done", job.id))
        }
    });
    (tool, calls)
}

fn two_jobs_then(text: &str) -> ScriptedModel {
    ScriptedModel::new([
        ScriptedTurn::tool_calls([
            ToolCall::new("c1", "work", r#"{"id": 1}"#),
            ToolCall::new("c2", "work", r#"{"id": 2}"#),
        ]),
        ScriptedTurn::text(text),
    ])
}

#[tokio::test(start_paused = true)]
async fn tool_stack_timeout_becomes_a_message_the_model_reads() {
    let (tool, _) = slow_tool(60);
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("work", r#"{"id": 7}"#),
        ScriptedTurn::text("The job timed out."),
    ]);
    let agent = Agent::builder("a")
        .model(model.clone())
        .tools(ToolRouter::new().tool(tool))
        .tool_layer(TimeoutLayer::new(secs(5)))
        .build()
        .unwrap();
    let run = agent.run("do job 7").await.unwrap();
    assert_eq!(run.output, "The job timed out.");
    let results = tool_results(&model, 1);
    assert_eq!(results.len(), 1);
    assert_eq!(
        results[0],
        "The tool `work` failed: timed out: a tower timeout layer fired"
    );
}

#[tokio::test(start_paused = true)]
async fn tool_stack_load_shed_sheds_the_second_parallel_call() {
    let (tool, calls) = slow_tool(1);
    let model = two_jobs_then("One job ran.");
    let agent = Agent::builder("a")
        .model(model.clone())
        .tools(ToolRouter::new().tool(tool))
        .tool_layer(ConcurrencyLimitLayer::new(1))
        .tool_layer(LoadShedLayer::new())
        .build()
        .unwrap();
    let run = agent.run("do both").await.unwrap();
    assert_eq!(run.output, "One job ran.");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let results = tool_results(&model, 1);
    assert_eq!(results[0], "job 1 done");
    assert_eq!(
        results[1],
        "The tool `work` failed: PROVIDER_UNAVAILABLE: service overloaded"
    );
}

#[tokio::test(start_paused = true)]
async fn tool_stack_concurrency_limit_runs_calls_one_at_a_time() {
    let (tool, calls) = slow_tool(3);
    let model = two_jobs_then("Both ran.");
    let agent = Agent::builder("a")
        .model(model.clone())
        .tools(ToolRouter::new().tool(tool))
        .tool_layer(ConcurrencyLimitLayer::new(1))
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let run = agent.run("do both").await.unwrap();
    assert_eq!(run.output, "Both ran.");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(tool_results(&model, 1), ["job 1 done", "job 2 done"]);
    assert_eq!(started.elapsed(), secs(6));
}

#[tokio::test(start_paused = true)]
async fn tool_stack_buffer_runs_calls_and_passes_tool_errors_through() {
    let failing = tool_fn("flaky", "Fails", |_job: Job| async move {
        Err::<String, BoxError>(ProviderError::unavailable("backend offline").into())
    });
    let (tool, _) = slow_tool(1);
    let model = ScriptedModel::new([
        ScriptedTurn::tool_calls([
            ToolCall::new("c1", "work", r#"{"id": 1}"#),
            ToolCall::new("c2", "flaky", r#"{"id": 2}"#),
        ]),
        ScriptedTurn::text("Read both."),
    ]);
    let agent = Agent::builder("a")
        .model(model.clone())
        .tools(ToolRouter::new().tool(tool).tool(failing))
        .tool_layer(BufferLayer::new(4))
        .build()
        .unwrap();
    let run = agent.run("go").await.unwrap();
    assert_eq!(run.output, "Read both.");
    let results = tool_results(&model, 1);
    assert_eq!(results[0], "job 1 done");
    assert!(results[1].contains("backend offline"), "{}", results[1]);
}

#[tokio::test(start_paused = true)]
async fn tool_stack_buffer_wrapped_failures_are_looked_through() {
    // Unavailable behind the buffer: the model reads it and the run goes on.
    let (tool, calls) = slow_tool(1);
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("work", r#"{"id": 1}"#),
        ScriptedTurn::text("The tools are down."),
    ]);
    let agent = Agent::builder("a")
        .model(model.clone())
        .tools(ToolRouter::new().tool(tool))
        .tool_layer(tower::layer::layer_fn(|s| {
            refusing(s, || ProviderError::unavailable("pool exhausted").into())
        }))
        .tool_layer(BufferLayer::new(4))
        .build()
        .unwrap();
    let run = agent.run("go").await.unwrap();
    assert_eq!(run.output, "The tools are down.");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let results = tool_results(&model, 1);
    assert!(
        results[0].contains("PROVIDER_UNAVAILABLE") && results[0].contains("pool exhausted"),
        "{results:?}"
    );

    // A tripwire behind the buffer still ends the run.
    let (tool, _) = slow_tool(1);
    let agent = Agent::builder("a")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call("work", r#"{"id": 1}"#),
            ScriptedTurn::text("unreachable"),
        ]))
        .tools(ToolRouter::new().tool(tool))
        .tool_layer(tower::layer::layer_fn(|s| {
            refusing(s, || tripwire("tool guard").into())
        }))
        .tool_layer(BufferLayer::new(4))
        .build()
        .unwrap();
    let err = agent.oneshot(RunRequest::new("go")).await.unwrap_err();
    assert_eq!(err.code(), "GUARDRAIL_TRIPPED");
}
