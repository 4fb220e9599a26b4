//! The fallback layer: on tower-test mocks, in full agent runs (models on
//! one provider, services of several), with hooks and a budget shared with
//! the retry layer, and the exact usage of a run mixing retry and fallback.

use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower::retry::budget::Budget;
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::layers::fallback::error::FallbackExhausted;
use tower_agent::layers::fallback::{Fallback, FallbackLayer, Target};
use tower_agent::layers::retry::{Backoff, Jitter, LlmRetryLayer, RetryBudget};
use tower_agent::lifecycle::{Hook, LifecycleLayer, Middleware, MiddlewareStack};
use tower_agent::types::{Message, ModelDelta, ModelRequest, ModelResponse, Usage};
use tower_agent::{
    tool_sync, Agent, AgentError, BoxError, DeltaSink, ErrorKind, ModelCall, ProviderError,
    RunContext, RunRequest, ScriptedModel, ScriptedTurn, ToolRouter,
};
use tower_test::mock;

type Model = mock::Mock<ModelCall, ModelResponse>;
type Handle = mock::Handle<ModelCall, ModelResponse>;

async fn settle<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(24 * 3600), f)
        .await
        .expect("the test stalled")
}

fn model_call(ctx: &RunContext, model: &str) -> ModelCall {
    ModelCall::new(
        ModelRequest::new(model, vec![Message::user("hi")]),
        ctx.clone(),
    )
}

fn traced() -> (RunContext, CollectingSink) {
    let sink = CollectingSink::new();
    (RunContext::builder().events(sink.clone()).build(), sink)
}

/// `(from, to, code)` of every fallback event.
fn switches(sink: &CollectingSink) -> Vec<(String, String, &'static str)> {
    sink.events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::FallbackUsed { from, to, code, .. } => Some((from.into(), to.into(), code)),
            _ => None,
        })
        .collect()
}

/// A budget allowing `n` withdrawals in all.
struct Allowance(AtomicI64);

impl Budget for Allowance {
    fn deposit(&self) {}

    fn withdraw(&self) -> bool {
        self.0.fetch_sub(1, Ordering::SeqCst) > 0
    }
}

fn allowance(n: i64) -> RetryBudget {
    RetryBudget::new(Allowance(AtomicI64::new(n)))
}

/// A primary mock with a backup mock called `backup`.
fn pair(
    layer: impl Fn(Model) -> FallbackLayer<Model>,
) -> (mock::Spawn<Fallback<Model>>, Handle, Handle) {
    let (backup, backup_handle) = mock::pair::<ModelCall, ModelResponse>();
    let (svc, handle) = mock::spawn_layer(layer(backup));
    (svc, handle, backup_handle)
}

async fn fail(handle: &mut Handle, err: impl Into<BoxError>) -> ModelCall {
    let (req, send) = settle(handle.next_request()).await.expect("a request");
    send.send_error(err);
    req
}

#[tokio::test(start_paused = true)]
async fn mock_moves_to_the_next_service_on_a_provider_error() {
    let (mut svc, mut primary, mut backup) = pair(|b| FallbackLayer::new().service_as("backup", b));
    let (ctx, sink) = traced();
    assert!(svc.poll_ready().is_ready());
    let response = tokio::spawn(svc.call(model_call(&ctx, "main")));
    fail(&mut primary, ProviderError::unavailable("overloaded")).await;
    let (req, send) = settle(backup.next_request()).await.unwrap();
    assert_eq!(req.request.model, "backup");
    assert_eq!(req.request.messages.to_vec(), [Message::user("hi")]);
    // The service leaves the model empty: the fallback names who answered.
    send.send_response(ModelResponse::new("", Message::assistant("hello")));
    let response = settle(response).await.unwrap().unwrap();
    assert_eq!(response.model, "backup");
    assert_eq!(
        switches(&sink),
        [("main".into(), "backup".into(), "PROVIDER_UNAVAILABLE")]
    );
}

#[tokio::test(start_paused = true)]
async fn mock_returns_other_errors_at_once() {
    for err in [
        ProviderError::new(ErrorKind::InvalidRequest, "bad"),
        ProviderError::new(ErrorKind::ContextLength, "too long"),
        ProviderError::new(ErrorKind::Auth, "no key"),
        ProviderError::new(ErrorKind::QuotaExhausted, "no credit"),
    ] {
        let kind = err.kind();
        let (mut svc, mut primary, mut backup) = pair(|b| FallbackLayer::new().service(b));
        let (ctx, sink) = traced();
        assert!(svc.poll_ready().is_ready());
        let response = tokio::spawn(svc.call(model_call(&ctx, "main")));
        fail(&mut primary, err).await;
        let err = settle(response).await.unwrap().unwrap_err();
        assert_eq!(AgentError::classify(err).kind(), kind);
        assert!(switches(&sink).is_empty());
        drop(svc);
        assert!(settle(backup.next_request()).await.is_none(), "{kind:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn mock_lists_every_attempt_when_all_fail() {
    let (mut svc, mut primary, mut backup) = pair(|b| {
        FallbackLayer::new()
            .service_as("backup", b)
            .model("main-mini")
    });
    let (ctx, sink) = traced();
    assert!(svc.poll_ready().is_ready());
    let response = tokio::spawn(svc.call(model_call(&ctx, "main")));
    fail(&mut primary, ProviderError::unavailable("down")).await;
    fail(
        &mut backup,
        ProviderError::new(ErrorKind::Other, "bad gateway").status(502),
    )
    .await;
    let mini = fail(
        &mut primary,
        ProviderError::rate_limited("slow down", Some(Duration::from_secs(4))),
    )
    .await;
    assert_eq!(mini.request.model, "main-mini");

    let err = settle(response).await.unwrap().unwrap_err();
    let exhausted = err.downcast_ref::<FallbackExhausted>().unwrap();
    let tried: Vec<_> = exhausted
        .attempts()
        .iter()
        .map(|a| (a.model().to_owned(), a.error().to_string()))
        .collect();
    assert_eq!(
        tried,
        [
            ("main".into(), "PROVIDER_UNAVAILABLE: down".into()),
            ("backup".into(), "INTERNAL: bad gateway (HTTP 502)".into()),
            ("main-mini".into(), "RATE_LIMITED: slow down".into()),
        ]
    );
    assert_eq!(exhausted.kind(), ErrorKind::RateLimited);
    assert_eq!(
        switches(&sink),
        [
            ("main".into(), "backup".into(), "PROVIDER_UNAVAILABLE"),
            ("backup".into(), "main-mini".into(), "INTERNAL"),
        ]
    );
    // The run classifies it as its last error, Retry-After kept.
    match AgentError::classify(err) {
        AgentError::Provider(p) => {
            assert_eq!(p.kind(), ErrorKind::RateLimited);
            assert_eq!(p.retry_after_hint(), Some(Duration::from_secs(4)));
            assert!(p.message().starts_with("every model failed: main: "));
        }
        other => panic!("classified as {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn mock_an_empty_budget_stops_the_switch() {
    let budget = allowance(1);
    let (mut svc, mut primary, mut backup) =
        pair(|b| FallbackLayer::new().service(b).budget(budget.clone()));
    let ctx = RunContext::new();

    assert!(svc.poll_ready().is_ready());
    let response = tokio::spawn(svc.call(model_call(&ctx, "main")));
    fail(&mut primary, ProviderError::unavailable("down")).await;
    let (_, send) = settle(backup.next_request()).await.unwrap();
    send.send_response(ModelResponse::new("backup", Message::assistant("ok")));
    assert!(settle(response).await.unwrap().is_ok());

    assert!(svc.poll_ready().is_ready());
    let response = tokio::spawn(svc.call(model_call(&ctx, "main")));
    fail(&mut primary, ProviderError::unavailable("still down")).await;
    let err = settle(response).await.unwrap().unwrap_err();
    assert_eq!(err.to_string(), "PROVIDER_UNAVAILABLE: still down");
    drop(svc);
    assert!(settle(backup.next_request()).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn mock_does_not_repeat_streamed_text_on_another_model() {
    let (mut svc, mut primary, mut backup) = pair(|b| FallbackLayer::new().service(b));
    let (sink, mut deltas) = DeltaSink::channel();
    let mut call = model_call(&RunContext::new(), "main");
    call.stream = Some(sink);
    assert!(svc.poll_ready().is_ready());
    let response = tokio::spawn(svc.call(call));
    let (streaming, send) = settle(primary.next_request()).await.unwrap();
    streaming
        .stream
        .as_ref()
        .unwrap()
        .send(&ModelDelta::text("Hel"));
    send.send_error(ProviderError::unavailable("reset"));
    assert!(settle(response).await.unwrap().is_err());
    assert_eq!(deltas.try_recv().unwrap(), ModelDelta::text("Hel"));
    drop(svc);
    assert!(settle(backup.next_request()).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn mock_forwards_readiness_of_the_first_service() {
    let (mut svc, mut primary, _backup) = pair(|b| FallbackLayer::new().service(b));
    primary.allow(0);
    assert!(svc.poll_ready().is_pending());
    primary.allow(1);
    assert!(svc.poll_ready().is_ready());
    assert_eq!(svc.get_ref().target_models().collect::<Vec<_>>(), [None]);
}

/// A middleware that only decides model switches (and records what it was
/// asked), installed through the real lifecycle layer.
struct SwitchGate {
    allow: bool,
    asked: Mutex<Vec<(String, String)>>,
}

impl SwitchGate {
    fn new(allow: bool) -> Arc<Self> {
        Arc::new(Self {
            allow,
            asked: Mutex::default(),
        })
    }
}

impl Middleware for SwitchGate {
    fn name(&self) -> &str {
        "switch-gate"
    }

    fn before_model_switch<'a>(
        &'a self,
        _ctx: &'a RunContext,
        from: &'a str,
        to: &'a str,
    ) -> Hook<'a, bool> {
        self.asked
            .lock()
            .unwrap()
            .push((from.to_owned(), to.to_owned()));
        Hook::ok(self.allow)
    }
}

/// One provider: `big` is down, every other model answers with its name.
fn provider() -> ScriptedModel {
    ScriptedModel::from_fn(|request| match request.model.as_str() {
        "big" => ScriptedTurn::error(ErrorKind::Unavailable, "big is overloaded"),
        model => ScriptedTurn::text(format!("{model} here")).usage(Usage::new(10, 2)),
    })
}

#[tokio::test(start_paused = true)]
async fn a_full_run_falls_back_across_models_of_one_provider() {
    let model = provider();
    let agent = Agent::builder("assistant")
        .model(FallbackLayer::new().models(["small"]).layer(model.clone()))
        .model_name("big")
        .build()
        .unwrap();
    let (ctx, sink) = traced();
    let run = agent
        .oneshot(RunRequest::new("Hi").context(ctx.clone()))
        .await
        .unwrap();
    assert_eq!(run.output, "small here");
    assert_eq!(
        switches(&sink),
        [("big".into(), "small".into(), "PROVIDER_UNAVAILABLE")]
    );
    let answered: Vec<_> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::ModelCallCompleted { model, .. } => Some(model),
            _ => None,
        })
        .collect();
    assert_eq!(answered, ["small"]);
    let models: Vec<_> = model.requests().into_iter().map(|r| r.model).collect();
    assert_eq!(models, ["big", "small"]);
    assert_eq!(ctx.usage_entries()[0].model, "small");
}

#[tokio::test(start_paused = true)]
async fn a_full_run_asks_the_hooks_before_switching() {
    for allow in [true, false] {
        let gate = SwitchGate::new(allow);
        let agent = Agent::builder("assistant")
            .model(FallbackLayer::new().models(["small"]).layer(provider()))
            .model_name("big")
            .build()
            .unwrap();
        let stack = MiddlewareStack::new().push_arc(gate.clone());
        let agent = LifecycleLayer::new(stack).layer(agent);
        let result = agent.oneshot(RunRequest::new("Hi")).await;
        assert_eq!(
            *gate.asked.lock().unwrap(),
            [("big".to_owned(), "small".to_owned())]
        );
        if allow {
            assert_eq!(result.unwrap().output, "small here");
        } else {
            let err = result.unwrap_err();
            assert_eq!(err.code(), "PROVIDER_UNAVAILABLE");
            assert_eq!(err.to_string(), "PROVIDER_UNAVAILABLE: big is overloaded");
        }
    }
}

fn exact_retry(budget: RetryBudget) -> LlmRetryLayer {
    LlmRetryLayer::new().max_attempts(2).budget(budget).backoff(
        Backoff::new(Duration::from_millis(100), Duration::from_secs(1)).jitter(Jitter::None),
    )
}

#[tokio::test(start_paused = true)]
async fn retry_and_fallback_draw_on_one_budget() {
    // Every model is down. With one pool of two extra calls, the fallback
    // spends one, the retry one, and the retried call's fallback finds the
    // pool empty: three calls in all instead of four.
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::error(ErrorKind::Unavailable, "down"));
    let budget = allowance(2);
    let stack = ServiceBuilder::new()
        .layer(exact_retry(budget.clone()))
        .layer(FallbackLayer::new().models(["small"]).budget(budget))
        .service(model.clone());
    let agent = Agent::builder("a")
        .model(stack)
        .model_name("big")
        .build()
        .unwrap();
    let err = agent.run("Hi").await.unwrap_err();
    assert_eq!(err.code(), "PROVIDER_UNAVAILABLE");
    let models: Vec<_> = model.requests().into_iter().map(|r| r.model).collect();
    assert_eq!(models, ["big", "small", "big"]);
}

#[tokio::test(start_paused = true)]
async fn usage_is_exact_in_a_run_mixing_retry_and_fallback() {
    // `big` bills every call (a stream that broke after tokens were spent)
    // and then fails; `small` fails once, then answers.
    let big = service_fn(|call: ModelCall| async move {
        call.context.record_usage("big", Usage::new(100, 7));
        Err::<ModelResponse, BoxError>(ProviderError::unavailable("stream reset").into())
    });
    let small = ScriptedModel::new([
        ScriptedTurn::error(ErrorKind::Unavailable, "busy"),
        ScriptedTurn::tool_call("lookup", r#"{"key": "a"}"#).usage(Usage::new(20, 4)),
        ScriptedTurn::text("done").usage(Usage::new(30, 5)),
    ]);
    let budget = RetryBudget::default();
    let stack = ServiceBuilder::new()
        .layer(exact_retry(budget.clone()))
        .layer(
            FallbackLayer::new()
                .target(Target::service_as(
                    "small",
                    tower_agent::service::box_model(small.clone()),
                ))
                .budget(budget),
        )
        .service(tower_agent::service::box_model(big));

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Key {
        key: String,
    }
    let agent = Agent::builder("a")
        .model(stack)
        .model_name("big")
        .tools(
            ToolRouter::new().tool(tool_sync("lookup", "Looks up", |k: Key| {
                Ok::<_, BoxError>(format!("value of {}", k.key))
            })),
        )
        .build()
        .unwrap();
    let (ctx, sink) = traced();
    let run = agent
        .oneshot(RunRequest::new("go").context(ctx.clone()))
        .await
        .unwrap();
    assert_eq!(run.output, "done");

    // Turn 1: big (billed) → small (failed) → retry: big (billed) → small answers.
    // Turn 2: big (billed) → small answers.
    let entries: Vec<_> = ctx
        .usage_entries()
        .into_iter()
        .map(|e| (e.model.to_string(), e.usage))
        .collect();
    assert_eq!(
        entries,
        [
            ("big".to_owned(), Usage::new(100, 7)),
            ("big".to_owned(), Usage::new(100, 7)),
            ("small".to_owned(), Usage::new(20, 4)),
            ("big".to_owned(), Usage::new(100, 7)),
            ("small".to_owned(), Usage::new(30, 5)),
        ]
    );
    assert_eq!(run.usage, Usage::new(350, 30));
    assert_eq!(run.usage_total, Usage::new(350, 30));
    assert_eq!(run.counters.model_calls, 2);
    assert_eq!(small.remaining(), 0);
    let retried = sink
        .events()
        .iter()
        .filter(|e| matches!(e, AgentEvent::RetryAttempt { .. }))
        .count();
    assert_eq!((retried, switches(&sink).len()), (1, 3));
}

#[tokio::test(start_paused = true)]
async fn an_answer_its_service_did_not_record_is_recorded_once() {
    // A model service of one's own that leaves recording to the run.
    let plain = service_fn(|call: ModelCall| async move {
        let mut response = ModelResponse::new(call.request.model.clone(), Message::assistant("hi"));
        response.usage = Usage::new(8, 1);
        Ok::<_, BoxError>(response)
    });
    let flaky = ScriptedModel::new([ScriptedTurn::error(ErrorKind::Unavailable, "down")]);
    let stack = ServiceBuilder::new()
        .layer(exact_retry(RetryBudget::default()))
        .layer(FallbackLayer::new().service_as("plain", tower_agent::service::box_model(plain)))
        .service(tower_agent::service::box_model(flaky));
    let agent = Agent::builder("a")
        .model(stack)
        .model_name("flaky")
        .build()
        .unwrap();
    let ctx = RunContext::new();
    let run = agent
        .oneshot(RunRequest::new("Hi").context(ctx.clone()))
        .await
        .unwrap();
    assert_eq!(run.output, "hi");
    assert_eq!(run.usage, Usage::new(8, 1));
    assert_eq!(ctx.usage_entries().len(), 1);
    assert_eq!(ctx.usage_entries()[0].model, "plain");
}
