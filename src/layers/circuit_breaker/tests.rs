//! Every transition of the breaker, under a paused clock.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{advance, Instant};
use tower::{Layer, Service, ServiceExt};

use super::*;
use crate::error::{retry_after, AgentError};
use crate::types::{Message, ModelRequest};
use crate::{RunContext, ScriptedModel, ScriptedTurn};

/// A provider that fails while `down` is set, counting the calls it gets.
#[derive(Clone)]
struct Provider {
    down: Arc<AtomicBool>,
    calls: Arc<AtomicU32>,
    model: ScriptedModel,
}

impl Provider {
    fn new() -> Self {
        let down = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicU32::new(0));
        let (d, c) = (down.clone(), calls.clone());
        let model = ScriptedModel::from_fn(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
            if d.load(Ordering::SeqCst) {
                ScriptedTurn::error(ErrorKind::Unavailable, "overloaded")
            } else {
                ScriptedTurn::text("ok")
            }
        });
        Self { down, calls, model }
    }

    fn down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

fn call(model: &str) -> ModelCall {
    ModelCall::new(
        ModelRequest::new(model, vec![Message::user("hi")]),
        RunContext::new(),
    )
}

async fn send<S>(svc: &mut S, model: &str) -> Result<ModelResponse, BoxError>
where
    S: Service<ModelCall, Response = ModelResponse, Error = BoxError>,
{
    svc.ready().await?.call(call(model)).await
}

fn open_error(err: &BoxError) -> &CircuitOpen {
    find::<CircuitOpen>(err.as_ref()).expect("a CircuitOpen refusal")
}

#[tokio::test(start_paused = true)]
async fn opens_after_n_consecutive_failures_and_a_success_resets_the_count() {
    let provider = Provider::new();
    let layer = CircuitBreakerLayer::new().consecutive_failures(3);
    let mut svc = layer.layer(provider.model.clone());

    provider.down(true);
    send(&mut svc, "m").await.unwrap_err();
    send(&mut svc, "m").await.unwrap_err();
    provider.down(false);
    send(&mut svc, "m").await.unwrap();
    provider.down(true);
    send(&mut svc, "m").await.unwrap_err();
    send(&mut svc, "m").await.unwrap_err();
    assert_eq!(layer.state("m"), Some(CircuitState::Closed));
    let third = send(&mut svc, "m").await.unwrap_err();
    // The failure that opened it is the provider's own.
    assert!(find::<CircuitOpen>(third.as_ref()).is_none());
    assert_eq!(
        layer.state("m"),
        Some(CircuitState::Open {
            until: Instant::now() + Duration::from_secs(30)
        })
    );
    assert_eq!(provider.calls(), 6);
}

#[tokio::test(start_paused = true)]
async fn open_refuses_at_once_with_when_it_tries_again() {
    let provider = Provider::new();
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .open_for(Duration::from_secs(20));
    let mut svc = layer.layer(provider.model.clone());
    provider.down(true);
    send(&mut svc, "m").await.unwrap_err();

    advance(Duration::from_secs(5)).await;
    let start = Instant::now();
    let err = send(&mut svc, "m").await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(open_error(&err).key(), "m");
    assert_eq!(open_error(&err).retry_after(), Duration::from_secs(15));
    assert_eq!(kind_of(err.as_ref()), ErrorKind::Unavailable);
    assert_eq!(retry_after(err.as_ref()), Some(Duration::from_secs(15)));
    let err = AgentError::classify(err);
    assert_eq!(err.code(), "PROVIDER_UNAVAILABLE");
    assert_eq!(
        provider.calls(),
        1,
        "the provider was not called while open"
    );
}

#[tokio::test(start_paused = true)]
async fn half_open_lets_one_probe_through_and_a_success_closes() {
    let provider = Provider::new();
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .open_for(Duration::from_secs(10));
    let slow = ScriptedModel::from_fn(|_| ScriptedTurn::text("ok").delay(Duration::from_secs(1)));
    let mut failing = layer.layer(provider.model.clone());
    provider.down(true);
    send(&mut failing, "m").await.unwrap_err();

    advance(Duration::from_secs(10)).await;
    assert_eq!(layer.state("m"), Some(CircuitState::HalfOpen));
    // A slow probe is in flight: the next call is refused, to try again now.
    let mut probing = layer.layer(slow);
    let probe = tokio::spawn({
        let mut svc = probing.clone();
        async move { send(&mut svc, "m").await }
    });
    tokio::task::yield_now().await;
    let err = send(&mut probing, "m").await.unwrap_err();
    assert_eq!(open_error(&err).retry_after(), Duration::ZERO);
    assert_eq!(layer.state("m"), Some(CircuitState::HalfOpen));

    probe.await.unwrap().unwrap();
    assert_eq!(layer.state("m"), Some(CircuitState::Closed));
    send(&mut probing, "m").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_opens_again_for_the_full_time() {
    let provider = Provider::new();
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(2)
        .open_for(Duration::from_secs(10));
    let mut svc = layer.layer(provider.model.clone());
    provider.down(true);
    send(&mut svc, "m").await.unwrap_err();
    send(&mut svc, "m").await.unwrap_err();

    advance(Duration::from_secs(10)).await;
    send(&mut svc, "m").await.unwrap_err(); // the probe fails
    assert_eq!(provider.calls(), 3);
    let err = send(&mut svc, "m").await.unwrap_err();
    assert_eq!(open_error(&err).retry_after(), Duration::from_secs(10));

    advance(Duration::from_secs(10)).await;
    provider.down(false);
    send(&mut svc, "m").await.unwrap();
    assert_eq!(layer.state("m"), Some(CircuitState::Closed));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_frees_its_place() {
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .open_for(Duration::from_secs(1));
    let failing = ScriptedModel::from_fn(|_| ScriptedTurn::error(ErrorKind::Unavailable, "down"));
    send(&mut layer.layer(failing), "m").await.unwrap_err();
    advance(Duration::from_secs(1)).await;

    let hanging =
        ScriptedModel::from_fn(|_| ScriptedTurn::text("late").delay(Duration::from_secs(3600)));
    let mut svc = layer.layer(hanging);
    let probe = svc.ready().await.unwrap().call(call("m"));
    drop(probe);
    // The place is free again: the next call is a probe, not refused.
    let ok = ScriptedModel::from_fn(|_| ScriptedTurn::text("ok"));
    send(&mut layer.layer(ok), "m").await.unwrap();
    assert_eq!(layer.state("m"), Some(CircuitState::Closed));
}

#[tokio::test(start_paused = true)]
async fn failure_rate_over_a_window_opens_and_old_calls_slide_out() {
    let provider = Provider::new();
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(0)
        .failure_rate(50, 4, Duration::from_secs(10));
    let mut svc = layer.layer(provider.model.clone());

    // 1 failure of 3 calls: under the minimum of 4 calls.
    send(&mut svc, "m").await.unwrap();
    provider.down(true);
    send(&mut svc, "m").await.unwrap_err();
    provider.down(false);
    send(&mut svc, "m").await.unwrap();
    assert_eq!(layer.state("m"), Some(CircuitState::Closed));

    // Those slide out; then alternate: fail, ok, fail, ok → 50 % of 4.
    advance(Duration::from_secs(11)).await;
    for i in 0..3 {
        provider.down(i % 2 == 0);
        let _ = send(&mut svc, "m").await;
    }
    assert_eq!(
        layer.state("m"),
        Some(CircuitState::Closed),
        "2 of 3: too few"
    );
    provider.down(true);
    send(&mut svc, "m").await.unwrap_err();
    assert!(matches!(layer.state("m"), Some(CircuitState::Open { .. })));
}

#[tokio::test(start_paused = true)]
async fn answers_that_are_errors_keep_it_closed() {
    let layer = CircuitBreakerLayer::new().consecutive_failures(1);
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::error(ErrorKind::InvalidRequest, "bad"));
    let mut svc = layer.layer(model);
    for _ in 0..3 {
        let err = send(&mut svc, "m").await.unwrap_err();
        assert!(find::<CircuitOpen>(err.as_ref()).is_none());
    }
    assert_eq!(layer.state("m"), Some(CircuitState::Closed));
}

#[tokio::test(start_paused = true)]
async fn keys_are_separate_and_clones_share_them() {
    let provider = Provider::new();
    let layer = CircuitBreakerLayer::new().consecutive_failures(1);
    let mut a = layer.layer(provider.model.clone());
    let mut b = layer.clone().layer(provider.model.clone()).clone();
    provider.down(true);
    send(&mut a, "big").await.unwrap_err();
    provider.down(false);
    // `b` shares the open breaker of "big"; "small" has its own.
    let err = send(&mut b, "big").await.unwrap_err();
    assert_eq!(open_error(&err).key(), "big");
    send(&mut b, "small").await.unwrap();
    assert_eq!(layer.state("small"), Some(CircuitState::Closed));
    assert_eq!(layer.state("other"), None);
}

#[tokio::test(start_paused = true)]
async fn a_custom_key_and_failure_test() {
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .key_fn(|_| "provider-a".to_owned())
        .failure_when(|err| kind_of(err) == ErrorKind::InvalidRequest);
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::error(ErrorKind::InvalidRequest, "bad"));
    let mut svc = layer.layer(model);
    send(&mut svc, "x").await.unwrap_err();
    let err = send(&mut svc, "y").await.unwrap_err();
    assert_eq!(open_error(&err).key(), "provider-a");
}
