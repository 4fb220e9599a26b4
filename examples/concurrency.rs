//! 100,000 concurrent runs, each waiting on a 50 ms `ScriptedModel` delay:
//! the wall time and the peak resident memory (VmHWM).
//!
//! ```sh
//! cargo run --release --example concurrency            # 100,000 runs
//! cargo run --release --example concurrency -- 10000   # fewer
//! ```
//!
//! Targets: at most 512 MiB in all (5 KB a run), and a wall time of at most
//! twice the model latency plus one second.

use std::time::{Duration, Instant};

use tower_agent::{Agent, AgentError, ScriptedModel, ScriptedTurn};

const LATENCY: Duration = Duration::from_millis(50);

/// A line of `/proc/self/status`, in KiB (Linux only).
fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
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
    let agent = Agent::builder("concurrent")
        .instructions("Answer in one word.")
        .model(
            ScriptedModel::from_fn(|_| ScriptedTurn::text("ok"))
                .latency(LATENCY)
                .record(false),
        )
        .build()?;

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
    let peak = status_kib("VmHWM:").unwrap_or(0);
    let per_run = (peak.saturating_sub(baseline) * 1024) as f64 / runs as f64;
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
    println!("per run:         {per_run:.0} bytes (target ≤ 5120)");
    assert_eq!(completed, runs, "every run completes");
    Ok(())
}
