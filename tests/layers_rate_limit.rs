//! The rate-limit layer: in isolation on a tower-test mock and on the
//! scripted model, and two agents drawing on one quota. Everything timed
//! runs on tokio's paused clock.

use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_agent::error::{kind_of, retry_after};
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::layers::rate_limit::{Limits, ModelRateLimitLayer, RateLimited};
use tower_agent::types::{Message, ModelRequest, ModelResponse, ModelSettings, Usage};
use tower_agent::{
    Agent, AgentError, BoxError, ErrorKind, ModelCall, RunContext, RunRequest, ScriptedModel,
    ScriptedTurn,
};
use tower_test::mock;

const MINUTE: Duration = Duration::from_secs(60);

fn request(model: &str, text: &str) -> ModelRequest {
    ModelRequest::new(model, vec![Message::user(text)])
}

/// A request the test estimator prices at `tokens`.
fn priced(text: &str, tokens: u32) -> ModelRequest {
    let mut request = request("m", text);
    request.settings = ModelSettings {
        max_tokens: Some(tokens),
        ..ModelSettings::default()
    }
    .into();
    request
}

fn watched() -> (RunContext, CollectingSink) {
    let sink = CollectingSink::new();
    (RunContext::builder().events(sink.clone()).build(), sink)
}

fn waits(sink: &CollectingSink) -> Vec<(String, Duration)> {
    sink.events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::RateLimitWait { key, waited, .. } => Some((key, waited)),
            _ => None,
        })
        .collect()
}

async fn call<S>(
    service: &mut S,
    request: ModelRequest,
    ctx: RunContext,
) -> Result<ModelResponse, BoxError>
where
    S: Service<ModelCall, Response = ModelResponse, Error = BoxError>,
{
    service
        .ready()
        .await?
        .call(ModelCall::new(request, ctx))
        .await
}

#[tokio::test(start_paused = true)]
async fn calls_over_the_request_limit_wait_for_their_turn() {
    let layer = ModelRateLimitLayer::new().requests(2, Duration::from_secs(10));
    let (mut service, mut handle) = mock::spawn_layer::<ModelCall, ModelResponse, _>(layer);
    let start = Instant::now();

    let mut pending = Vec::new();
    let mut sinks = Vec::new();
    for i in 0..3 {
        let (ctx, sink) = watched();
        assert!(service.poll_ready().is_ready());
        pending.push(tokio::spawn(
            service.call(ModelCall::new(request("m", &format!("q{i}")), ctx)),
        ));
        sinks.push(sink);
    }
    let mut arrivals = Vec::new();
    for _ in 0..3 {
        let (seen, reply) = handle.next_request().await.unwrap();
        arrivals.push((
            seen.request.messages[0].text().into_owned(),
            start.elapsed(),
        ));
        reply.send_response(ModelResponse::new("m", Message::assistant("ok")));
    }
    for call in pending {
        call.await.unwrap().unwrap();
    }
    // A burst of two, then one every 10 s / 2.
    assert_eq!(
        arrivals,
        [
            ("q0".to_owned(), Duration::ZERO),
            ("q1".to_owned(), Duration::ZERO),
            ("q2".to_owned(), Duration::from_secs(5)),
        ]
    );
    assert!(waits(&sinks[0]).is_empty());
    assert!(waits(&sinks[1]).is_empty());
    assert_eq!(waits(&sinks[2]), [("m".to_owned(), Duration::from_secs(5))]);
}

#[tokio::test(start_paused = true)]
async fn waiting_is_first_come_first_served() {
    // 100 tokens per 10 s: a token every 100 ms.
    let layer = ModelRateLimitLayer::new()
        .tokens(100, Duration::from_secs(10))
        .estimate(|r| u64::from(r.settings.max_tokens.unwrap_or(0)));
    let (mut service, mut handle) = mock::spawn_layer::<ModelCall, ModelResponse, _>(layer);

    // `big-2` must wait a whole interval for its tokens. The small calls
    // come a second later, when 10 tokens are back: they would fit, but
    // must not pass it.
    let order = [
        ("big-1", 100),
        ("big-2", 100),
        ("small-3", 1),
        ("small-4", 1),
    ];
    let mut pending = Vec::new();
    for (i, (name, tokens)) in order.into_iter().enumerate() {
        if i == 2 {
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert!(service.poll_ready().is_ready());
        let fut = service.call(ModelCall::new(priced(name, tokens), RunContext::new()));
        pending.push(tokio::spawn(fut));
    }
    let mut arrived = Vec::new();
    for _ in 0..order.len() {
        let (seen, reply) = handle.next_request().await.unwrap();
        let tokens = u64::from(seen.request.settings.max_tokens.unwrap());
        arrived.push(seen.request.messages[0].text().into_owned());
        reply.send_response(
            ModelResponse::new("m", Message::assistant("ok")).usage(Usage::new(tokens, 0)),
        );
    }
    for call in pending {
        call.await.unwrap().unwrap();
    }
    assert_eq!(arrived, ["big-1", "big-2", "small-3", "small-4"]);
}

#[tokio::test(start_paused = true)]
async fn a_call_that_would_wait_longer_than_max_wait_fails_at_once() {
    let layer = ModelRateLimitLayer::new()
        .requests(1, MINUTE)
        .max_wait(Duration::from_secs(10));
    let (mut service, mut handle) = mock::spawn_layer::<ModelCall, ModelResponse, _>(layer);

    assert!(service.poll_ready().is_ready());
    let first = tokio::spawn(service.call(ModelCall::new(request("m", "a"), RunContext::new())));
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_response(ModelResponse::new("m", Message::assistant("ok")));
    first.await.unwrap().unwrap();

    let start = Instant::now();
    assert!(service.poll_ready().is_ready());
    let err = service
        .call(ModelCall::new(request("m", "b"), RunContext::new()))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO, "refused without waiting");
    assert!(
        handle.next_request().now_or_never().is_none(),
        "a refused call never reaches the model"
    );
    let limited = err
        .downcast_ref::<RateLimited>()
        .expect("a RateLimited leaf");
    assert_eq!(limited.key(), "m");
    assert_eq!(limited.retry_after(), MINUTE);
    assert_eq!(kind_of(err.as_ref()), ErrorKind::RateLimited);
    assert_eq!(retry_after(err.as_ref()), Some(MINUTE));
    let classified = AgentError::classify(err);
    assert_eq!(classified.code(), "RATE_LIMITED");
    assert!(matches!(&classified, AgentError::Provider(p) if p.retry_after_hint() == Some(MINUTE)));

    // A run whose deadline comes first fails at once too.
    let ctx = RunContext::builder()
        .timeout(Duration::from_secs(5))
        .build();
    let layer = ModelRateLimitLayer::new().requests(1, MINUTE);
    let mut service = layer.layer(ScriptedModel::from_fn(|_| ScriptedTurn::text("ok")));
    call(&mut service, request("m", "a"), ctx.clone())
        .await
        .unwrap();
    let err = call(&mut service, request("m", "b"), ctx)
        .await
        .unwrap_err();
    assert_eq!(kind_of(err.as_ref()), ErrorKind::RateLimited);
}

#[tokio::test(start_paused = true)]
async fn tokens_are_reserved_from_the_estimate_and_settled_with_the_usage() {
    // 1,000 tokens a minute (60 ms a token); every call is estimated at 800.
    let limits = || {
        ModelRateLimitLayer::new()
            .tokens(1_000, MINUTE)
            .estimate(|_| 800)
            .max_wait(MINUTE)
    };

    // Used less than estimated: the rest comes back.
    let model = ScriptedModel::new([
        ScriptedTurn::text("a").usage(Usage::new(60, 40)),
        ScriptedTurn::text("b").usage(Usage::new(700, 100)),
        ScriptedTurn::text("c").usage(Usage::new(700, 100)),
    ]);
    let mut service = limits().layer(model);
    let (ctx, sink) = watched();
    for text in ["a", "b", "c"] {
        call(&mut service, request("m", text), ctx.clone())
            .await
            .unwrap();
    }
    // 1,000 − 100 − 800 leaves 100: the third call waits for 700 more.
    assert_eq!(waits(&sink), [("m".to_owned(), Duration::from_secs(42))]);

    // Used more than estimated: the difference is charged.
    let model = ScriptedModel::new([
        ScriptedTurn::text("a").usage(Usage::new(900, 100)),
        ScriptedTurn::text("b").usage(Usage::new(700, 100)),
    ]);
    let mut service = limits().layer(model);
    let (ctx, sink) = watched();
    for text in ["a", "b"] {
        call(&mut service, request("m", text), ctx.clone())
            .await
            .unwrap();
    }
    // The first call took the whole minute's 1,000: 800 more take 48 s.
    assert_eq!(waits(&sink), [("m".to_owned(), Duration::from_secs(48))]);
}

#[tokio::test(start_paused = true)]
async fn a_refund_lets_the_waiting_head_go_early() {
    let layer = ModelRateLimitLayer::new()
        .tokens(1_000, MINUTE)
        .estimate(|_| 800)
        .max_wait(MINUTE);
    let (mut service, mut handle) = mock::spawn_layer::<ModelCall, ModelResponse, _>(layer);
    let start = Instant::now();

    assert!(service.poll_ready().is_ready());
    let first = tokio::spawn(service.call(ModelCall::new(request("m", "a"), RunContext::new())));
    let (_, reply_a) = handle.next_request().await.unwrap();
    // The second needs 800 with 200 left: it is due in 36 s.
    assert!(service.poll_ready().is_ready());
    let second = tokio::spawn(service.call(ModelCall::new(request("m", "b"), RunContext::new())));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(handle.next_request().now_or_never().is_none());

    // The first used 100 of its 800: the refund admits the second now.
    reply_a
        .send_response(ModelResponse::new("m", Message::assistant("ok")).usage(Usage::new(90, 10)));
    first.await.unwrap().unwrap();
    let (_, reply_b) = handle.next_request().await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    reply_b.send_response(
        ModelResponse::new("m", Message::assistant("ok")).usage(Usage::new(700, 100)),
    );
    second.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_default_estimate_is_the_text_plus_the_output_allowance() {
    let layer = ModelRateLimitLayer::new()
        .tokens(1_000, MINUTE)
        .max_wait(Duration::ZERO);
    let mut service = layer.layer(ScriptedModel::from_fn(|_| {
        ScriptedTurn::text("ok").usage(Usage::new(1_000, 0))
    }));
    // 400 bytes of text (100 tokens) plus max_tokens 950: over the limit,
    // so it reserves the whole limit, which a full bucket grants at once.
    let mut big = request("m", &"x".repeat(400));
    big.settings_mut().max_tokens = Some(950);
    call(&mut service, big, RunContext::new()).await.unwrap();
    // Nothing is left; the next call's default estimate (its text plus
    // 1,024 output tokens, cut to the limit) needs a full minute.
    let err = call(&mut service, request("m", "hi"), RunContext::new())
        .await
        .unwrap_err();
    assert_eq!(retry_after(err.as_ref()), Some(MINUTE));
}

#[tokio::test(start_paused = true)]
async fn a_failed_call_keeps_its_reservation() {
    let layer = ModelRateLimitLayer::new()
        .tokens(100, Duration::from_secs(10))
        .estimate(|_| 100)
        .max_wait(Duration::ZERO);
    let mut service = layer.layer(ScriptedModel::new([ScriptedTurn::error(
        ErrorKind::Unavailable,
        "down",
    )]));
    let err = call(&mut service, request("m", "a"), RunContext::new())
        .await
        .unwrap_err();
    assert_eq!(kind_of(err.as_ref()), ErrorKind::Unavailable);
    let err = call(&mut service, request("m", "b"), RunContext::new())
        .await
        .unwrap_err();
    assert_eq!(retry_after(err.as_ref()), Some(Duration::from_secs(10)));
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_waiting_gives_its_reservation_back() {
    let layer = ModelRateLimitLayer::new().requests(1, Duration::from_secs(10));
    let mut service = layer.layer(ScriptedModel::from_fn(|_| ScriptedTurn::text("ok")));
    call(&mut service, request("m", "a"), RunContext::new())
        .await
        .unwrap();

    // Queued for the slot at t = 10 s, then cancelled.
    let mut waiting = Box::pin(
        service
            .ready()
            .await
            .unwrap()
            .call(ModelCall::new(request("m", "b"), RunContext::new())),
    );
    assert!((&mut waiting).now_or_never().is_none());
    drop(waiting);

    // It left the queue: the next call gets that slot, not the one after.
    let (ctx, sink) = watched();
    call(&mut service, request("m", "c"), ctx).await.unwrap();
    assert_eq!(waits(&sink), [("m".to_owned(), Duration::from_secs(10))]);
}

#[tokio::test(start_paused = true)]
async fn each_key_has_its_own_quota() {
    let layer = ModelRateLimitLayer::new()
        .requests(1, MINUTE)
        .limits_for("gpt-mini", Limits::new().requests(2, MINUTE))
        .max_wait(Duration::ZERO);
    let service = layer.layer(ScriptedModel::from_fn(|_| ScriptedTurn::text("ok")));
    let outcome = |model: &'static str| {
        let mut service = service.clone();
        async move {
            call(&mut service, request(model, "hi"), RunContext::new())
                .await
                .is_ok()
        }
    };
    assert!(outcome("gpt-big").await);
    assert!(outcome("gpt-mini").await);
    assert!(outcome("gpt-mini").await);
    assert!(!outcome("gpt-big").await);
    assert!(!outcome("gpt-mini").await);
    assert!(outcome("claude").await);

    // A key function groups calls its own way: here, one quota for all.
    let layer = ModelRateLimitLayer::new()
        .requests(1, MINUTE)
        .key_fn(|_| "tenant-7".to_owned())
        .max_wait(Duration::ZERO);
    let mut service = layer.layer(ScriptedModel::from_fn(|_| ScriptedTurn::text("ok")));
    call(&mut service, request("a", "hi"), RunContext::new())
        .await
        .unwrap();
    let err = call(&mut service, request("b", "hi"), RunContext::new())
        .await
        .unwrap_err();
    assert_eq!(err.downcast_ref::<RateLimited>().unwrap().key(), "tenant-7");
}

#[tokio::test(start_paused = true)]
async fn a_layer_bound_to_one_key_reserves_in_poll_ready() {
    let layer = ModelRateLimitLayer::new()
        .key("gpt-4o")
        .requests(1, Duration::from_secs(10));
    let (inner, mut handle) = mock::pair::<ModelCall, ModelResponse>();
    let mut first = mock::Spawn::new(layer.layer(inner));

    // Ready: the one slot is reserved for `first`. A clone starts without
    // it, and has to wait for the next slot: backpressure.
    assert!(first.poll_ready().is_ready());
    let mut second = mock::Spawn::new(first.get_ref().clone());
    assert!(second.poll_ready().is_pending());
    let mut third = mock::Spawn::new(first.get_ref().clone());
    assert!(third.poll_ready().is_pending());

    // `first` gives its slot back unused when dropped: the first in line
    // gets it at once, the next keeps waiting.
    drop(first);
    assert!(second.is_woken());
    assert!(second.poll_ready().is_ready());
    assert!(third.poll_ready().is_pending());

    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(third.is_woken());
    assert!(third.poll_ready().is_ready());

    let mut answered = Vec::new();
    let mut sinks = Vec::new();
    for service in [&mut second, &mut third] {
        let (ctx, sink) = watched();
        answered.push(tokio::spawn(
            service.call(ModelCall::new(request("ignored", "hi"), ctx)),
        ));
        sinks.push(sink);
    }
    for _ in 0..2 {
        let (_, reply) = handle.next_request().await.unwrap();
        reply.send_response(ModelResponse::new("gpt-4o", Message::assistant("ok")));
    }
    for call in answered {
        call.await.unwrap().unwrap();
    }
    assert!(waits(&sinks[0]).is_empty());
    assert_eq!(
        waits(&sinks[1]),
        [("gpt-4o".to_owned(), Duration::from_secs(10))]
    );
}

#[tokio::test(start_paused = true)]
async fn a_bound_layer_refuses_from_call_not_from_poll_ready() {
    let layer = ModelRateLimitLayer::new()
        .key("gpt-4o")
        .requests(1, MINUTE)
        .max_wait(Duration::ZERO);
    let mut service = layer.layer(ScriptedModel::from_fn(|_| ScriptedTurn::text("ok")));
    call(&mut service, request("m", "a"), RunContext::new())
        .await
        .unwrap();
    // `ready()` succeeds; the refusal comes from the call.
    let ready = service
        .ready()
        .await
        .expect("poll_ready never fails for the quota");
    let err = ready
        .call(ModelCall::new(request("m", "b"), RunContext::new()))
        .await
        .unwrap_err();
    assert_eq!(err.downcast_ref::<RateLimited>().unwrap().key(), "gpt-4o");
    // And the service is usable once the minute has passed.
    tokio::time::advance(MINUTE).await;
    call(&mut service, request("m", "c"), RunContext::new())
        .await
        .unwrap();
}

#[test]
fn limits_of_zero_are_a_configuration_error() {
    let err = ModelRateLimitLayer::new()
        .requests(0, MINUTE)
        .validate()
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_CONFIG");
    let err = ModelRateLimitLayer::new()
        .limits_for("m", Limits::new().tokens(10, Duration::ZERO))
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("`m`"));
}

fn agent(name: &str, layer: &ModelRateLimitLayer) -> Agent {
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::text("done").usage(Usage::new(10, 2)));
    Agent::builder(name)
        .model_name("gpt-4o")
        .model(ServiceBuilder::new().layer(layer.clone()).service(model))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn two_agents_sharing_one_layer_draw_on_one_quota() {
    let layer = ModelRateLimitLayer::new()
        .requests(2, MINUTE)
        .tokens(100_000, MINUTE);
    let (support, billing) = (agent("support", &layer), agent("billing", &layer));

    let run = |agent: &Agent| {
        let (ctx, sink) = watched();
        let fut = agent.clone().oneshot(RunRequest::new("hello").context(ctx));
        async move { (fut.await, sink) }
    };
    let (first, first_events) = run(&support).await;
    let (second, second_events) = run(&billing).await;
    assert!(first.unwrap().is_completed());
    assert!(second.unwrap().is_completed());
    assert!(waits(&first_events).is_empty());
    assert!(waits(&second_events).is_empty());

    // The two runs spent the minute's two requests between them.
    let (third, third_events) = run(&support).await;
    assert!(third.unwrap().is_completed());
    assert_eq!(
        waits(&third_events),
        [("gpt-4o".to_owned(), Duration::from_secs(30))]
    );

    // With no waiting allowed, the other agent's run fails as rate-limited.
    let strict = ModelRateLimitLayer::new()
        .requests(1, MINUTE)
        .max_wait(Duration::ZERO);
    agent("support", &strict).run("hello").await.unwrap();
    let err = agent("billing", &strict).run("hello").await.unwrap_err();
    assert_eq!(err.code(), "RATE_LIMITED");
    assert!(matches!(&err, AgentError::Provider(p) if p.retry_after_hint() == Some(MINUTE)));
}
