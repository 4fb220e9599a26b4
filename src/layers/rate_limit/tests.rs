//! The paths of the layer that the integration tests do not reach: a
//! response future dropped before or after it was first polled (the
//! inner service was called either way), a call
//! that used exactly its estimate, the key lookup under threads, the
//! future's `Debug`, settlements beyond the posting slots.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tower::{Layer, Service, ServiceExt};
use tower_test::mock;

use super::limiter::Limiter;
use super::limits::Config;
use super::{ModelRateLimitLayer, RateLimited};
use crate::types::{Message, ModelRequest, ModelResponse, Usage};
use crate::{BoxError, ModelCall, RunContext, ScriptedModel, ScriptedTurn};

fn call(model: &str) -> ModelCall {
    ModelCall::new(
        ModelRequest::new(model, vec![Message::user("hi")]),
        RunContext::new(),
    )
}

fn one_a_minute() -> ModelRateLimitLayer {
    ModelRateLimitLayer::new()
        .requests(1, Duration::from_secs(60))
        .tokens(10_000, Duration::from_secs(60))
        .max_wait(Duration::ZERO)
}

/// The next call is refused for the rest of the minute.
async fn the_minute_is_spent(
    service: &mut mock::Spawn<impl Service<ModelCall, Response = ModelResponse, Error = BoxError>>,
) {
    assert!(service.poll_ready().is_ready());
    let err = service.call(call("m")).await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<RateLimited>().unwrap().retry_after(),
        Duration::from_secs(60)
    );
}

#[tokio::test(start_paused = true)]
async fn a_future_dropped_unpolled_keeps_its_reservation_once_the_inner_service_was_called() {
    // A tower service may send the request from `call`, before any poll.
    let (mut service, mut handle) =
        mock::spawn_layer::<ModelCall, ModelResponse, _>(one_a_minute());
    assert!(service.poll_ready().is_ready());
    let unpolled = service.call(call("m"));
    assert!(format!("{unpolled:?}").contains("Called"));
    let (_, _reply) = handle.next_request().await.unwrap();
    drop(unpolled);

    the_minute_is_spent(&mut service).await;
}

#[tokio::test(start_paused = true)]
async fn a_future_dropped_once_its_call_went_out_keeps_its_reservation() {
    let (mut service, mut handle) =
        mock::spawn_layer::<ModelCall, ModelResponse, _>(one_a_minute());
    assert!(service.poll_ready().is_ready());
    let mut sent = Box::pin(service.call(call("m")));
    // First poll: the call goes out, and the model has not answered.
    assert!((&mut sent).now_or_never().is_none());
    let (_, _reply) = handle.next_request().await.unwrap();
    drop(sent);

    the_minute_is_spent(&mut service).await;
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_debug_and_answers_once() {
    let mut service = one_a_minute().layer(ScriptedModel::from_fn(|_| ScriptedTurn::text("ok")));
    service
        .ready()
        .await
        .unwrap()
        .call(call("m"))
        .await
        .unwrap();
    let refused = service.ready().await.unwrap().call(call("m"));
    assert!(format!("{refused:?}").contains("Refused"));
    assert!(refused.await.is_err());
}

#[tokio::test(start_paused = true)]
async fn a_call_that_used_its_estimate_exactly_keeps_it_all() {
    // 1,000 tokens a minute (60 ms a token), every call estimated at 800.
    let layer = ModelRateLimitLayer::new()
        .requests(10, Duration::from_secs(60))
        .tokens(1_000, Duration::from_secs(60))
        .estimate(|_| 800)
        .max_wait(Duration::ZERO);
    let mut service = layer.layer(ScriptedModel::from_fn(|_| {
        ScriptedTurn::text("ok").usage(Usage::new(700, 100))
    }));
    service
        .ready()
        .await
        .unwrap()
        .call(call("m"))
        .await
        .unwrap();
    // 200 left: the next 800 are 600 tokens, 36 s, away.
    let err = service
        .ready()
        .await
        .unwrap()
        .call(call("m"))
        .await
        .unwrap_err();
    let refused = err.downcast_ref::<RateLimited>().unwrap();
    assert_eq!(refused.retry_after(), Duration::from_secs(36));
}

#[test]
fn every_thread_finds_the_same_state_for_a_key() {
    let limiter = Arc::new(Limiter::new(Config::default()));
    let found: Vec<_> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let limiter = &limiter;
                scope.spawn(move || {
                    let key = if i % 2 == 0 { "first" } else { "second" };
                    (key, limiter.key(key))
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (key, state) in &found {
        assert_eq!(state.key(), *key);
        assert!(Arc::ptr_eq(state, &limiter.key(key)));
    }
    assert!(!Arc::ptr_eq(&limiter.key("first"), &limiter.key("second")));
    // A third key, after both are known, is its own too.
    assert_eq!(limiter.key("third").key(), "third");
    assert!(Arc::ptr_eq(&limiter.key("third"), &limiter.key("third")));
}

#[tokio::test(start_paused = true)]
async fn idle_keys_are_swept_and_busy_ones_kept() {
    use super::ticket::Arrival;
    let admit = |limiter: &Limiter, key: &str| match limiter.key(key).arrive(1, 0, Duration::ZERO) {
        Ok(Arrival::Admitted(ticket)) => ticket,
        _ => panic!("`{key}` has room"),
    };
    let config = Config {
        default: super::Limits::new().requests(1, Duration::from_secs(1)),
        idle_keys: 4,
        ..Config::default()
    };
    let limiter = Limiter::new(config);
    let _first = limiter.key("first");
    // `busy` spends its second, and a call still holds its state.
    let held = admit(&limiter, "busy").send();
    // Three tenants' calls are given back: their buckets are full again,
    // as a fresh key's would be.
    for i in 0..3 {
        drop(admit(&limiter, &format!("tenant-{i}")));
    }
    assert_eq!(limiter.key_count(), 5);

    // The map reached its sweep mark: the next new key sweeps the idle ones.
    let _ = limiter.key("new");
    assert_eq!(limiter.key_count(), 3, "first, busy, new");

    // Nothing holds `busy` now, but its bucket is still empty: not idle.
    drop(held);
    for i in 0..4 {
        let _ = limiter.key(&format!("more-{i}"));
    }
    assert_eq!(limiter.key_count(), 3, "first, busy, more-3");
    assert!(
        limiter.key("busy").arrive(1, 0, Duration::ZERO).is_err(),
        "the spent second is remembered"
    );

    // Once it refilled, forgetting it changes nothing: it goes too.
    tokio::time::advance(Duration::from_secs(1)).await;
    for i in 0..4 {
        let _ = limiter.key(&format!("later-{i}"));
    }
    assert_eq!(limiter.key_count(), 2, "first, later-3");
    drop(admit(&limiter, "busy"));
}

#[tokio::test(start_paused = true)]
async fn invalid_limits_fail_every_call_with_a_config_error() {
    let layer = ModelRateLimitLayer::new().requests(0, Duration::from_secs(60));
    assert_eq!(layer.validate().unwrap_err().code(), "INVALID_CONFIG");
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::text("ok"));
    let mut service = layer.layer(model.clone());
    for _ in 0..2 {
        let err = service
            .ready()
            .await
            .unwrap()
            .call(call("m"))
            .await
            .unwrap_err();
        let err = crate::AgentError::classify(err);
        assert_eq!(err.code(), "INVALID_CONFIG");
        assert!(err.to_string().contains("above zero"), "{err}");
    }
    assert!(model.requests().is_empty());
    // A setter gives the layer a quota of its own, checked again.
    let fixed = layer.requests(1, Duration::from_secs(60));
    assert!(fixed.validate().is_ok());
}

#[test]
fn a_token_counter_counts_the_input_and_falls_back_to_four_bytes_a_token() {
    use crate::tokens::{EstimateCounter, TokenCounters};
    let mut request = ModelRequest::new("m", vec![Message::user("x".repeat(400))]);
    request.settings_mut().max_tokens = Some(50);
    let call = ModelCall::new(request, RunContext::new());
    let plain = Limiter::new(Config::default());
    assert_eq!(plain.estimate(&call), 100 + 50);
    let counted = Limiter::new(Config {
        counters: Some(TokenCounters::new(EstimateCounter::new())),
        ..Config::default()
    });
    // Reply priming 3, the message's overhead 3, its text 100, and the output.
    assert_eq!(counted.estimate(&call), 3 + 3 + 100 + 50);
    // An estimate function still wins.
    let custom = Limiter::new(Config {
        counters: Some(TokenCounters::new(EstimateCounter::new())),
        estimate: Some(Arc::new(|_: &ModelRequest| 7)),
        ..Config::default()
    });
    assert_eq!(custom.estimate(&call), 7);
}

#[tokio::test(start_paused = true)]
async fn calls_beyond_the_posting_slots_settle_exactly_too() {
    // 10,000 tokens a minute (6 ms a token); each call reserves 100 and
    // uses 10. The first calls in flight post their settlements without
    // the lock, the ones beyond the slots settle under it.
    let layer = ModelRateLimitLayer::new()
        .requests(1_000, Duration::from_secs(60))
        .tokens(10_000, Duration::from_secs(60))
        .estimate(|request| if request.model == "big" { 9_900 } else { 100 })
        .key_fn(|_| "one quota".to_owned())
        .max_wait(Duration::ZERO);
    let mut service = layer.layer(ScriptedModel::from_fn(|_| {
        ScriptedTurn::text("ok").usage(Usage::new(5, 5))
    }));
    let calls = super::posts::SLOTS + 4;
    let mut futures = Vec::new();
    for _ in 0..calls {
        futures.push(service.ready().await.unwrap().call(call("m")));
    }
    for response in futures::future::join_all(futures).await {
        response.unwrap();
    }
    // 10,000 - 12 × 10 used: 9,880 left, so 9,900 are 20 tokens away.
    let err = service
        .ready()
        .await
        .unwrap()
        .call(call("big"))
        .await
        .unwrap_err();
    let refused = err.downcast_ref::<RateLimited>().unwrap();
    assert_eq!(refused.retry_after(), Duration::from_millis(120));

    // A call that fails keeps its reservation, posted or not.
    let failing = ModelRateLimitLayer::new()
        .tokens(1_000, Duration::from_secs(60))
        .estimate(|_| 400)
        .max_wait(Duration::ZERO);
    let (mock, mut handle) = mock::pair::<ModelCall, ModelResponse>();
    let mut service = mock::Spawn::new(failing.layer(mock));
    handle.allow(1);
    assert!(service.poll_ready().is_ready());
    let failed = service.call(call("m"));
    let (_, respond) = handle.next_request().await.unwrap();
    respond.send_error("provider down");
    assert!(failed.await.is_err());
    // 600 left: the next 400 fit, the one after waits 200 tokens (12 s).
    handle.allow(1);
    assert!(service.poll_ready().is_ready());
    let ok = service.call(call("m"));
    let (_, respond) = handle.next_request().await.unwrap();
    let mut response = ModelResponse::new("m", Message::assistant("ok"));
    response.usage = Usage::new(200, 200);
    respond.send_response(response);
    ok.await.unwrap();
    handle.allow(1);
    assert!(service.poll_ready().is_ready());
    let err = service.call(call("m")).await.unwrap_err();
    let refused = err.downcast_ref::<RateLimited>().unwrap();
    assert_eq!(refused.retry_after(), Duration::from_secs(12));
}

#[tokio::test(start_paused = true)]
async fn a_model_name_finds_its_key_whether_or_not_it_shares_the_first_ones_storage() {
    let mut service = ModelRateLimitLayer::new()
        .requests(2, Duration::from_secs(60))
        .max_wait(Duration::ZERO)
        .layer(ScriptedModel::from_fn(|_| ScriptedTurn::text("ok")));
    let first = call("m");
    // A clone shares the name's storage; a new request of the same name
    // does not. Both draw on the one quota of `m`.
    for call in [first.clone(), first.clone(), call("m")] {
        let _ = service.ready().await.unwrap().call(call).await;
    }
    let err = service
        .ready()
        .await
        .unwrap()
        .call(first)
        .await
        .unwrap_err();
    assert_eq!(
        err.downcast_ref::<RateLimited>().unwrap().retry_after(),
        Duration::from_secs(30)
    );
    // Another name is another key, with its own quota.
    service
        .ready()
        .await
        .unwrap()
        .call(call("n"))
        .await
        .unwrap();
}
