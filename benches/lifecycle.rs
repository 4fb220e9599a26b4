//! A `LifecycleLayer` with N = 0, 1, 4 and 8 middleware around a 3-turn
//! run; the agent with no layer at all is the baseline in the same group.
//! `middleware_N`: each middleware overrides every hook and answers "nothing
//! to do this time" (`Hook::skip`, `Wrapped::next`), so the stack calls
//! every hook every time. `closure_1`: one closure middleware with a
//! `before_model` hook, the common case, whose other hook points the stack
//! knows are absent. `lifecycle_hooks_1`: one middleware overriding every
//! hook but `wrap_model`, `wrap_tool` and the delta hooks, so that the cost
//! of the wrap chain reads as `middleware_1` less this one. `defaults_8`:
//! eight middleware that override nothing,
//! which the stack learns and skips. The figure per hook is
//! (time(N) − time(1)) / ((N − 1) × hooks fired per middleware per run);
//! the number of hooks fired is counted once and printed. Targets: the
//! first lifecycle middleware ≤ 1 µs over `no_layer`, each further hook
//! ≤ 30 ns. The first lifecycle middleware is `lifecycle_hooks_1`: every
//! lifecycle hook, like the middleware of this bench's first version,
//! written when `Middleware` had no wrap hooks. `middleware_1` is that
//! middleware with the wrap hooks too, so that every model and tool call
//! also goes down a wrap chain.
//!
//! For instruction counts, which hold still on a busy machine:
//! `BENCH_CASE=middleware_1 BENCH_RUNS=1000 valgrind --tool=callgrind
//! target/release/deps/lifecycle-…` runs one case that many times without
//! criterion; the difference between two run counts, divided by the
//! difference in runs, is the instructions per run. A run's count varies
//! by a few hundred instructions from one process to the next (random run
//! ids and hash seeds): take run counts far apart (100 and 600) and more
//! than one sample.

use criterion::{criterion_group, Criterion};
use tower::{Layer, ServiceExt};
use tower_agent::hooks::{
    Compaction, Notification, RunOutcome, RunStart, ToolCallResult, ToolVerdict,
};
use tower_agent::lifecycle::{
    Hook, LifecycleLayer, LoggingMiddleware, Middleware, MiddlewareStack, ModelNext, ToolNext,
    Wrapped,
};
use tower_agent::types::{ApprovalDecision, History, Message, ModelDelta, ModelResponse, ToolCall};
use tower_agent::{
    Agent, AgentError, BoxError, ModelCall, RunContext, RunRequest, ToolInvocation, ToolOutput,
};

#[path = "common/mod.rs"]
mod common;

/// The lifecycle hooks (all but the wrap and delta ones), each answering
/// "nothing to do this time".
macro_rules! skipping_lifecycle_hooks {
    () => {
        fn before_agent<'a>(&'a self, _: &'a RunContext, _: RunStart) -> Hook<'a, Option<String>> {
            Hook::skip()
        }
        fn before_run<'a>(
            &'a self,
            _: &'a RunContext,
            _: &'a mut Message,
            _: &'a History,
        ) -> Hook<'a, Option<String>> {
            Hook::skip()
        }
        fn before_model<'a>(&'a self, _: &'a RunContext, _: &'a mut History) -> Hook<'a, ()> {
            Hook::skip()
        }
        fn after_model<'a>(&'a self, _: &'a RunContext, _: &'a mut ModelResponse) -> Hook<'a, ()> {
            Hook::skip()
        }
        fn before_tool<'a>(
            &'a self,
            _: &'a RunContext,
            _: &'a ToolCall,
            _: bool,
        ) -> Hook<'a, ToolVerdict> {
            Hook::skip()
        }
        fn after_tool<'a>(
            &'a self,
            _: &'a RunContext,
            _: &'a ToolCall,
            _: &'a mut ToolOutput,
        ) -> Hook<'a, ()> {
            Hook::skip()
        }
        fn after_tool_batch<'a>(
            &'a self,
            _: &'a RunContext,
            _: &'a [ToolCallResult<'a>],
        ) -> Hook<'a, ()> {
            Hook::skip()
        }
        fn before_stop<'a>(
            &'a self,
            _: &'a RunContext,
            _: &'a Message,
            _: u32,
        ) -> Hook<'a, Option<String>> {
            Hook::skip()
        }
        fn before_compaction<'a>(&'a self, _: &'a RunContext, _: &'a History) -> Hook<'a, bool> {
            Hook::skip()
        }
        fn after_compaction<'a>(&'a self, _: &'a RunContext, _: &'a Compaction) -> Hook<'a, ()> {
            Hook::skip()
        }
        fn before_model_switch<'a>(
            &'a self,
            _: &'a RunContext,
            _: &'a str,
            _: &'a str,
        ) -> Hook<'a, bool> {
            Hook::skip()
        }
        fn decide_approval<'a>(
            &'a self,
            _: &'a RunContext,
            _: &'a ToolCall,
        ) -> Hook<'a, Option<ApprovalDecision>> {
            Hook::skip()
        }
        fn on_notification<'a>(&'a self, _: &'a RunContext, _: &'a Notification) -> Hook<'a, ()> {
            Hook::skip()
        }
        fn on_error<'a>(&'a self, _: &'a RunContext, _: &'a AgentError) -> Hook<'a, ()> {
            Hook::skip()
        }
        fn after_agent<'a>(&'a self, _: &'a RunContext, _: RunOutcome<'a>) -> Hook<'a, ()> {
            Hook::skip()
        }
    };
}

/// Overrides every hook with "nothing to do this time".
struct Noop;

impl Middleware for Noop {
    fn name(&self) -> &str {
        "noop"
    }
    skipping_lifecycle_hooks!();
    fn wrap_model<'a>(&'a self, call: ModelCall, next: ModelNext) -> Wrapped<'a, ModelCall> {
        Wrapped::next(call, next)
    }
    fn on_model_delta(&self, _: &RunContext, _: &mut ModelDelta) -> Result<(), BoxError> {
        Ok(())
    }
    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> Wrapped<'a, ToolInvocation> {
        Wrapped::next(invocation, next)
    }
    fn on_tool_delta(
        &self,
        _: &RunContext,
        _: &ToolCall,
        _: &mut ModelDelta,
    ) -> Result<(), BoxError> {
        Ok(())
    }
}

/// Overrides every hook but the wrap and delta hooks: what the first
/// middleware costs without a wrap chain.
struct LifecycleOnly;

impl Middleware for LifecycleOnly {
    fn name(&self) -> &str {
        "lifecycle-only"
    }
    skipping_lifecycle_hooks!();
}

/// Overrides nothing.
struct Defaults;

impl Middleware for Defaults {
    fn name(&self) -> &str {
        "defaults"
    }
}

fn agent() -> Agent {
    Agent::builder("bench")
        .model(common::three_turn_model())
        .tools(common::lookup_tools())
        .build()
        .unwrap()
}

/// The agent with one closure middleware: a `before_model` that does
/// nothing.
fn closure_1() -> tower_agent::lifecycle::Lifecycle<Agent> {
    let stack = MiddlewareStack::new().before_model("reminder", |_ctx, _messages| Ok(()));
    LifecycleLayer::new(stack).layer(agent())
}

/// A run service, type-erased.
fn boxed<S>(service: S) -> tower_agent::BoxAgent
where
    S: tower::Service<RunRequest, Response = tower_agent::types::AgentRun>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    tower::util::BoxCloneSyncService::new(service.map_err(Into::into))
}

/// The run services of the group, by case name.
fn cases() -> Vec<(String, tower_agent::BoxAgent)> {
    let mut cases = vec![("no_layer".to_owned(), boxed(agent()))];
    for n in [0usize, 1, 4, 8] {
        let stack = (0..n).fold(MiddlewareStack::new(), |stack, _| stack.push(Noop));
        cases.push((
            format!("middleware_{n}"),
            boxed(LifecycleLayer::new(stack).layer(agent())),
        ));
    }
    cases.push(("closure_1".to_owned(), boxed(closure_1())));
    cases.push((
        "lifecycle_hooks_1".to_owned(),
        boxed(LifecycleLayer::new(MiddlewareStack::new().push(LifecycleOnly)).layer(agent())),
    ));
    let stack = (0..8).fold(MiddlewareStack::new(), |stack, _| stack.push(Defaults));
    cases.push((
        "defaults_8".to_owned(),
        boxed(LifecycleLayer::new(stack).layer(agent())),
    ));
    cases
}

/// `BENCH_CASE` run `BENCH_RUNS` times, without criterion: for callgrind.
fn counted_runs(case: &str, runs: usize) {
    let rt = common::runtime();
    let (_, service) = cases()
        .into_iter()
        .find(|(name, _)| name == case)
        .expect("BENCH_CASE names a case of the group");
    rt.block_on(run_many(&service, runs));
}

/// `runs` runs of `service`, one after another.
async fn run_many(service: &tower_agent::BoxAgent, runs: usize) {
    for _ in 0..runs {
        service
            .clone()
            .oneshot(RunRequest::new("hi"))
            .await
            .unwrap();
    }
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
    let closure = closure_1();
    group.bench_function("closure_1", |b| {
        b.to_async(&rt)
            .iter(|| closure.clone().oneshot(RunRequest::new("hi")));
    });
    let hooks_only = LifecycleLayer::new(MiddlewareStack::new().push(LifecycleOnly)).layer(agent());
    group.bench_function("lifecycle_hooks_1", |b| {
        b.to_async(&rt)
            .iter(|| hooks_only.clone().oneshot(RunRequest::new("hi")));
    });
    let stack = (0..8).fold(MiddlewareStack::new(), |stack, _| stack.push(Defaults));
    let layered = LifecycleLayer::new(stack).layer(agent());
    group.bench_function("defaults_8", |b| {
        b.to_async(&rt)
            .iter(|| layered.clone().oneshot(RunRequest::new("hi")));
    });
    group.finish();
}

criterion_group!(benches, lifecycle);

/// `BENCH_INTERLEAVE`: the cases named, in turn, `BENCH_RUNS` runs a batch
/// (default 2,000), without criterion (see [`common::interleave`]).
fn interleaved() -> Option<()> {
    std::env::var_os("BENCH_INTERLEAVE")?;
    let runs: usize =
        std::env::var("BENCH_RUNS").map_or(2_000, |r| r.parse().expect("BENCH_RUNS is a number"));
    let rt = common::runtime();
    let cases = cases();
    common::interleave(|name| {
        let (_, service) = cases
            .iter()
            .find(|(case, _)| case == name)
            .expect("BENCH_INTERLEAVE names cases of the group");
        let start = std::time::Instant::now();
        rt.block_on(run_many(service, runs));
        start.elapsed() / runs as u32
    })
}

fn main() {
    if interleaved().is_none() {
        common::main(counted_runs, benches);
    }
}
