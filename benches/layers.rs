//! Nanoseconds per call of each layer around a no-op model service, against
//! the bare service and raw tower no-op layers (static and boxed, ×1, ×4,
//! ×8, and tower's own timeout) in the same group. Target: ≤ 25 ns per
//! pass-through layer over the raw-tower baseline.

use std::future::{ready, Ready};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_agent::layers::cache::CacheLayer;
use tower_agent::layers::fallback::FallbackLayer;
use tower_agent::layers::pii::MaskPiiLayer;
use tower_agent::layers::rate_limit::ModelRateLimitLayer;
use tower_agent::layers::retry::LlmRetryLayer;
use tower_agent::layers::timeout::CallTimeoutLayer;
use tower_agent::types::{History, Message, ModelRequest, ModelResponse};
use tower_agent::{BoxError, ModelCall, RunContext};

#[path = "common/mod.rs"]
mod common;

/// A model that answers at once with a prepared response. Like a real
/// provider client, it is cheap to clone (tower's retry clones it per call).
#[derive(Clone)]
struct Noop(Arc<ModelResponse>);

impl Service<ModelCall> for Noop {
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = Ready<Result<ModelResponse, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _call: ModelCall) -> Self::Future {
        let mut response = ModelResponse::clone(&self.0);
        response.usage_recorded = true;
        ready(Ok(response))
    }
}

/// tower's cheapest real layer: a request map that changes nothing.
fn noop_layer<S>(inner: S) -> tower::util::MapRequest<S, fn(ModelCall) -> ModelCall> {
    tower::util::MapRequestLayer::new((|call| call) as fn(ModelCall) -> ModelCall).layer(inner)
}

fn boxed<S>(inner: S) -> BoxCloneSyncService<ModelCall, ModelResponse, BoxError>
where
    S: Service<ModelCall, Response = ModelResponse, Error = BoxError>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    BoxCloneSyncService::new(inner)
}

fn call() -> ModelCall {
    ModelCall::new(
        ModelRequest::new("bench-model", vec![Message::user("Where is order A-1?")]),
        RunContext::new(),
    )
}

fn layers(c: &mut Criterion) {
    let rt = common::runtime();
    let model = Noop(Arc::new(ModelResponse::new(
        "bench-model",
        Message::assistant("shipped"),
    )));
    let call = call();
    let mut group = c.benchmark_group("layer_per_call");

    macro_rules! bench {
        ($name:expr, $svc:expr) => {{
            let svc = $svc;
            group.bench_function($name, |b| {
                b.to_async(&rt).iter(|| {
                    let mut svc = svc.clone();
                    let call = call.clone();
                    async move { svc.ready().await.unwrap().call(call).await.unwrap() }
                })
            });
        }};
    }

    bench!("baseline/bare", model.clone());
    bench!("baseline/tower_noop_x1", noop_layer(model.clone()));
    bench!(
        "baseline/tower_noop_x4",
        noop_layer(noop_layer(noop_layer(noop_layer(model.clone()))))
    );
    bench!(
        "baseline/tower_noop_x8",
        noop_layer(noop_layer(noop_layer(noop_layer(noop_layer(noop_layer(
            noop_layer(noop_layer(model.clone()))
        ))))))
    );
    bench!("baseline/tower_boxed_x1", boxed(model.clone()));
    bench!(
        "baseline/tower_boxed_x4",
        boxed(boxed(boxed(boxed(model.clone()))))
    );
    bench!(
        "baseline/tower_boxed_x8",
        boxed(boxed(boxed(boxed(boxed(boxed(boxed(boxed(
            model.clone()
        ))))))))
    );

    bench!(
        "baseline/tower_timeout",
        ServiceBuilder::new()
            .timeout(Duration::from_secs(30))
            .service(model.clone())
            .map_err(BoxError::from)
    );
    bench!("retry", LlmRetryLayer::new().layer(model.clone()));
    bench!(
        "pii_short_clean_message",
        MaskPiiLayer::default().layer(model.clone())
    );
    bench!(
        "timeout",
        CallTimeoutLayer::new(Duration::from_secs(30)).layer(model.clone())
    );
    bench!(
        "fallback",
        FallbackLayer::new().models(["backup"]).layer(model.clone())
    );
    let limit = ModelRateLimitLayer::new()
        .requests(u64::MAX / 4, Duration::from_secs(1))
        .tokens(u64::MAX / 4, Duration::from_secs(1));
    bench!("rate_limit_ample", limit.layer(model.clone()));

    // A miss needs a request the cache has not seen: a fresh history per
    // call, built (and digested, as the run would have) outside the timing.
    let cache = CacheLayer::new().layer(model.clone());
    let mut n = 0u64;
    group.bench_function("cache_miss_memory_store", |b| {
        b.to_async(&rt).iter_batched(
            || {
                n += 1;
                let history = History::from(vec![Message::user(format!("Where is order A-{n}?"))]);
                history.digest();
                ModelCall::new(ModelRequest::new("bench-model", history), RunContext::new())
            },
            |call| {
                let mut svc = cache.clone();
                async move { svc.ready().await.unwrap().call(call).await.unwrap() }
            },
            BatchSize::SmallInput,
        )
    });
    group.bench_function("cache_miss_baseline_bare", |b| {
        b.to_async(&rt).iter_batched(
            || call.clone(),
            |call| {
                let mut svc = model.clone();
                async move { svc.ready().await.unwrap().call(call).await.unwrap() }
            },
            BatchSize::SmallInput,
        )
    });

    let limit = ModelRateLimitLayer::new()
        .requests(u64::MAX / 4, Duration::from_secs(1))
        .tokens(u64::MAX / 4, Duration::from_secs(1));
    bench!(
        "full_default_stack",
        ServiceBuilder::new()
            .layer(LlmRetryLayer::new())
            .layer(CallTimeoutLayer::new(Duration::from_secs(30)))
            .layer(FallbackLayer::new().models(["backup"]))
            .layer(limit)
            .service(model.clone())
    );
    group.finish();
}

criterion_group!(benches, layers);
criterion_main!(benches);
