//! The crate's side of `scripts/bench-peers.sh`: the workload its Python
//! peers run (`scripts/bench_peers/common.py`), measured the same way, printed
//! as one JSON object.
//!
//! The workload: a 3-turn run (model → tool → model → tool → model) of an
//! [`Agent`] on an in-process [`ScriptedModel`], with no middleware and with a
//! [`LifecycleLayer`] of 8 no-op [`Middleware`] (each overrides
//! `before_model` and `after_model` to do nothing, as each peer's no-op
//! overrides a before-model and an after-model hook: a hook not overridden
//! would be skipped by the stack and measure nothing), on tokio's
//! current-thread runtime, as the peers run on one asyncio loop.
//!
//! 1. `concurrent`: after a few warm-up runs, 1,000 runs at once on a model
//!    that answers after 50 ms; the wall time, and the peak resident memory
//!    over the resident memory before (`VmHWM` − `VmRSS` of
//!    `/proc/self/status`) per run. The peak is reset to the current
//!    resident memory (writing `5` to `/proc/self/clear_refs`) right
//!    before, so a higher peak of the warm-up cannot hide the runs' growth.
//! 2. `per_run`: runs one after the other on a model that answers at once,
//!    with 0 and with 8 middleware, alternating, in samples of at least
//!    0.5 s; the median of the samples' mean time per run.
//!
//! ```sh
//! cargo run --release --example bench_peers
//! ```

use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tower::{Layer, ServiceExt};
use tower_agent::lifecycle::{Hook, LifecycleLayer, Middleware, MiddlewareStack};
use tower_agent::types::{History, ModelRequest, ModelResponse, Role};
use tower_agent::{
    tool_sync, Agent, AgentError, BoxError, RunContext, RunRequest, ScriptedModel, ScriptedTurn,
    ToolRouter,
};

const CONCURRENT: usize = 1000;
const LATENCY: Duration = Duration::from_millis(50);
const MIDDLEWARE: usize = 8;
const SAMPLES: usize = 5;
const SAMPLE_TIME: Duration = Duration::from_millis(500);
const MODEL_CALLS: f64 = 3.0;

/// A middleware whose `before_model` and `after_model` run and do nothing,
/// like the peers' no-op middleware.
struct Noop;

impl Middleware for Noop {
    fn name(&self) -> &str {
        "noop"
    }

    fn before_model<'a>(&'a self, _: &'a RunContext, _: &'a mut History) -> Hook<'a, ()> {
        Hook::ok(())
    }

    fn after_model<'a>(&'a self, _: &'a RunContext, _: &'a mut ModelResponse) -> Hook<'a, ()> {
        Hook::ok(())
    }
}

#[derive(Deserialize, JsonSchema)]
struct Lookup {
    id: u32,
}

/// model → tool → model → tool → model, answering after `latency`.
fn model(latency: Duration) -> ScriptedModel {
    let model = ScriptedModel::from_fn(|request: &ModelRequest| {
        let returns = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .count();
        if returns < 2 {
            ScriptedTurn::tool_call("lookup", r#"{"id": 7}"#)
        } else {
            ScriptedTurn::text("done")
        }
    })
    .record(false);
    if latency.is_zero() {
        model
    } else {
        model.latency(latency)
    }
}

fn agent(latency: Duration) -> Result<Agent, AgentError> {
    Agent::builder("bench")
        .model(model(latency))
        .tools(
            ToolRouter::new().tool(tool_sync("lookup", "Looks up", |l: Lookup| {
                Ok::<_, BoxError>(l.id)
            })),
        )
        .build()
}

/// One whole run of the workload, with `middleware` no-op middleware.
#[derive(Clone)]
enum Runner {
    Bare(Agent),
    Layered(tower_agent::lifecycle::Lifecycle<Agent>),
}

impl Runner {
    fn new(middleware: usize, latency: Duration) -> Result<Runner, AgentError> {
        let agent = agent(latency)?;
        if middleware == 0 {
            return Ok(Runner::Bare(agent));
        }
        let stack = (0..middleware).fold(MiddlewareStack::new(), |stack, _| stack.push(Noop));
        Ok(Runner::Layered(LifecycleLayer::new(stack).layer(agent)))
    }

    async fn run(self, i: usize) -> Result<String, AgentError> {
        let request = RunRequest::new(format!("question {i}"));
        let run = match self {
            Runner::Bare(agent) => agent.oneshot(request).await?,
            Runner::Layered(agent) => agent.oneshot(request).await?,
        };
        Ok(run.output)
    }
}

/// A field of `/proc/self/status`, in KiB.
fn status_kb(field: &str) -> Result<u64, BoxError> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("no {field} in /proc/self/status").into())
}

/// Resets `VmHWM` to the current `VmRSS` (Linux 4.0+): the peak from here on.
fn reset_peak() -> Result<(), BoxError> {
    std::fs::write("/proc/self/clear_refs", "5")
        .map_err(|e| format!("cannot reset the peak RSS (/proc/self/clear_refs): {e}").into())
}

async fn concurrent() -> Result<serde_json::Value, BoxError> {
    let runner = Runner::new(0, LATENCY)?;
    for i in 0..10 {
        assert_eq!(runner.clone().run(i).await?, "done");
    }
    reset_peak()?;
    let before = status_kb("VmRSS")?;
    let start = Instant::now();
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..CONCURRENT {
        runs.spawn(runner.clone().run(i));
    }
    let mut done = 0;
    while let Some(answer) = runs.join_next().await {
        assert_eq!(answer??, "done");
        done += 1;
    }
    let wall = start.elapsed();
    let peak = status_kb("VmHWM")?;
    assert_eq!(done, CONCURRENT);
    Ok(json!({
        "concurrent_runs": CONCURRENT,
        "model_latency_ms": LATENCY.as_secs_f64() * 1e3,
        "wall_ms": wall.as_secs_f64() * 1e3,
        "kb_per_run": peak.saturating_sub(before) as f64 / CONCURRENT as f64,
    }))
}

/// Mean time per run over at least `SAMPLE_TIME`.
async fn sample(runner: &Runner) -> Result<Duration, AgentError> {
    let start = Instant::now();
    let mut n = 0u32;
    loop {
        for _ in 0..10 {
            runner.clone().run(n as usize).await?;
            n += 1;
        }
        let elapsed = start.elapsed();
        if elapsed >= SAMPLE_TIME {
            return Ok(elapsed / n);
        }
    }
}

fn median_us(mut times: Vec<Duration>) -> f64 {
    times.sort();
    times[times.len() / 2].as_secs_f64() * 1e6
}

async fn per_run() -> Result<serde_json::Value, BoxError> {
    let bare = Runner::new(0, Duration::ZERO)?;
    let layered = Runner::new(MIDDLEWARE, Duration::ZERO)?;
    for runner in [&bare, &layered] {
        for i in 0..50 {
            assert_eq!(runner.clone().run(i).await?, "done");
        }
    }
    let (mut t0, mut t8) = (Vec::new(), Vec::new());
    for _ in 0..SAMPLES {
        t0.push(sample(&bare).await?);
        t8.push(sample(&layered).await?);
    }
    let (us0, us8) = (median_us(t0), median_us(t8));
    Ok(json!({
        "us_per_run": us0,
        "us_per_run_8_middleware": us8,
        "us_per_middleware_per_model_call": (us8 - us0) / (MIDDLEWARE as f64 * MODEL_CALLS),
    }))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let mut result = json!({
        "peer": "tower-agent",
        "version": format!("tower-agent {}", env!("CARGO_PKG_VERSION")),
        "middleware": "Middleware with before_model/after_model returning Hook::ok(()), in a LifecycleLayer",
    });
    for part in [concurrent().await?, per_run().await?] {
        if let (Some(all), serde_json::Value::Object(more)) = (result.as_object_mut(), part) {
            all.extend(more);
        }
    }
    println!("{result}");
    Ok(())
}
