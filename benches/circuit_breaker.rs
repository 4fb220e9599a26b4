//! Nanoseconds per call of the circuit breaker around a no-op model
//! service (closed, the pass-through every healthy call pays; and open, a
//! refusal), against the bare service and tower's no-op layer in the same
//! group.

use std::future::{ready, Ready};
use std::sync::Arc;
use std::task::{Context, Poll};

use criterion::{criterion_group, criterion_main, Criterion};
use tower::layer::util::Identity;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_agent::layers::circuit_breaker::CircuitBreakerLayer;
use tower_agent::types::{Message, ModelRequest, ModelResponse};
use tower_agent::{BoxError, ErrorKind, ModelCall, ProviderError, RunContext};

#[path = "common/mod.rs"]
mod common;

/// A model that answers at once with a prepared response, or fails.
#[derive(Clone)]
struct Noop(Option<Arc<ModelResponse>>);

impl Service<ModelCall> for Noop {
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = Ready<Result<ModelResponse, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _call: ModelCall) -> Self::Future {
        ready(match &self.0 {
            Some(response) => {
                let mut response = ModelResponse::clone(response);
                response.usage_recorded = true;
                Ok(response)
            }
            None => Err(ProviderError::new(ErrorKind::Unavailable, "down").into()),
        })
    }
}

fn circuit_breaker(c: &mut Criterion) {
    let rt = common::runtime();
    let model = Noop(Some(Arc::new(ModelResponse::new(
        "bench-model",
        Message::assistant("shipped"),
    ))));
    let call = ModelCall::new(
        ModelRequest::new("bench-model", vec![Message::user("Where is order A-1?")]),
        RunContext::new(),
    );
    let mut group = c.benchmark_group("circuit_breaker");

    macro_rules! bench {
        ($name:expr, $svc:expr, $ok:expr) => {{
            let svc = $svc;
            group.bench_function($name, |b| {
                b.to_async(&rt).iter(|| {
                    let mut svc = svc.clone();
                    let call = call.clone();
                    async move {
                        let result = svc.ready().await.unwrap().call(call).await;
                        assert_eq!(result.is_ok(), $ok);
                    }
                })
            });
        }};
    }

    bench!("baseline/bare", model.clone(), true);
    bench!(
        "baseline/tower_identity",
        Identity::new().layer(model.clone()),
        true
    );
    bench!(
        "baseline/tower_service_builder",
        ServiceBuilder::new().service(model.clone()),
        true
    );
    bench!(
        "closed_pass_through",
        CircuitBreakerLayer::new().layer(model.clone()),
        true
    );

    let open = CircuitBreakerLayer::new().consecutive_failures(1);
    let failing = open.layer(Noop(None));
    rt.block_on(async {
        let _ = failing.clone().oneshot(call.clone()).await;
    });
    bench!("open_refusal", open.layer(model.clone()), false);
    group.finish();
}

criterion_group!(benches, circuit_breaker);
criterion_main!(benches);
