//! The retry layer: in isolation on a tower-test mock, in full agent runs
//! (model stack and tool stack, streamed and not, nested agents sharing one
//! budget), and the backoff's bounds as a property.

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tower::retry::budget::Budget;
use tower::{service_fn, Service, ServiceBuilder};
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::layers::retry::{Backoff, Jitter, LlmRetryLayer, RetryBudget};
use tower_agent::types::{Message, ModelDelta, ModelRequest, ModelResponse, ToolCall, Usage};
use tower_agent::{
    tool_fn, tripwire, Agent, AgentError, AgentTool, BoxError, DeltaSink, ErrorKind, ModelCall,
    ProviderError, RunContext, RunRequest, ScriptedModel, ScriptedTurn, ToolInvocation, ToolOutput,
    ToolRouter,
};
use tower_test::mock;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Waits of exactly 100 ms, 200 ms, 400 ms, … (capped at 1 s).
fn exact() -> LlmRetryLayer {
    LlmRetryLayer::new().backoff(Backoff::new(ms(100), Duration::from_secs(1)).jitter(Jitter::None))
}

fn model_call(ctx: &RunContext) -> ModelCall {
    ModelCall::new(
        ModelRequest::new("m", vec![Message::user("hi")]),
        ctx.clone(),
    )
}

fn reply(text: &str) -> ModelResponse {
    ModelResponse::new("m", Message::assistant(text))
}

fn traced() -> (RunContext, CollectingSink) {
    let sink = CollectingSink::new();
    (RunContext::builder().events(sink.clone()).build(), sink)
}

/// `(attempt, code, delay)` of every retry event.
fn retries(sink: &CollectingSink) -> Vec<(u32, &'static str, Duration)> {
    sink.events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::RetryAttempt {
                attempt,
                code,
                delay,
                ..
            } => Some((attempt, code, delay)),
            _ => None,
        })
        .collect()
}

/// A budget allowing `n` withdrawals in all, deposits ignored.
struct Allowance(AtomicI64);

impl Allowance {
    fn budget(n: i64) -> RetryBudget {
        RetryBudget::new(Allowance(AtomicI64::new(n)))
    }
}

impl Budget for Allowance {
    fn deposit(&self) {}

    fn withdraw(&self) -> bool {
        self.0.fetch_sub(1, Ordering::SeqCst) > 0
    }
}

/// Awaits `f`, failing the test if it stalls (on the paused clock, a
/// stalled test reaches the day at once).
async fn settle<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(24 * 3600), f)
        .await
        .expect("the test stalled")
}

type ModelMock = mock::Handle<ModelCall, ModelResponse>;

async fn answer_error(handle: &mut ModelMock, err: impl Into<BoxError>) -> ModelCall {
    let (req, send) = settle(handle.next_request()).await.expect("a request");
    send.send_error(err);
    req
}

#[tokio::test(start_paused = true)]
async fn mock_retries_a_provider_error_then_answers() {
    let (mut svc, mut handle) = mock::spawn_layer::<ModelCall, ModelResponse, _>(exact());
    let (ctx, sink) = traced();
    assert!(svc.poll_ready().is_ready());
    let started = tokio::time::Instant::now();
    let response = tokio::spawn(svc.call(model_call(&ctx)));

    answer_error(&mut handle, ProviderError::unavailable("overloaded")).await;
    answer_error(
        &mut handle,
        ProviderError::new(ErrorKind::Other, "bad gateway").status(502),
    )
    .await;
    let (again, send) = settle(handle.next_request()).await.unwrap();
    assert_eq!(again.request.messages.to_vec(), [Message::user("hi")]);
    send.send_response(reply("hello"));

    let response = settle(response).await.unwrap().unwrap();
    assert_eq!(response.message.text(), "hello");
    assert_eq!(
        retries(&sink),
        vec![
            (1, "PROVIDER_UNAVAILABLE", ms(100)),
            (2, "INTERNAL", ms(200))
        ]
    );
    // The waits ran on tokio's (paused) clock.
    assert_eq!(started.elapsed(), ms(300));
}

#[tokio::test(start_paused = true)]
async fn mock_never_retries_what_another_call_cannot_fix() {
    let provider = |kind, text: &str| -> BoxError { ProviderError::new(kind, text).into() };
    let fatal: Vec<(BoxError, &str)> = vec![
        (
            provider(ErrorKind::InvalidRequest, "bad"),
            "INVALID_REQUEST",
        ),
        (provider(ErrorKind::Auth, "no key"), "AUTH"),
        (provider(ErrorKind::ContextLength, "long"), "CONTEXT_LENGTH"),
        (
            provider(ErrorKind::QuotaExhausted, "spent"),
            "QUOTA_EXHAUSTED",
        ),
        (tripwire("no").into(), "GUARDRAIL_TRIPPED"),
        (AgentError::Cancelled.into(), "CANCELLED"),
        ("a bug".into(), "INTERNAL"),
    ];
    for (error, code) in fatal {
        let (mut svc, mut handle) = mock::spawn_layer::<ModelCall, ModelResponse, _>(exact());
        let (ctx, sink) = traced();
        assert!(svc.poll_ready().is_ready());
        let response = tokio::spawn(svc.call(model_call(&ctx)));
        answer_error(&mut handle, error).await;
        let err = settle(response).await.unwrap().unwrap_err();
        assert_eq!(AgentError::classify(err).code(), code);
        assert!(retries(&sink).is_empty(), "{code} was retried");
        drop(svc);
        assert!(
            settle(handle.next_request()).await.is_none(),
            "{code}: a second request"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn mock_stops_after_max_attempts_with_the_last_error() {
    let layer = exact().max_attempts(3);
    let (mut svc, mut handle) = mock::spawn_layer::<ModelCall, ModelResponse, _>(layer);
    let (ctx, sink) = traced();
    assert!(svc.poll_ready().is_ready());
    let response = tokio::spawn(svc.call(model_call(&ctx)));
    answer_error(&mut handle, ProviderError::unavailable("1")).await;
    answer_error(&mut handle, tower::timeout::error::Elapsed::new()).await;
    answer_error(&mut handle, ProviderError::rate_limited("3", Some(ms(50)))).await;
    let err = AgentError::classify(settle(response).await.unwrap().unwrap_err());
    assert_eq!(err.code(), "RATE_LIMITED");
    assert_eq!(err.to_string(), "RATE_LIMITED: 3");
    assert_eq!(
        retries(&sink),
        vec![
            (1, "PROVIDER_UNAVAILABLE", ms(100)),
            (2, "TIMEOUT", ms(200))
        ]
    );
    drop(svc);
    assert!(settle(handle.next_request()).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn mock_honours_retry_after_up_to_the_max_wait() {
    let layer = exact().max_retry_after(Duration::from_secs(10));
    let (mut svc, mut handle) = mock::spawn_layer::<ModelCall, ModelResponse, _>(layer);
    let (ctx, sink) = traced();

    // 7 s asked: waited exactly that, not the 100 ms backoff.
    assert!(svc.poll_ready().is_ready());
    let started = tokio::time::Instant::now();
    let response = tokio::spawn(svc.call(model_call(&ctx)));
    answer_error(
        &mut handle,
        ProviderError::rate_limited("slow down", Some(Duration::from_secs(7))),
    )
    .await;
    let (_, send) = settle(handle.next_request()).await.unwrap();
    send.send_response(reply("ok"));
    assert!(settle(response).await.unwrap().is_ok());
    assert_eq!(started.elapsed(), Duration::from_secs(7));
    assert_eq!(
        retries(&sink),
        vec![(1, "RATE_LIMITED", Duration::from_secs(7))]
    );

    // 11 s asked: more than the policy waits, so it fails at once.
    assert!(svc.poll_ready().is_ready());
    let response = tokio::spawn(svc.call(model_call(&ctx)));
    answer_error(
        &mut handle,
        ProviderError::rate_limited("slow down", Some(Duration::from_secs(11))),
    )
    .await;
    let err = AgentError::classify(settle(response).await.unwrap().unwrap_err());
    assert_eq!(err.code(), "RATE_LIMITED");
    assert_eq!(retries(&sink).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn mock_does_not_wait_past_the_deadline_or_after_cancellation() {
    let (mut svc, mut handle) = mock::spawn_layer::<ModelCall, ModelResponse, _>(exact());

    let ctx = RunContext::builder().timeout(ms(150)).build();
    tokio::time::advance(ms(60)).await;
    // 90 ms left: the 100 ms wait would end past the deadline.
    assert!(svc.poll_ready().is_ready());
    let response = tokio::spawn(svc.call(model_call(&ctx)));
    answer_error(&mut handle, ProviderError::unavailable("down")).await;
    assert_eq!(
        AgentError::classify(settle(response).await.unwrap().unwrap_err()).code(),
        "PROVIDER_UNAVAILABLE"
    );

    let ctx = RunContext::new();
    assert!(svc.poll_ready().is_ready());
    let response = tokio::spawn(svc.call(model_call(&ctx)));
    let (_, send) = settle(handle.next_request()).await.unwrap();
    ctx.cancel();
    send.send_error(ProviderError::unavailable("down"));
    assert!(settle(response).await.unwrap().is_err());
    drop(svc);
    assert!(settle(handle.next_request()).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn mock_replays_a_streamed_call_only_before_its_first_delta() {
    let (mut svc, mut handle) = mock::spawn_layer::<ModelCall, ModelResponse, _>(exact());
    let (sink, mut deltas) = DeltaSink::channel();

    // Fails before streaming anything: retried.
    let mut call = model_call(&RunContext::new());
    call.stream = Some(sink.clone());
    assert!(svc.poll_ready().is_ready());
    let response = tokio::spawn(svc.call(call));
    answer_error(&mut handle, ProviderError::unavailable("down")).await;
    let (retried, send) = settle(handle.next_request()).await.unwrap();
    retried
        .stream
        .as_ref()
        .unwrap()
        .send(&ModelDelta::text("Hel"));
    send.send_response(reply("Hello"));
    assert!(settle(response).await.unwrap().is_ok());
    assert_eq!(deltas.try_recv().unwrap(), ModelDelta::text("Hel"));

    // Fails after a delta reached the sink: not retried.
    let mut call = model_call(&RunContext::new());
    call.stream = Some(sink);
    assert!(svc.poll_ready().is_ready());
    let response = tokio::spawn(svc.call(call));
    let (streaming, send) = settle(handle.next_request()).await.unwrap();
    streaming
        .stream
        .as_ref()
        .unwrap()
        .send(&ModelDelta::text("Par"));
    send.send_error(ProviderError::unavailable("dropped"));
    assert!(settle(response).await.unwrap().is_err());
    assert_eq!(deltas.try_recv().unwrap(), ModelDelta::text("Par"));
    drop(svc);
    assert!(settle(handle.next_request()).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn mock_retries_only_idempotent_tool_calls() {
    let (mut svc, mut handle) = mock::spawn_layer::<ToolInvocation, ToolOutput, _>(exact());
    let invocation = |idempotent| {
        let mut inv = ToolInvocation::new(ToolCall::new("c1", "lookup", "{}"), RunContext::new());
        inv.idempotent = idempotent;
        inv
    };

    assert!(svc.poll_ready().is_ready());
    let out = tokio::spawn(svc.call(invocation(false)));
    let (_, send) = settle(handle.next_request()).await.unwrap();
    send.send_error(ProviderError::unavailable("down"));
    assert!(settle(out).await.unwrap().is_err());

    assert!(svc.poll_ready().is_ready());
    let out = tokio::spawn(svc.call(invocation(true)));
    let (_, send) = settle(handle.next_request()).await.unwrap();
    send.send_error(ProviderError::unavailable("down"));
    let (_, send) = settle(handle.next_request()).await.unwrap();
    send.send_response(ToolOutput::text("found"));
    assert_eq!(
        settle(out).await.unwrap().unwrap(),
        ToolOutput::text("found")
    );
}

#[tokio::test(start_paused = true)]
async fn mock_forwards_readiness() {
    let (mut svc, mut handle) = mock::spawn_layer::<ModelCall, ModelResponse, _>(exact());
    handle.allow(0);
    assert!(svc.poll_ready().is_pending());
    handle.allow(1);
    assert!(svc.is_woken());
    assert!(svc.poll_ready().is_ready());
}

#[tokio::test(start_paused = true)]
async fn the_budget_is_shared_by_clones_and_layers() {
    let budget = Allowance::budget(1);
    let layer = exact().budget(budget.clone());
    let (mut first, mut first_handle) =
        mock::spawn_layer::<ModelCall, ModelResponse, _>(layer.clone());
    let (mut second, mut second_handle) = mock::spawn_layer::<ModelCall, ModelResponse, _>(layer);
    let (ctx, sink) = traced();

    assert!(first.poll_ready().is_ready());
    let a = tokio::spawn(first.call(model_call(&ctx)));
    answer_error(&mut first_handle, ProviderError::unavailable("down")).await;
    let (_, send) = settle(first_handle.next_request()).await.unwrap();
    send.send_response(reply("ok"));
    assert!(settle(a).await.unwrap().is_ok());

    // The other service drew on the same pool, now empty.
    assert!(second.poll_ready().is_ready());
    let b = tokio::spawn(second.call(model_call(&ctx)));
    answer_error(&mut second_handle, ProviderError::unavailable("down")).await;
    assert!(settle(b).await.unwrap().is_err());
    assert_eq!(retries(&sink).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_tps_budget_pays_retries_from_deposited_calls() {
    // No reserve; one retry per two calls.
    let budget = RetryBudget::tps(Duration::from_secs(10), 0, 0.5).unwrap();
    let model = ScriptedModel::new([
        ScriptedTurn::text("one"),
        ScriptedTurn::error(ErrorKind::Unavailable, "down"),
        ScriptedTurn::text("two"),
        ScriptedTurn::error(ErrorKind::Unavailable, "down"),
    ]);
    let agent = Agent::builder("a")
        .model(
            ServiceBuilder::new()
                .layer(exact().budget(budget))
                .service(model.clone()),
        )
        .build()
        .unwrap();
    assert_eq!(agent.run("1").await.unwrap().output, "one");
    // The second call's deposit makes two: enough for one retry.
    assert_eq!(agent.run("2").await.unwrap().output, "two");
    // The third deposits one, but the retry costs two.
    assert_eq!(
        agent.run("3").await.unwrap_err().code(),
        "PROVIDER_UNAVAILABLE"
    );
    assert_eq!(model.remaining(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_full_run_retries_and_counts_only_what_reached_the_model() {
    let model = ScriptedModel::new([
        ScriptedTurn::error(ErrorKind::Unavailable, "overloaded"),
        ScriptedTurn::rate_limited(Duration::from_secs(2)),
        ScriptedTurn::text("Hello!").usage(Usage::new(12, 3)),
    ]);
    let agent = Agent::builder("greeter")
        .model(
            ServiceBuilder::new()
                .layer(exact().max_attempts(3))
                .service(model.clone()),
        )
        .build()
        .unwrap();
    let (ctx, sink) = traced();
    let run = tower::ServiceExt::oneshot(agent, RunRequest::new("Hi").context(ctx.clone()))
        .await
        .unwrap();
    assert_eq!(run.output, "Hello!");
    assert_eq!(model.requests().len(), 3);
    assert_eq!(
        retries(&sink),
        vec![
            (1, "PROVIDER_UNAVAILABLE", ms(100)),
            (2, "RATE_LIMITED", Duration::from_secs(2))
        ]
    );
    // The failed attempts billed nothing; the answer is recorded once.
    assert_eq!(run.usage, Usage::new(12, 3));
    assert_eq!(ctx.usage_entries().len(), 1);
    assert_eq!(run.counters.model_calls, 1);
}

/// A model that streams "Par" and then fails on its first call, and answers
/// on the next.
fn breaks_mid_stream() -> (
    impl Service<ModelCall, Response = ModelResponse, Error = BoxError, Future = impl Send + 'static>
        + Clone
        + Send
        + Sync
        + 'static,
    Arc<AtomicU32>,
) {
    let calls = Arc::new(AtomicU32::new(0));
    let count = calls.clone();
    let model = service_fn(move |call: ModelCall| {
        let n = count.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                if let Some(sink) = &call.stream {
                    sink.send(&ModelDelta::text("Par"));
                }
                return Err::<ModelResponse, BoxError>(
                    ProviderError::unavailable("connection reset").into(),
                );
            }
            Ok(ModelResponse::new("m", Message::assistant("Paris")))
        }
    });
    (model, calls)
}

#[tokio::test(start_paused = true)]
async fn a_streamed_run_is_not_replayed_after_text_went_out() {
    let (model, calls) = breaks_mid_stream();
    let agent = Agent::builder("geo")
        .model(ServiceBuilder::new().layer(exact()).service(model))
        .build()
        .unwrap();
    let (sink, mut deltas) = DeltaSink::channel();
    let err = tower::ServiceExt::oneshot(agent.clone(), RunRequest::new("Capital?").stream(sink))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "PROVIDER_UNAVAILABLE");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(deltas.try_recv().unwrap(), ModelDelta::text("Par"));
    assert!(deltas.try_recv().is_err());

    // Without a stream nothing went out, so the same failure is retried.
    let (model, calls) = breaks_mid_stream();
    let agent = Agent::builder("geo")
        .model(ServiceBuilder::new().layer(exact()).service(model))
        .build()
        .unwrap();
    assert_eq!(agent.run("Capital?").await.unwrap().output, "Paris");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_streamed_run_is_retried_when_nothing_went_out() {
    let model = ScriptedModel::new([
        ScriptedTurn::error(ErrorKind::Unavailable, "overloaded"),
        ScriptedTurn::text("Hello there").chunk_chars(4),
    ]);
    let agent = Agent::builder("greeter")
        .model(tower::Layer::layer(&exact(), model))
        .build()
        .unwrap();
    let (sink, mut deltas) = DeltaSink::channel();
    let run = tower::ServiceExt::oneshot(agent, RunRequest::new("Hi").stream(sink))
        .await
        .unwrap();
    assert_eq!(run.output, "Hello there");
    let mut streamed = String::new();
    while let Ok(ModelDelta::Text { text }) = deltas.try_recv() {
        streamed.push_str(&text);
    }
    assert_eq!(streamed, "Hello there");
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Lookup {
    key: String,
}

/// A tool failing once with a provider error, then answering.
fn flaky(name: &str, idempotent: bool) -> (tower_agent::FnTool, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let count = calls.clone();
    let tool = tool_fn(name, "Looks a key up", move |args: Lookup| {
        let n = count.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                return Err::<String, BoxError>(ProviderError::unavailable("index offline").into());
            }
            Ok(format!("value of {}", args.key))
        }
    });
    (if idempotent { tool.idempotent() } else { tool }, calls)
}

#[tokio::test(start_paused = true)]
async fn a_tool_stack_retries_idempotent_tools_only() {
    let (lookup, lookups) = flaky("lookup", true);
    let (charge, charges) = flaky("charge", false);
    let model = ScriptedModel::new([
        ScriptedTurn::tool_calls([
            ToolCall::new("c1", "lookup", r#"{"key": "a"}"#),
            ToolCall::new("c2", "charge", r#"{"key": "b"}"#),
        ]),
        ScriptedTurn::text("done"),
    ]);
    let agent = Agent::builder("ops")
        .model(model.clone())
        .tools(ToolRouter::new().tool(lookup).tool(charge))
        .tool_layer(exact())
        .build()
        .unwrap();
    let run = agent.run("go").await.unwrap();
    assert_eq!(run.output, "done");
    assert_eq!(lookups.load(Ordering::SeqCst), 2);
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    let seen = &model.requests()[1];
    let results: Vec<_> = seen
        .messages
        .iter()
        .filter(|m| m.tool_call_id.is_some())
        .map(|m| m.text().into_owned())
        .collect();
    assert_eq!(results[0], "value of a");
    assert!(
        results[1].contains("index offline"),
        "the model reads the non-idempotent tool's error: {}",
        results[1]
    );
}

#[tokio::test(start_paused = true)]
async fn nested_agents_draw_on_one_budget() {
    async fn run_tree(
        parent_budget: RetryBudget,
        child_budget: RetryBudget,
    ) -> Result<String, AgentError> {
        let child = Agent::builder("researcher")
            .model(
                ServiceBuilder::new()
                    .layer(exact().budget(child_budget))
                    .service(ScriptedModel::new([
                        ScriptedTurn::error(ErrorKind::Unavailable, "down"),
                        ScriptedTurn::text("Paris"),
                    ])),
            )
            .build()?;
        let parent = Agent::builder("lead")
            .model(
                ServiceBuilder::new()
                    .layer(exact().budget(parent_budget))
                    .service(ScriptedModel::new([
                        ScriptedTurn::tool_call("research", r#"{"input": "capital of France"}"#),
                        ScriptedTurn::error(ErrorKind::Unavailable, "down"),
                        ScriptedTurn::text("It is Paris."),
                    ])),
            )
            .tools(ToolRouter::new().tool(AgentTool::new("research", "Looks up", child)))
            .build()?;
        Ok(parent.run("Capital of France?").await?.output)
    }

    // Separate pools of one retry each: both retries happen.
    let output = run_tree(Allowance::budget(1), Allowance::budget(1)).await;
    assert_eq!(output.unwrap(), "It is Paris.");

    // One pool of one retry: the child spent it, the parent cannot retry.
    let shared = Allowance::budget(1);
    let err = run_tree(shared.clone(), shared).await.unwrap_err();
    assert_eq!(err.code(), "PROVIDER_UNAVAILABLE");
}

proptest! {
    #[test]
    fn the_backoff_stays_within_its_bounds(
        base_ms in 0u64..20_000,
        max_ms in 0u64..200_000,
        factor in prop_oneof![Just(f64::NAN), Just(f64::INFINITY), -2.0f64..16.0],
        attempt in 0u32..=u32::MAX,
        unit in prop_oneof![Just(f64::NAN), any::<f64>(), 0.0f64..=1.0],
        seed in any::<u64>(),
    ) {
        let base = ms(base_ms);
        let cap = ms(max_ms).max(base);
        let backoff = Backoff::new(base, ms(max_ms)).factor(factor);
        let ceiling = backoff.ceiling(attempt);
        prop_assert!(ceiling <= cap);
        prop_assert!(ceiling >= base);
        prop_assert!(backoff.ceiling(attempt.saturating_add(1)) >= ceiling);
        prop_assert!(backoff.delay_at(attempt, unit) <= ceiling);
        prop_assert!(backoff.clone().seed(seed).delay(attempt) <= ceiling);
        prop_assert!(backoff.delay(attempt) <= ceiling);
        prop_assert_eq!(backoff.clone().jitter(Jitter::None).delay(attempt), ceiling);
        if attempt <= 1 {
            prop_assert_eq!(ceiling, base);
        }
    }
}
