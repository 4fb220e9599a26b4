//! Nanoseconds per call of each layer around a no-op model service, against
//! the bare service and raw tower layers in the same group: no-op layers
//! (static and boxed, ×1, ×4, ×8), tower's own `Timeout`, and tower's own
//! `Retry` with a policy that never retries but copies the request as any
//! retry policy must. Targets: ≤ 25 ns per pass-through layer over the
//! raw-tower baseline; timeout and retry no slower than tower's; fallback
//! with no error ≤ 60 ns over bare; the full default stack ≤ 400 ns; a
//! cache miss on the in-memory store ≤ 250 ns over its own bare
//! (`cache_miss_memory_store`, the default store of 10,000 entries, full;
//! `cache_miss_memory_store_1k` makes the same miss on a store small
//! enough to stay in a core's cache).
//!
//! For instruction counts, which hold still on a busy machine:
//! `BENCH_CASE=retry BENCH_RUNS=10000 valgrind --tool=callgrind
//! target/release/deps/layers-…` makes that many calls of one case without
//! criterion; the difference between two run counts, divided by the
//! difference in calls, is the instructions per call.

use std::future::Ready;
use std::rc::Rc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, BatchSize, Criterion};
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_agent::layers::cache::{CacheLayer, MemoryStore};
use tower_agent::layers::fallback::FallbackLayer;
use tower_agent::layers::pii::MaskPiiLayer;
use tower_agent::layers::rate_limit::ModelRateLimitLayer;
use tower_agent::layers::retry::LlmRetryLayer;
use tower_agent::layers::timeout::CallTimeoutLayer;
use tower_agent::types::{History, Message, ModelRequest, ModelResponse};
use tower_agent::{BoxError, ModelCall, RunContext};

#[path = "common/mod.rs"]
mod common;

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

/// Call `n` of a cache miss: a history the cache has not seen, digested
/// as the run would have.
fn fresh_call(n: u64) -> ModelCall {
    let history = History::from(vec![Message::user(format!("Where is order A-{n}?"))]);
    history.digest();
    ModelCall::new(ModelRequest::new("bench-model", history), RunContext::new())
}

/// tower's `Retry` policy at its cheapest: never retries, but copies the
/// request before each call as every retry policy must.
#[derive(Clone, Copy)]
struct PassThrough;

impl<Req: Clone, Res, E> tower::retry::Policy<Req, Res, E> for PassThrough {
    type Future = Ready<()>;

    fn retry(&mut self, _req: &mut Req, _result: &mut Result<Res, E>) -> Option<Ready<()>> {
        None
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

/// What is done with each case: timed by criterion, or called
/// `BENCH_RUNS` times for callgrind.
trait Visit {
    fn case<S>(&mut self, name: &str, svc: S)
    where
        S: Service<ModelCall, Response = ModelResponse, Error = BoxError> + Clone + 'static,
        S::Future: 'static;
}

/// Every case of the group but the cache miss (which needs a fresh request
/// per call), in the order criterion runs them.
fn cases(v: &mut impl Visit, model: &common::Noop) {
    v.case("baseline/bare", model.clone());
    v.case("baseline/tower_noop_x1", noop_layer(model.clone()));
    v.case(
        "baseline/tower_noop_x4",
        noop_layer(noop_layer(noop_layer(noop_layer(model.clone())))),
    );
    v.case(
        "baseline/tower_noop_x8",
        noop_layer(noop_layer(noop_layer(noop_layer(noop_layer(noop_layer(
            noop_layer(noop_layer(model.clone())),
        )))))),
    );
    v.case("baseline/tower_boxed_x1", boxed(model.clone()));
    v.case(
        "baseline/tower_boxed_x4",
        boxed(boxed(boxed(boxed(model.clone())))),
    );
    v.case(
        "baseline/tower_boxed_x8",
        boxed(boxed(boxed(boxed(boxed(boxed(boxed(boxed(
            model.clone(),
        )))))))),
    );
    v.case(
        "baseline/tower_timeout",
        ServiceBuilder::new()
            .timeout(Duration::from_secs(30))
            .service(model.clone())
            .map_err(BoxError::from),
    );
    v.case(
        "baseline/tower_retry",
        ServiceBuilder::new()
            .retry(PassThrough)
            .service(model.clone()),
    );
    v.case("retry", LlmRetryLayer::new().layer(model.clone()));
    v.case(
        "pii_short_clean_message",
        MaskPiiLayer::default().layer(model.clone()),
    );
    v.case(
        "timeout",
        CallTimeoutLayer::new(Duration::from_secs(30)).layer(model.clone()),
    );
    v.case(
        "fallback",
        FallbackLayer::new().models(["backup"]).layer(model.clone()),
    );
    v.case("rate_limit_ample", ample_limit().layer(model.clone()));
    v.case(
        "full_default_stack",
        ServiceBuilder::new()
            .layer(LlmRetryLayer::new())
            .layer(CallTimeoutLayer::new(Duration::from_secs(30)))
            .layer(FallbackLayer::new().models(["backup"]))
            .layer(ample_limit())
            .service(model.clone()),
    );
}

fn ample_limit() -> ModelRateLimitLayer {
    ModelRateLimitLayer::new()
        .requests(u64::MAX / 4, Duration::from_secs(1))
        .tokens(u64::MAX / 4, Duration::from_secs(1))
}

struct Timed<'a, 'c> {
    group: &'a mut criterion::BenchmarkGroup<'c, criterion::measurement::WallTime>,
    rt: &'a tokio::runtime::Runtime,
    call: &'a ModelCall,
}

impl Visit for Timed<'_, '_> {
    fn case<S>(&mut self, name: &str, svc: S)
    where
        S: Service<ModelCall, Response = ModelResponse, Error = BoxError> + Clone + 'static,
        S::Future: 'static,
    {
        let (rt, call) = (self.rt, self.call);
        self.group.bench_function(name, |b| {
            b.to_async(rt).iter(|| {
                let mut svc = svc.clone();
                let call = call.clone();
                async move { svc.ready().await.unwrap().call(call).await.unwrap() }
            })
        });
    }
}

/// Calls the case named `name` `runs` times, the way criterion's loop does.
struct Counted<'a> {
    name: &'a str,
    runs: usize,
    found: bool,
}

impl Visit for Counted<'_> {
    fn case<S>(&mut self, name: &str, svc: S)
    where
        S: Service<ModelCall, Response = ModelResponse, Error = BoxError> + Clone + 'static,
        S::Future: 'static,
    {
        if name != self.name {
            return;
        }
        self.found = true;
        let rt = common::runtime();
        let call = call();
        rt.block_on(async {
            for _ in 0..self.runs {
                let mut svc = svc.clone();
                let call = call.clone();
                let response = svc.ready().await.unwrap().call(call).await.unwrap();
                std::hint::black_box(response);
            }
        });
    }
}

fn layers(c: &mut Criterion) {
    let rt = common::runtime();
    let model = common::noop_model();
    let call = call();
    let mut group = c.benchmark_group("layer_per_call");
    cases(
        &mut Timed {
            group: &mut group,
            rt: &rt,
            call: &call,
        },
        &model,
    );

    // A miss needs a request the cache has not seen: a fresh history per
    // call, built (and digested, as the run would have) outside the timing.
    // Its bare baseline gets the same fresh calls, so the difference is the
    // cache's own work, not the freeing of a call used once.
    let mut n = 0u64;
    let mut fresh_call = move || {
        n += 1;
        fresh_call(n)
    };
    // The default store (10,000 entries, more than a core's L2 holds once
    // full), and a small one that stays in cache: the same instructions a
    // miss, so the difference is what the full store's memory costs.
    for (name, entries) in [
        ("cache_miss_memory_store", 10_000),
        ("cache_miss_memory_store_1k", 1_000),
    ] {
        let cache = CacheLayer::new()
            .store(MemoryStore::new(entries))
            .layer(model.clone());
        group.bench_function(name, |b| {
            b.to_async(&rt).iter_batched(
                &mut fresh_call,
                |call| {
                    let mut svc = cache.clone();
                    async move { svc.ready().await.unwrap().call(call).await.unwrap() }
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.bench_function("cache_miss_baseline_bare", |b| {
        b.to_async(&rt).iter_batched(
            &mut fresh_call,
            |call| {
                let mut svc = model.clone();
                async move { svc.ready().await.unwrap().call(call).await.unwrap() }
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, layers);

/// The two cache-miss cases, called `runs` times with a fresh call each.
fn count_cache_miss(name: &str, runs: usize) {
    let model = common::noop_model();
    let svc: BoxCloneSyncService<ModelCall, ModelResponse, BoxError> = match name {
        "cache_miss_memory_store" => boxed(CacheLayer::new().layer(model)),
        "cache_miss_memory_store_1k" => boxed(
            CacheLayer::new()
                .store(MemoryStore::new(1_000))
                .layer(model),
        ),
        "cache_miss_baseline_bare" => boxed(model),
        _ => panic!("BENCH_CASE names a case of the group"),
    };
    common::runtime().block_on(async {
        for n in 0..runs {
            let call = fresh_call(n as u64);
            let mut svc = svc.clone();
            let response = svc.ready().await.unwrap().call(call).await.unwrap();
            std::hint::black_box(response);
        }
    });
}

/// Each case as a batch of `runs` calls, timed: for `BENCH_INTERLEAVE`.
struct Batches {
    rt: Rc<tokio::runtime::Runtime>,
    runs: usize,
    batches: Vec<(String, Batch)>,
}

/// One batch of a case: the time of one call in it.
type Batch = Box<dyn FnMut() -> Duration>;

impl Visit for Batches {
    fn case<S>(&mut self, name: &str, svc: S)
    where
        S: Service<ModelCall, Response = ModelResponse, Error = BoxError> + Clone + 'static,
        S::Future: 'static,
    {
        let (rt, runs, call) = (self.rt.clone(), self.runs, call());
        let batch = move || {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..runs {
                    let mut svc = svc.clone();
                    let call = call.clone();
                    let response = svc.ready().await.unwrap().call(call).await.unwrap();
                    std::hint::black_box(response);
                }
                start.elapsed() / runs as u32
            })
        };
        self.batches.push((name.to_owned(), Box::new(batch)));
    }
}

impl Batches {
    /// The cache-miss cases: each batch of fresh calls is built before it
    /// is timed.
    fn cache_misses(&mut self) {
        let model = common::noop_model();
        let fresh = Rc::new(std::cell::Cell::new(0u64));
        let cases = [
            (
                "cache_miss_memory_store",
                boxed(CacheLayer::new().layer(model.clone())),
            ),
            (
                "cache_miss_memory_store_1k",
                boxed(
                    CacheLayer::new()
                        .store(MemoryStore::new(1_000))
                        .layer(model.clone()),
                ),
            ),
            ("cache_miss_baseline_bare", boxed(model)),
        ];
        for (name, svc) in cases {
            let (rt, runs, fresh) = (self.rt.clone(), self.runs, fresh.clone());
            // The calls are made a hundred at a time, as criterion's small
            // batches are, so that they are still in cache when timed.
            let batch = move || {
                let mut took = Duration::ZERO;
                for _ in 0..runs.div_ceil(100) {
                    let calls: Vec<ModelCall> = (0..100)
                        .map(|_| {
                            fresh.set(fresh.get() + 1);
                            fresh_call(fresh.get())
                        })
                        .collect();
                    took += rt.block_on(async {
                        let start = Instant::now();
                        for call in calls {
                            let mut svc = svc.clone();
                            let response = svc.ready().await.unwrap().call(call).await.unwrap();
                            std::hint::black_box(response);
                        }
                        start.elapsed()
                    });
                }
                took / (runs.div_ceil(100) * 100) as u32
            };
            self.batches.push((name.to_owned(), Box::new(batch)));
        }
    }
}

/// `BENCH_INTERLEAVE`: the cases named, in turn, `BENCH_RUNS` calls a batch
/// (default 20,000), without criterion (see [`common::interleave`]).
fn interleaved() -> Option<()> {
    std::env::var_os("BENCH_INTERLEAVE")?;
    let runs =
        std::env::var("BENCH_RUNS").map_or(20_000, |r| r.parse().expect("BENCH_RUNS is a number"));
    let mut batches = Batches {
        rt: Rc::new(common::runtime()),
        runs,
        batches: Vec::new(),
    };
    cases(&mut batches, &common::noop_model());
    batches.cache_misses();
    common::interleave(|name| {
        let (_, batch) = batches
            .batches
            .iter_mut()
            .find(|(case, _)| case == name)
            .expect("BENCH_INTERLEAVE names cases of the group");
        batch()
    })
}

fn main() {
    if interleaved().is_some() {
        return;
    }
    common::main(
        |name, runs| {
            let mut counted = Counted {
                name,
                runs,
                found: false,
            };
            cases(&mut counted, &common::noop_model());
            if !counted.found {
                count_cache_miss(name, runs);
            }
        },
        benches,
    );
}
