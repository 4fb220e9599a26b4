//! The timeout and deadline layer: on a tower-test mock, generic over model
//! and tool requests, and in full agent runs. Everything on the paused clock.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};
use tower_agent::error::TimeoutSource;
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::layers::retry::{Backoff, Jitter, LlmRetryLayer};
use tower_agent::layers::timeout::{CallTimeout, CallTimeoutLayer};
use tower_agent::types::{Message, ModelRequest, ModelResponse, ToolCall};
use tower_agent::{
    tool_fn, Agent, AgentError, BoxError, ModelCall, RunContext, RunRequest, ScriptedModel,
    ScriptedTurn, ToolInvocation, ToolOutput, ToolRouter,
};
use tower_test::mock;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

async fn settle<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(secs(24 * 3600), f)
        .await
        .expect("the test stalled")
}

fn model_call(ctx: &RunContext) -> ModelCall {
    ModelCall::new(
        ModelRequest::new("m", vec![Message::user("hi")]),
        ctx.clone(),
    )
}

fn code(err: BoxError) -> &'static str {
    AgentError::classify(err).code()
}

#[tokio::test(start_paused = true)]
async fn mock_times_out_an_attempt_with_the_call_timeout() {
    let (mut svc, mut handle) =
        mock::spawn_layer::<ModelCall, ModelResponse, _>(CallTimeoutLayer::new(secs(5)));
    assert!(svc.poll_ready().is_ready());
    let started = Instant::now();
    let response = tokio::spawn(svc.call(model_call(&RunContext::new())));
    let (_req, _send) = settle(handle.next_request()).await.unwrap();
    let err = settle(response).await.unwrap().unwrap_err();
    assert!(matches!(
        err.downcast_ref::<AgentError>(),
        Some(AgentError::Timeout {
            timer: TimeoutSource::CallTimeout,
            after: Some(after)
        }) if *after == secs(5)
    ));
    assert_eq!(code(err), "TIMEOUT");
    assert_eq!(started.elapsed(), secs(5));
}

#[tokio::test(start_paused = true)]
async fn mock_takes_the_shorter_of_timeout_and_deadline() {
    let (mut svc, mut handle) =
        mock::spawn_layer::<ModelCall, ModelResponse, _>(CallTimeoutLayer::new(secs(5)));

    // 2 s left to the deadline: the deadline wins.
    let ctx = RunContext::builder().timeout(secs(3)).build();
    tokio::time::advance(secs(1)).await;
    assert!(svc.poll_ready().is_ready());
    let started = Instant::now();
    let response = tokio::spawn(svc.call(model_call(&ctx)));
    let _pending = settle(handle.next_request()).await.unwrap();
    assert_eq!(
        code(settle(response).await.unwrap().unwrap_err()),
        "TIMEOUT"
    );
    assert_eq!(started.elapsed(), secs(2));

    // 60 s left: the layer's 5 s win.
    let ctx = RunContext::builder().timeout(secs(60)).build();
    assert!(svc.poll_ready().is_ready());
    let started = Instant::now();
    let response = tokio::spawn(svc.call(model_call(&ctx)));
    let _pending = settle(handle.next_request()).await.unwrap();
    assert_eq!(
        code(settle(response).await.unwrap().unwrap_err()),
        "TIMEOUT"
    );
    assert_eq!(started.elapsed(), secs(5));
}

#[tokio::test(start_paused = true)]
async fn mock_deadline_only_waits_as_long_as_the_run_may() {
    let (mut svc, mut handle) =
        mock::spawn_layer::<ModelCall, ModelResponse, _>(CallTimeoutLayer::deadline());
    assert_eq!(svc.get_ref().timeout(), None);

    // No deadline: an hour-long answer arrives.
    assert!(svc.poll_ready().is_ready());
    let response = tokio::spawn(svc.call(model_call(&RunContext::new())));
    let (_, send) = settle(handle.next_request()).await.unwrap();
    tokio::time::sleep(secs(3600)).await;
    send.send_response(ModelResponse::new("m", Message::assistant("late")));
    let answer = settle(response).await.unwrap().unwrap();
    assert_eq!(answer.message.text(), "late");

    // A deadline 10 s out ends the call at 10 s.
    let ctx = RunContext::builder().timeout(secs(10)).build();
    assert!(svc.poll_ready().is_ready());
    let started = Instant::now();
    let response = tokio::spawn(svc.call(model_call(&ctx)));
    let _pending = settle(handle.next_request()).await.unwrap();
    assert_eq!(
        code(settle(response).await.unwrap().unwrap_err()),
        "TIMEOUT"
    );
    assert_eq!(started.elapsed(), secs(10));
}

#[tokio::test(start_paused = true)]
async fn mock_cancellation_ends_the_call_at_once() {
    let (mut svc, mut handle) =
        mock::spawn_layer::<ModelCall, ModelResponse, _>(CallTimeoutLayer::new(secs(30)));
    let ctx = RunContext::new();
    assert!(svc.poll_ready().is_ready());
    let started = Instant::now();
    let response = tokio::spawn(svc.call(model_call(&ctx)));
    let _pending = settle(handle.next_request()).await.unwrap();
    ctx.cancel();
    let err = settle(response).await.unwrap().unwrap_err();
    assert!(matches!(
        err.downcast_ref::<AgentError>(),
        Some(AgentError::Cancelled)
    ));
    assert_eq!(code(err), "CANCELLED");
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn mock_a_cancelled_run_does_not_reach_the_service() {
    let (mut svc, mut handle) =
        mock::spawn_layer::<ModelCall, ModelResponse, _>(CallTimeoutLayer::new(secs(30)));
    let ctx = RunContext::new();
    ctx.cancel();
    assert!(svc.poll_ready().is_ready());
    let err = settle(svc.call(model_call(&ctx))).await.unwrap_err();
    assert_eq!(code(err), "CANCELLED");
    drop(svc);
    assert!(settle(handle.next_request()).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn mock_the_timeout_counts_from_the_call_not_from_the_first_wait() {
    let (mut svc, mut handle) =
        mock::spawn_layer::<ModelCall, ModelResponse, _>(CallTimeoutLayer::new(secs(5)));
    assert!(svc.poll_ready().is_ready());
    let started = Instant::now();
    let response = svc.call(model_call(&RunContext::new()));
    // Nobody polls the call for 3 s: its timer is armed late, to the same
    // deadline.
    tokio::time::advance(secs(3)).await;
    let response = tokio::spawn(response);
    let _pending = settle(handle.next_request()).await.unwrap();
    let err = settle(response).await.unwrap().unwrap_err();
    assert!(matches!(
        err.downcast_ref::<AgentError>(),
        Some(AgentError::Timeout {
            timer: TimeoutSource::CallTimeout,
            after: Some(after)
        }) if *after == secs(5)
    ));
    assert_eq!(started.elapsed(), secs(5));

    // The run's deadline too.
    let ctx = RunContext::builder().timeout(secs(4)).build();
    assert!(svc.poll_ready().is_ready());
    let started = Instant::now();
    let response = svc.call(model_call(&ctx));
    tokio::time::advance(secs(3)).await;
    let response = tokio::spawn(response);
    let _pending = settle(handle.next_request()).await.unwrap();
    assert_eq!(
        code(settle(response).await.unwrap().unwrap_err()),
        "TIMEOUT"
    );
    assert_eq!(started.elapsed(), secs(4));
}

#[test]
fn an_answer_ready_at_once_never_touches_the_timer() {
    // No tokio runtime at all: arming a timer here would panic.
    let at_once = service_fn(|_call: ModelCall| async {
        Ok::<_, BoxError>(ModelResponse::new("m", Message::assistant("at once")))
    });
    let ctx = RunContext::builder().timeout(secs(10)).build();
    let mut svc = CallTimeoutLayer::new(secs(5)).layer(at_once);
    let answer = futures::executor::block_on(svc.call(model_call(&ctx))).unwrap();
    assert_eq!(answer.message.text(), "at once");
    let answer = futures::executor::block_on(svc.call(model_call(&RunContext::new()))).unwrap();
    assert_eq!(answer.message.text(), "at once");
}

#[tokio::test(start_paused = true)]
async fn mock_passes_answers_and_errors_through_and_forwards_readiness() {
    let (mut svc, mut handle) =
        mock::spawn_layer::<ToolInvocation, ToolOutput, _>(CallTimeoutLayer::new(secs(30)));
    let invocation = || ToolInvocation::new(ToolCall::new("c", "t", "{}"), RunContext::new());

    handle.allow(0);
    assert!(svc.poll_ready().is_pending());
    handle.allow(2);
    assert!(svc.poll_ready().is_ready());
    let out = tokio::spawn(svc.call(invocation()));
    let (_, send) = settle(handle.next_request()).await.unwrap();
    send.send_response(ToolOutput::text("ok"));
    assert_eq!(settle(out).await.unwrap().unwrap(), ToolOutput::text("ok"));

    assert!(svc.poll_ready().is_ready());
    let out = tokio::spawn(svc.call(invocation()));
    let (_, send) = settle(handle.next_request()).await.unwrap();
    send.send_error(tower_agent::ProviderError::unavailable("down"));
    assert_eq!(
        code(settle(out).await.unwrap().unwrap_err()),
        "PROVIDER_UNAVAILABLE"
    );
}

#[tokio::test(start_paused = true)]
async fn the_inner_future_is_dropped_when_the_run_is_cancelled() {
    struct DropFlag(Arc<AtomicBool>);
    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = dropped.clone();
    let slow = service_fn(move |_call: ModelCall| {
        let guard = DropFlag(flag.clone());
        async move {
            tokio::time::sleep(secs(3600)).await;
            drop(guard);
            Ok::<_, BoxError>(ModelResponse::new("m", Message::assistant("never")))
        }
    });
    let ctx = RunContext::new();
    let call = CallTimeout::deadline(slow).oneshot(model_call(&ctx));
    let canceller = async {
        tokio::time::sleep(secs(1)).await;
        ctx.cancel();
    };
    let (result, ()) = tokio::join!(call, canceller);
    assert_eq!(code(result.unwrap_err()), "CANCELLED");
    assert!(dropped.load(Ordering::SeqCst));
}

fn retry_events(sink: &CollectingSink) -> Vec<&'static str> {
    sink.events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::RetryAttempt { code, .. } => Some(code),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_full_run_times_out_one_attempt_and_retries_it() {
    let model = ScriptedModel::new([
        ScriptedTurn::text("too late").delay(secs(60)),
        ScriptedTurn::text("in time").delay(secs(1)),
    ]);
    let stack = ServiceBuilder::new()
        .layer(
            LlmRetryLayer::new()
                .backoff(Backoff::new(Duration::from_millis(100), secs(1)).jitter(Jitter::None)),
        )
        .layer(CallTimeoutLayer::new(secs(5)))
        .service(model);
    let agent = Agent::builder("a").model(stack).build().unwrap();
    let sink = CollectingSink::new();
    let ctx = RunContext::builder().events(sink.clone()).build();
    let started = Instant::now();
    let run = agent
        .oneshot(RunRequest::new("hi").context(ctx))
        .await
        .unwrap();
    assert_eq!(run.output, "in time");
    assert_eq!(retry_events(&sink), ["TIMEOUT"]);
    assert_eq!(
        started.elapsed(),
        secs(5) + Duration::from_millis(100) + secs(1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_run_fails_with_timeout_at_its_deadline() {
    let model = ScriptedModel::new([ScriptedTurn::text("late").delay(secs(60))]);
    let stack = ServiceBuilder::new()
        .layer(LlmRetryLayer::new())
        .layer(CallTimeoutLayer::new(secs(30)))
        .service(model);
    let agent = Agent::builder("a").model(stack).build().unwrap();
    let sink = CollectingSink::new();
    let ctx = RunContext::builder()
        .timeout(secs(3))
        .events(sink.clone())
        .build();
    let started = Instant::now();
    let err = agent
        .oneshot(RunRequest::new("hi").context(ctx))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "TIMEOUT");
    assert_eq!(started.elapsed(), secs(3));
    assert!(retry_events(&sink).is_empty(), "no retry past the deadline");
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Query {
    q: String,
}

#[tokio::test(start_paused = true)]
async fn a_slow_tool_times_out_and_the_model_reads_it() {
    let slow = tool_fn("search", "Searches", |query: Query| async move {
        tokio::time::sleep(secs(120)).await;
        Ok::<_, BoxError>(format!("results for {}", query.q))
    });
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("search", r#"{"q": "rust"}"#),
        ScriptedTurn::text("The search timed out."),
    ]);
    let agent = Agent::builder("a")
        .model(model.clone())
        .tools(ToolRouter::new().tool(slow))
        .tool_layer(CallTimeoutLayer::new(secs(10)))
        .build()
        .unwrap();
    let run = agent.run("search rust").await.unwrap();
    assert_eq!(run.output, "The search timed out.");
    let tool_result = model.requests()[1]
        .messages
        .iter()
        .find(|m| m.tool_call_id.is_some())
        .map(|m| m.text().into_owned())
        .unwrap();
    assert!(tool_result.contains("timed out"), "{tool_result}");
}

#[tokio::test(start_paused = true)]
async fn cancelling_during_a_tool_call_ends_the_run_cancelled() {
    let slow = tool_fn("search", "Searches", |_query: Query| async move {
        tokio::time::sleep(secs(120)).await;
        Ok::<_, BoxError>("results")
    });
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("search", r#"{"q": "rust"}"#),
        ScriptedTurn::text("unreachable"),
    ]);
    let agent = Agent::builder("a")
        .model(model)
        .tools(ToolRouter::new().tool(slow))
        .tool_layer(CallTimeoutLayer::deadline())
        .build()
        .unwrap();
    let ctx = RunContext::new();
    let run = agent.oneshot(RunRequest::new("go").context(ctx.clone()));
    let canceller = async {
        tokio::time::sleep(secs(2)).await;
        ctx.cancel();
    };
    let (result, ()) = tokio::join!(run, canceller);
    assert_eq!(result.unwrap_err().code(), "CANCELLED");
}
