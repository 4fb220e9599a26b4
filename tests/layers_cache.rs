//! The cache layer: in isolation on a tower-test mock, inside full agent
//! runs, and the stability of its key.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use proptest::prelude::*;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::layers::cache::{CacheKey, CacheLayer, CacheStore, MemoryStore};
use tower_agent::types::{
    Message, ModelDelta, ModelRequest, ModelResponse, ModelSettings, Role, ToolCall, ToolSpec,
    Usage,
};
use tower_agent::{
    tool_sync, Agent, BoxError, DeltaSink, ModelCall, ProviderError, RunContext, RunRequest,
    ScriptedModel, ScriptedTurn, ToolRouter,
};
use tower_test::mock;

fn request(text: &str) -> ModelRequest {
    ModelRequest::new("gpt-test", vec![Message::user(text)])
}

fn watched() -> (RunContext, CollectingSink) {
    let sink = CollectingSink::new();
    (RunContext::builder().events(sink.clone()).build(), sink)
}

fn cache_hits(sink: &CollectingSink) -> Vec<String> {
    sink.events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::CacheHit { model, .. } => Some(model.into()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_repeated_request_is_answered_without_the_model() {
    let (mut service, mut handle) =
        mock::spawn_layer::<ModelCall, ModelResponse, _>(CacheLayer::new());

    let (ctx, _) = watched();
    assert!(service.poll_ready().is_ready());
    let first = tokio::spawn(service.call(ModelCall::new(request("hi"), ctx.clone())));
    let (seen, reply) = handle
        .next_request()
        .await
        .expect("the miss reaches the model");
    assert_eq!(seen.request, request("hi"));
    let answer =
        ModelResponse::new("gpt-test-0613", Message::assistant("hello")).usage(Usage::new(10, 5));
    reply.send_response(answer.clone());
    let first = first.await.unwrap().unwrap();
    assert_eq!(first, answer);

    let (ctx, events) = watched();
    assert!(service.poll_ready().is_ready());
    let second = service
        .call(ModelCall::new(request("hi"), ctx.clone()))
        .await
        .unwrap();
    assert!(
        handle.next_request().now_or_never().is_none(),
        "a hit never reaches the model"
    );
    assert_eq!(second.message, answer.message);
    assert_eq!(second.model, "gpt-test-0613");
    assert_eq!(second.finish_reason, answer.finish_reason);
    assert!(second.usage.is_zero());
    assert!(second.usage_recorded);
    assert!(ctx.usage().is_zero());
    assert_eq!(cache_hits(&events), ["gpt-test"]);
}

#[tokio::test]
async fn errors_are_never_cached() {
    let (mut service, mut handle) =
        mock::spawn_layer::<ModelCall, ModelResponse, _>(CacheLayer::new());

    assert!(service.poll_ready().is_ready());
    let first = tokio::spawn(service.call(ModelCall::new(request("hi"), RunContext::new())));
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_error(ProviderError::unavailable("down"));
    assert!(first.await.unwrap().is_err());

    assert!(service.poll_ready().is_ready());
    let second = tokio::spawn(service.call(ModelCall::new(request("hi"), RunContext::new())));
    let (_, reply) = handle
        .next_request()
        .await
        .expect("the failed call was not cached: the model is asked again");
    reply.send_response(ModelResponse::new("gpt-test", Message::assistant("back")));
    assert_eq!(second.await.unwrap().unwrap().message.text(), "back");
}

#[tokio::test]
async fn each_call_moves_the_ready_service_out_and_clones_share_the_cache() {
    let layer = CacheLayer::new();
    let (inner, mut handle) = mock::pair::<ModelCall, ModelResponse>();
    let mut first = mock::Spawn::new(layer.layer(inner.clone()));
    let mut other = mock::Spawn::new(layer.layer(inner));

    // Two calls in flight on one service: each owns the instance made ready
    // for it (the mock panics if a service is called without being ready).
    assert!(first.poll_ready().is_ready());
    let a = tokio::spawn(first.call(ModelCall::new(request("a"), RunContext::new())));
    assert!(first.poll_ready().is_ready());
    let b = tokio::spawn(first.call(ModelCall::new(request("b"), RunContext::new())));
    for _ in 0..2 {
        let (seen, reply) = handle.next_request().await.unwrap();
        let text = seen.request.messages[0].text().into_owned();
        reply.send_response(ModelResponse::new(
            "gpt-test",
            Message::assistant(text.to_uppercase()),
        ));
    }
    assert_eq!(a.await.unwrap().unwrap().message.text(), "A");
    assert_eq!(b.await.unwrap().unwrap().message.text(), "B");

    // Another service of the same layer reads the same store.
    assert!(other.poll_ready().is_ready());
    let hit = other
        .call(ModelCall::new(request("b"), RunContext::new()))
        .await
        .unwrap();
    assert_eq!(hit.message.text(), "B");
    assert!(handle.next_request().now_or_never().is_none());
}

/// A model that answers every request with its call number.
fn counting_model() -> (ScriptedModel, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let model = ScriptedModel::from_fn(move |_| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        ScriptedTurn::text(format!("answer {n}"))
    });
    (model, calls)
}

async fn ask<S>(service: &mut S, request: ModelRequest) -> ModelResponse
where
    S: Service<ModelCall, Response = ModelResponse>,
    S::Error: std::fmt::Debug,
{
    service
        .ready()
        .await
        .unwrap()
        .call(ModelCall::new(request, RunContext::new()))
        .await
        .unwrap()
}

#[tokio::test]
async fn sampled_requests_are_cached_only_when_the_layer_is_told_to() {
    let with = |temperature: Option<f32>| {
        let mut request = request("pick a number");
        request.settings_mut().temperature = temperature;
        request
    };

    let (model, calls) = counting_model();
    let mut cache = CacheLayer::new().layer(model);
    ask(&mut cache, with(Some(0.7))).await;
    ask(&mut cache, with(Some(0.7))).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "temperature 0.7 is not cached"
    );
    ask(&mut cache, with(Some(0.0))).await;
    ask(&mut cache, with(Some(0.0))).await;
    assert_eq!(calls.load(Ordering::SeqCst), 3, "temperature 0 is cached");
    ask(&mut cache, with(None)).await;
    ask(&mut cache, with(None)).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "the provider's default is cached"
    );

    let (model, calls) = counting_model();
    let mut cache = CacheLayer::new().cache_nondeterministic(true).layer(model);
    let first = ask(&mut cache, with(Some(0.7))).await;
    let second = ask(&mut cache, with(Some(0.7))).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(first.message, second.message);
}

#[tokio::test]
async fn a_streamed_hit_reaches_the_sink_in_one_piece() {
    let mut answer = Message::assistant_tool_calls(vec![
        ToolCall::new("call_a", "lookup", r#"{"q":"weather in Paris"}"#),
        ToolCall::new("call_b", "lookup", r#"{"q":"weather in Rome"}"#),
    ]);
    answer.set_text("Let me look both up for you.");
    let model = ScriptedModel::new([ScriptedTurn::message(answer.clone()).chunk_chars(3)]);
    let mut cache = CacheLayer::new().layer(model);

    let streamed = |deltas: &Arc<Mutex<Vec<ModelDelta>>>| {
        let deltas = deltas.clone();
        let mut call = ModelCall::new(request("weather?"), RunContext::new());
        call.stream = Some(DeltaSink::new(move |d| {
            deltas.lock().unwrap().push(d.clone())
        }));
        call
    };
    let live = Arc::new(Mutex::new(Vec::new()));
    cache
        .ready()
        .await
        .unwrap()
        .call(streamed(&live))
        .await
        .unwrap();
    assert!(
        live.lock().unwrap().len() > 3,
        "the model streamed in pieces"
    );

    let replay = Arc::new(Mutex::new(Vec::new()));
    let hit = cache
        .ready()
        .await
        .unwrap()
        .call(streamed(&replay))
        .await
        .unwrap();
    assert_eq!(hit.message, answer);
    assert_eq!(
        *replay.lock().unwrap(),
        [
            ModelDelta::text("Let me look both up for you."),
            ModelDelta::ToolCall {
                index: 0,
                id: Some("call_a".into()),
                name: Some("lookup".into()),
                arguments: r#"{"q":"weather in Paris"}"#.into(),
            },
            ModelDelta::ToolCall {
                index: 1,
                id: Some("call_b".into()),
                name: Some("lookup".into()),
                arguments: r#"{"q":"weather in Rome"}"#.into(),
            },
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn entries_expire_after_their_time_to_live() {
    let (model, calls) = counting_model();
    let mut cache = CacheLayer::new().ttl(Duration::from_secs(60)).layer(model);
    ask(&mut cache, request("hi")).await;
    tokio::time::advance(Duration::from_secs(59)).await;
    assert_eq!(
        ask(&mut cache, request("hi")).await.message.text(),
        "answer 1"
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        ask(&mut cache, request("hi")).await.message.text(),
        "answer 2"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_memory_store_is_bounded() {
    let store = MemoryStore::new(8);
    for i in 0..100 {
        let key = CacheKey::of(&request(&format!("question {i}")));
        let response = ModelResponse::new("m", Message::assistant(format!("answer {i}")));
        store
            .put(key, response, Duration::from_secs(60))
            .await
            .unwrap();
    }
    assert!(store.entry_count() <= 8, "{} entries", store.entry_count());
    // The newest entry is still there.
    let last = CacheKey::of(&request("question 99"));
    assert!(store.get(last).await.unwrap().is_some());

    store.clear();
    assert_eq!(store.entry_count(), 0);
}

/// A store whose backend is down; `at_once` answers without a future.
struct Down {
    at_once: bool,
}

impl CacheStore for Down {
    fn get(&self, _key: CacheKey) -> BoxFuture<'_, Result<Option<ModelResponse>, BoxError>> {
        Box::pin(async { Err("connection refused".into()) })
    }

    fn put(
        &self,
        _key: CacheKey,
        _response: ModelResponse,
        _ttl: Duration,
    ) -> BoxFuture<'_, Result<(), BoxError>> {
        Box::pin(async { Err("connection refused".into()) })
    }

    fn get_now(&self, _key: CacheKey) -> Option<Result<Option<ModelResponse>, BoxError>> {
        self.at_once.then(|| Err("connection refused".into()))
    }

    fn put_now(
        &self,
        _key: CacheKey,
        _response: &ModelResponse,
        _ttl: Duration,
    ) -> Option<Result<(), BoxError>> {
        self.at_once.then(|| Err("connection refused".into()))
    }
}

#[tokio::test]
async fn a_failing_store_fails_open() {
    for at_once in [false, true] {
        let (model, calls) = counting_model();
        let mut cache = CacheLayer::new().store(Down { at_once }).layer(model);
        for expected in ["answer 1", "answer 2"] {
            assert_eq!(
                ask(&mut cache, request("hi")).await.message.text(),
                expected
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2, "at once: {at_once}");
    }
}

/// The store failures of `sink`: (store, operation, failed open).
fn store_failures(sink: &CollectingSink) -> Vec<(&'static str, &'static str, bool)> {
    sink.events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::StoreFailed {
                store,
                operation,
                failed_open,
                ..
            } => Some((store, operation, failed_open)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_failing_store_is_reported_in_the_events() {
    for at_once in [false, true] {
        let (model, _calls) = counting_model();
        let mut cache = CacheLayer::new().store(Down { at_once }).layer(model);
        let (ctx, sink) = watched();
        let response = cache
            .ready()
            .await
            .unwrap()
            .call(ModelCall::new(request("hi"), ctx))
            .await
            .unwrap();
        assert_eq!(response.message.text(), "answer 1");
        assert_eq!(
            store_failures(&sink),
            [("cache", "get", true), ("cache", "put", true)],
            "at once: {at_once}"
        );
    }
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct City {
    city: String,
}

#[tokio::test]
async fn a_second_identical_run_is_answered_from_the_cache() {
    // Two turns of script: a second run that reached the model would fail.
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("weather", r#"{"city": "Paris"}"#).usage(Usage::new(40, 10)),
        ScriptedTurn::text("It is sunny in Paris.").usage(Usage::new(60, 8)),
    ]);
    let tool_runs = Arc::new(AtomicUsize::new(0));
    let runs = tool_runs.clone();
    let weather = tool_sync("weather", "The weather in a city", move |c: City| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, BoxError>(format!("sunny in {}", c.city))
    });
    let agent = Agent::builder("forecaster")
        .instructions("You report the weather.")
        .model_name("gpt-test")
        .model(
            ServiceBuilder::new()
                .layer(CacheLayer::new())
                .service(model.clone()),
        )
        .tools(ToolRouter::new().tool(weather))
        .build()
        .unwrap();

    let (ctx, _) = watched();
    let first = agent
        .clone()
        .oneshot(RunRequest::new("Weather in Paris?").context(ctx))
        .await
        .unwrap();
    assert_eq!(first.usage, Usage::new(100, 18));

    let (ctx, events) = watched();
    let deltas = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let deltas = deltas.clone();
        DeltaSink::new(move |d| deltas.lock().unwrap().push(d.clone()))
    };
    let second = agent
        .clone()
        .oneshot(
            RunRequest::new("Weather in Paris?")
                .context(ctx)
                .stream(sink),
        )
        .await
        .unwrap();

    assert_eq!(second.output, "It is sunny in Paris.");
    assert_eq!(second.messages, first.messages);
    assert!(second.usage.is_zero());
    assert!(second.usage_total.is_zero());
    assert_eq!(second.counters.model_calls, 2);
    assert_eq!(cache_hits(&events), ["gpt-test", "gpt-test"]);
    assert_eq!(
        model.requests().len(),
        2,
        "only the first run reached the model"
    );
    // The cached turn replays the tool call; the tool itself runs again.
    assert_eq!(tool_runs.load(Ordering::SeqCst), 2);
    let completed: Vec<Usage> = events
        .events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::ModelCallCompleted { usage, .. } => Some(usage),
            _ => None,
        })
        .collect();
    assert_eq!(completed, [Usage::default(), Usage::default()]);
    // Streamed, each cached answer arrived whole.
    let deltas = deltas.lock().unwrap();
    assert_eq!(deltas.len(), 2, "{deltas:?}");
    assert!(matches!(&deltas[0], ModelDelta::ToolCall { name: Some(n), .. } if n == "weather"));
    assert_eq!(deltas[1], ModelDelta::text("It is sunny in Paris."));
}

// ---- the key ----

#[derive(Debug, Clone)]
struct Parts {
    model: String,
    messages: Vec<(u8, String)>,
    tools: Vec<(String, String)>,
    temperature: Option<f32>,
    max_tokens: Option<u32>,
    stop: Vec<String>,
}

fn parts() -> impl Strategy<Value = Parts> {
    (
        "[a-z0-9.-]{0,12}",
        prop::collection::vec((0u8..4, ".{0,24}"), 0..8),
        prop::collection::vec(("[a-z_]{1,8}", ".{0,16}"), 0..4),
        prop::option::of(0.0f32..2.0),
        prop::option::of(1u32..4096),
        prop::collection::vec("[a-z]{1,4}", 0..2),
    )
        .prop_map(
            |(model, messages, tools, temperature, max_tokens, stop)| Parts {
                model,
                messages,
                tools,
                temperature,
                max_tokens,
                stop,
            },
        )
}

fn message(role: u8, text: &str) -> Message {
    match role {
        0 => Message::system(text),
        1 => Message::user(text),
        2 => Message::assistant(text),
        _ => Message::tool("call_1", text),
    }
}

/// Builds the request from scratch: fresh history, fresh tool list.
fn build(parts: &Parts) -> ModelRequest {
    let messages: Vec<Message> = parts.messages.iter().map(|(r, t)| message(*r, t)).collect();
    let mut request = ModelRequest::new(parts.model.clone(), messages);
    request.tools = parts
        .tools
        .iter()
        .map(|(name, description)| {
            ToolSpec::new(
                name.clone(),
                description.clone(),
                serde_json::json!({"type": "object", "properties": {"q": {"type": "string"}}}),
            )
        })
        .collect::<Vec<_>>()
        .into();
    request.settings = ModelSettings {
        temperature: parts.temperature,
        max_tokens: parts.max_tokens,
        stop: parts.stop.clone(),
        ..ModelSettings::default()
    }
    .into();
    request
}

proptest! {
    #[test]
    fn equal_requests_have_equal_keys(parts in parts()) {
        let a = build(&parts);
        // The same conversation grown turn by turn, its digest asked for on
        // the way, keys the same as one built at once.
        let mut b = build(&Parts { messages: Vec::new(), ..parts.clone() });
        for (role, text) in &parts.messages {
            let _ = CacheKey::of(&b);
            b.messages.push(message(*role, text));
        }
        prop_assert_eq!(CacheKey::of(&a), CacheKey::of(&b));
        prop_assert_eq!(CacheKey::of(&a), CacheKey::of(&a.clone()));
    }

    #[test]
    fn a_change_in_any_part_changes_the_key(parts in parts(), which in 0usize..9) {
        let before = build(&parts);
        let mut after = parts.clone();
        match which {
            0 => after.model.push('x'),
            1 => after.messages.push((1, "one more".into())),
            2 if !after.messages.is_empty() => after.messages[0].1.push('!'),
            2 => after.messages.push((0, String::new())),
            3 if !after.messages.is_empty() => after.messages[0].0 = (after.messages[0].0 + 1) % 4,
            3 => after.messages.push((2, String::new())),
            4 => after.tools.push(("extra".into(), String::new())),
            5 if !after.tools.is_empty() => after.tools[0].1.push('.'),
            5 => after.tools.push(("t".into(), String::new())),
            6 => after.temperature = Some(after.temperature.map_or(0.5, |t| t + 1.0)),
            7 => after.max_tokens = Some(after.max_tokens.map_or(7, |m| m + 1)),
            _ => after.stop.push("END".into()),
        }
        prop_assert_ne!(CacheKey::of(&before), CacheKey::of(&build(&after)));
    }
}

#[test]
fn role_and_tool_result_id_are_part_of_the_key() {
    let user = ModelRequest::new("m", vec![Message::user("x")]);
    let mut system = user.clone();
    system.messages.to_mut()[0].role = Role::System;
    assert_ne!(CacheKey::of(&user), CacheKey::of(&system));
    let a = ModelRequest::new("m", vec![Message::tool("call_1", "r")]);
    let b = ModelRequest::new("m", vec![Message::tool("call_2", "r")]);
    assert_ne!(CacheKey::of(&a), CacheKey::of(&b));
}

#[test]
fn a_poll_ready_of_the_inner_service_is_forwarded() {
    let (mut service, mut handle) =
        mock::spawn_layer::<ModelCall, ModelResponse, _>(CacheLayer::new());
    handle.allow(0);
    assert_eq!(service.poll_ready().map(|r| r.is_ok()), Poll::Pending);
    handle.allow(1);
    assert!(service.is_woken());
    assert!(matches!(service.poll_ready(), Poll::Ready(Ok(()))));
}

/// A store that reads at once and writes only from a future, through the
/// in-memory store.
struct ReadsNow(MemoryStore);

impl CacheStore for ReadsNow {
    fn get(&self, key: CacheKey) -> BoxFuture<'_, Result<Option<ModelResponse>, BoxError>> {
        self.0.get(key)
    }

    fn put(
        &self,
        key: CacheKey,
        response: ModelResponse,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<(), BoxError>> {
        self.0.put(key, response, ttl)
    }

    fn get_now(&self, key: CacheKey) -> Option<Result<Option<ModelResponse>, BoxError>> {
        self.0.get_now(key)
    }
}

#[tokio::test]
async fn a_store_that_writes_from_a_future_still_caches_the_miss() {
    let (model, calls) = counting_model();
    let store = MemoryStore::default();
    let mut cache = CacheLayer::new()
        .store(ReadsNow(store.clone()))
        .layer(model);
    assert_eq!(
        ask(&mut cache, request("hi")).await.message.text(),
        "answer 1"
    );
    assert_eq!(store.entry_count(), 1, "stored before the answer came back");
    assert_eq!(
        ask(&mut cache, request("hi")).await.message.text(),
        "answer 1"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
