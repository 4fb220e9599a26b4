//! A `LifecycleLayer` with N = 0, 1, 4 and 8 middleware, each implementing
//! every hook as a no-op, around a 3-turn run; the agent with no layer at
//! all is the baseline in the same group. The figure is
//! (time(N) − time(0)) / (N × hooks fired per middleware per run); the
//! number of hooks fired is counted once and printed. Target: ≤ 100 ns per
//! hook.

use criterion::{criterion_group, criterion_main, Criterion};
use tower::{Layer, ServiceExt};
use tower_agent::lifecycle::{LifecycleLayer, LoggingMiddleware, Middleware, MiddlewareStack};
use tower_agent::{Agent, RunRequest};

#[path = "common/mod.rs"]
mod common;

/// Declares every hook and keeps each default: a call that does nothing.
struct Noop;

impl Middleware for Noop {
    fn name(&self) -> &str {
        "noop"
    }
}

fn agent() -> Agent {
    Agent::builder("bench")
        .model(common::three_turn_model())
        .tools(common::lookup_tools())
        .build()
        .unwrap()
}

fn lifecycle(c: &mut Criterion) {
    let rt = common::runtime();

    // How many hooks one middleware sees in one run.
    let logging = std::sync::Arc::new(LoggingMiddleware::new());
    let counted =
        LifecycleLayer::new(MiddlewareStack::new().push_arc(logging.clone())).layer(agent());
    rt.block_on(counted.oneshot(RunRequest::new("hi"))).unwrap();
    eprintln!(
        "hooks fired per middleware per run: {}",
        logging.counts().total()
    );

    let mut group = c.benchmark_group("lifecycle_3_turn_run");
    let bare = agent();
    group.bench_function("no_layer", |b| {
        b.to_async(&rt)
            .iter(|| bare.clone().oneshot(RunRequest::new("hi")));
    });
    for n in [0usize, 1, 4, 8] {
        let stack = (0..n).fold(MiddlewareStack::new(), |stack, _| stack.push(Noop));
        let layered = LifecycleLayer::new(stack).layer(agent());
        group.bench_function(format!("middleware_{n}"), |b| {
            b.to_async(&rt)
                .iter(|| layered.clone().oneshot(RunRequest::new("hi")));
        });
    }
    group.finish();
}

criterion_group!(benches, lifecycle);
criterion_main!(benches);
