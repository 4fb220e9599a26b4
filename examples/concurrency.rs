//! 100,000 concurrent runs, each waiting on a 50 ms `ScriptedModel` delay:
//! the wall time, the peak of the bytes allocated (counted by the global
//! allocator: what the runs hold, without the allocator's own overhead) and
//! the peak resident memory (VmHWM, with it).
//!
//! ```sh
//! cargo run --release --example concurrency            # 100,000 runs
//! cargo run --release --example concurrency -- 10000   # fewer
//! ```
//!
//! Then the same runs once more on tokio's paused clock, counted when every
//! one waits on the model: the bytes a suspended run holds, the same on any
//! machine however loaded.
//!
//! Targets: at most 1.5 KB a run, and a wall time of at most twice the model
//! latency plus one second.

use std::time::{Duration, Instant};

use peak_alloc::PeakAlloc;
use tower_agent::{Agent, AgentError, ScriptedModel, ScriptedTurn};

const LATENCY: Duration = Duration::from_millis(50);

/// The system allocator, counting the bytes live and their peak.
#[global_allocator]
static ALLOCATOR: PeakAlloc = PeakAlloc;

/// A line of `/proc/self/status`, in KiB (Linux only).
fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn concurrent_agent() -> Result<Agent, AgentError> {
    Agent::builder("concurrent")
        .instructions("Answer in one word.")
        .model(
            ScriptedModel::from_fn(|_| ScriptedTurn::text("ok"))
                .latency(LATENCY)
                .record(false),
        )
        .build()
}

/// The bytes allocated for each of `runs` runs while all of them wait on
/// the model (tokio's clock paused, so none of them finishes before).
fn held_per_run(agent: Agent, runs: usize) -> f64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async move {
        let before = ALLOCATOR.current_usage();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..runs {
            let agent = agent.clone();
            tasks.spawn(async move { agent.run(format!("question {i}")).await });
        }
        // Every run goes as far as the model's wait before the clock moves.
        tokio::time::sleep(Duration::from_millis(1)).await;
        let held = ALLOCATOR.current_usage().saturating_sub(before);
        while let Some(joined) = tasks.join_next().await {
            joined.expect("a run task").expect("a completed run");
        }
        held as f64 / runs as f64
    })
}

fn main() -> Result<(), AgentError> {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let baseline = status_kib("VmRSS:").unwrap_or(0);
    let agent = concurrent_agent()?;

    ALLOCATOR.reset_peak_usage();
    let allocated_before = ALLOCATOR.current_usage();
    let started = Instant::now();
    // Spawned from a worker, as a server's handler would: the runs go to
    // the worker's own queue rather than the runtime's shared one.
    let completed = runtime.block_on(async move {
        tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..runs {
                let agent = agent.clone();
                tasks.spawn(async move { agent.run(format!("question {i}")).await });
            }
            let mut completed = 0usize;
            while let Some(joined) = tasks.join_next().await {
                if joined.expect("a run task").is_ok() {
                    completed += 1;
                }
            }
            completed
        })
        .await
        .expect("the driver task")
    });
    let wall = started.elapsed();
    let allocated = ALLOCATOR.peak_usage().saturating_sub(allocated_before);
    let per_run = allocated as f64 / runs as f64;
    let peak = status_kib("VmHWM:").unwrap_or(0);
    let rss_per_run = (peak.saturating_sub(baseline) * 1024) as f64 / runs as f64;
    println!("runs:            {runs} ({completed} completed)");
    println!("model latency:   {LATENCY:?}");
    println!(
        "wall time:       {wall:?} (target ≤ {:?})",
        LATENCY * 2 + Duration::from_secs(1)
    );
    println!(
        "peak RSS:        {:.1} MiB (baseline {:.1} MiB)",
        peak as f64 / 1024.0,
        baseline as f64 / 1024.0
    );
    println!(
        "peak allocated:  {:.1} MiB, {per_run:.0} bytes a run (target ≤ 1536)",
        allocated as f64 / (1024.0 * 1024.0)
    );
    println!("peak RSS a run:  {rss_per_run:.0} bytes");
    assert_eq!(completed, runs, "every run completes");
    drop(runtime);
    let held = held_per_run(concurrent_agent()?, runs);
    println!("held, waiting:   {held:.0} bytes a run (paused clock; target ≤ 1536)");
    Ok(())
}
