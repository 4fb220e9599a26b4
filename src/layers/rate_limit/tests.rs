//! The paths of the layer that the integration tests do not reach: a
//! response future dropped before or after it was first polled (the
//! inner service was called either way), a call
//! that used exactly its estimate, the key lookup under threads, the
//! future's `Debug`.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tower::{Layer, Service, ServiceExt};
use tower_test::mock;

use super::layer::Config;
use super::limiter::Limiter;
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
