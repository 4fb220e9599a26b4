//! The circuit breaker in full agent runs: under a fallback an open breaker
//! moves the turn to the next model without waiting, and a recovered
//! provider is used again after a probe.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::layers::circuit_breaker::{CircuitBreakerLayer, CircuitState};
use tower_agent::layers::ServiceBuilderExt;
use tower_agent::{Agent, ErrorKind, RunContext, RunRequest, ScriptedModel, ScriptedTurn};

/// One provider serving "big" (down while `down` is set, each failure
/// taking 5 s) and "small".
fn provider(down: Arc<AtomicBool>) -> ScriptedModel {
    ScriptedModel::from_fn(move |request| match request.model.as_str() {
        "big" if down.load(Ordering::SeqCst) => {
            ScriptedTurn::error(ErrorKind::Unavailable, "overloaded").delay(Duration::from_secs(5))
        }
        model => ScriptedTurn::text(format!("{model} here")),
    })
}

fn fallbacks(sink: &CollectingSink) -> Vec<(String, String, &'static str)> {
    sink.events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::FallbackUsed { from, to, code, .. } => Some((from, to, code)),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_moves_the_turn_to_the_next_model_at_once() {
    let down = Arc::new(AtomicBool::new(true));
    let model = provider(down.clone());
    let breaker = CircuitBreakerLayer::new()
        .consecutive_failures(2)
        .open_for(Duration::from_secs(60));
    let stack = ServiceBuilder::new()
        .fallback_models(["small"])
        .circuit_breaker(breaker.clone())
        .service(model.clone());
    let agent = Agent::builder("assistant")
        .model(stack)
        .model_name("big")
        .build()
        .unwrap();

    // Two runs wait for big to fail, then fall back.
    for _ in 0..2 {
        let start = Instant::now();
        assert_eq!(agent.run("Hi").await.unwrap().output, "small here");
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }
    assert!(matches!(
        breaker.state("big"),
        Some(CircuitState::Open { .. })
    ));
    let big_calls = || {
        model
            .requests()
            .iter()
            .filter(|r| r.model.as_str() == "big")
            .count()
    };
    assert_eq!(big_calls(), 2);

    // Open: big is refused at once, the turn moves on without waiting.
    let sink = CollectingSink::new();
    let ctx = RunContext::builder().events(sink.clone()).build();
    let start = Instant::now();
    let run = agent
        .clone()
        .oneshot(RunRequest::new("Hi").context(ctx))
        .await
        .unwrap();
    assert_eq!(run.output, "small here");
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(
        big_calls(),
        2,
        "the open breaker kept big from being called"
    );
    assert_eq!(
        fallbacks(&sink),
        vec![("big".into(), "small".into(), "PROVIDER_UNAVAILABLE")]
    );

    // Big recovers; after `open_for` a probe goes through and closes it.
    down.store(false, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(breaker.state("big"), Some(CircuitState::HalfOpen));
    assert_eq!(agent.run("Hi").await.unwrap().output, "big here");
    assert_eq!(breaker.state("big"), Some(CircuitState::Closed));
}

#[tokio::test(start_paused = true)]
async fn without_a_fallback_the_run_fails_with_provider_unavailable_and_the_retry_after() {
    let down = Arc::new(AtomicBool::new(true));
    let breaker = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .open_for(Duration::from_secs(30));
    let stack = ServiceBuilder::new()
        .circuit_breaker(breaker)
        .service(provider(down));
    let agent = Agent::builder("assistant")
        .model(stack)
        .model_name("big")
        .build()
        .unwrap();
    agent.run("Hi").await.unwrap_err();
    let err = agent.run("Hi").await.unwrap_err();
    assert_eq!(err.code(), "PROVIDER_UNAVAILABLE");
    match &err {
        tower_agent::AgentError::Provider(p) => {
            assert_eq!(p.retry_after_hint(), Some(Duration::from_secs(30)))
        }
        other => panic!("expected a provider error, got {other:?}"),
    }
}
