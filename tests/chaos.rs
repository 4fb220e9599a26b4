//! Chaos at scale: thousands of concurrent runs of one agent against the
//! protocol mock of `scripts/peers/start.sh` (`@copilotkit/aimock`), while
//! the mock and the tools fail in every way they can.
//!
//! The agent is the README's production stack: retry ▸ timeout ▸ fallback
//! (to `backup-model`) ▸ cache ▸ rate limit ▸ PII ▸ `OpenAiChat`, tools under
//! a timeout, and a lifecycle layer with the prompt-injection guard, a
//! `LoggingMiddleware` and an `after_agent` counter. Each run is a 3-turn
//! trip plan with two tool calls (`tests/fixtures/aimock/chaos.json`), under
//! its own aimock `X-Test-Id`, so the mock's journal tells what each of its
//! attempts got.
//!
//! Faults: every fixture answer is a 500, malformed JSON, a 429 with
//! `Retry-After` or a dropped connection at 3 % each (aimock's chaos rates);
//! "slow" runs get a first turn-2 answer 20 s late, past the 12 s call
//! timeout; "cut" runs get a first turn-3 stream cut after its first chunks.
//! Tools error, panic, hang past their timeout, answer with a prompt
//! injection or stop the run. Some inputs are injections themselves.
//!
//! For every run: it ends completed, stopped or failed with a code its
//! faults explain, within its deadline; its events balance and
//! `after_agent` ran once; its usage ledger is exactly what the mock
//! reported for the attempts that reached it, but for answers the run had
//! stopped waiting for (at most one per timeout, or one for a run cut short:
//! a busy machine may read an answer after its call timed out, and the
//! provider billed it); each successful model call was answered once, by
//! the mock or the cache; its sink never got the text
//! of a failed attempt (the sink is always a prefix of the one right text).
//! Across all runs: every extra attempt was drawn from the one retry budget,
//! which never gave more than it held.
//!
//! The storm runs the same load with 20 % of the runs cancelled (their
//! token) or dropped (their future) at a random moment; afterwards no task
//! and no hanging tool outlives its run.
//!
//! `CHAOS_RUNS` (default 2,000) and `CHAOS_SEED` (default: the clock) set
//! the load; the figures go to stderr.
#![cfg(feature = "openai")]

mod chaos_support;
mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use chaos_support::check::{self, quantile, Tally};
use chaos_support::{config, journal, quiet_tool_panics, run_one, CountingBudget, Load, Scenario};
use chaos_support::{LIVE_HANGS, RUN_DEADLINE};
use tower_agent::lifecycle::HookPoint;

/// One load at a time: the two tests share the mock and the machine.
static ONE_LOAD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs the load with `cancel_share` of the runs cut short, checks every
/// run and the load as a whole, and prints the figures.
async fn load(name: &str, cancel_share: f64) {
    let _one = ONE_LOAD.lock().await;
    quiet_tool_panics();
    let url = support::require_peer("AIMOCK_URL");
    let (runs, seed) = config();
    let prefix = support::unique(name);
    let metrics = tokio::runtime::Handle::current().metrics();
    let tasks_before = metrics.num_alive_tasks();

    // A tight budget: a fifth of the runs in reserve plus 10 % of the calls,
    // less than the faults ask for, so it runs dry during the load.
    let budget = CountingBudget::new(runs as u64 / 5, 0.1);
    let Load {
        budget,
        logging,
        service,
    } = Load::new(&url, budget);
    let scenarios = Scenario::draw(runs, seed, cancel_share, Duration::from_secs(3));
    let started = Instant::now();
    let handles: Vec<_> = scenarios
        .into_iter()
        .map(|scenario| tokio::spawn(run_one(service.clone(), scenario, prefix.clone())))
        .collect();
    drop(service);
    let mut observed = Vec::with_capacity(runs);
    for handle in handles {
        observed.push(handle.await.expect("a run's task panicked"));
    }
    let wall = started.elapsed();
    let journal = journal::by_test_id(&url, &prefix).await;

    // Every run, against what the mock saw of it.
    let mut tally = Tally::default();
    let mut wrong = Vec::new();
    for run in &observed {
        let attempts = journal.get(&*run.test_id).map_or(&[][..], Vec::as_slice);
        wrong.extend(check::run(run, attempts, &mut tally));
    }

    // The load as a whole: one budget paid for every extra attempt.
    let granted = budget.granted();
    if granted != tally.retries + tally.fallbacks {
        wrong.push(format!(
            "the budget granted {granted} withdrawals, for {} retries and {} fallbacks",
            tally.retries, tally.fallbacks
        ));
    }
    if budget.deposits() > tally.model_calls {
        wrong.push(format!(
            "{} deposits for {} model calls",
            budget.deposits(),
            tally.model_calls
        ));
    }
    if granted > budget.allowance(tally.model_calls) {
        wrong.push(format!(
            "{granted} extra attempts, more than the {} the budget allows",
            budget.allowance(tally.model_calls)
        ));
    }
    if tally.transport_calls > tally.model_calls + granted {
        wrong.push(format!(
            "{} calls reached the transport: more than {} model calls and {granted} extra attempts",
            tally.transport_calls, tally.model_calls
        ));
    }
    let after_agent = logging.counts().get(HookPoint::AfterAgent);
    if after_agent != tally.after_agent {
        wrong.push(format!(
            "the logging middleware counted {after_agent} after_agent hooks, the runs {}",
            tally.after_agent
        ));
    }

    // Nothing outlives its run: no task, no hanging tool.
    drop(observed);
    let settle = Instant::now();
    while metrics.num_alive_tasks() > tasks_before && settle.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tasks_after = metrics.num_alive_tasks();
    if tasks_after > tasks_before {
        wrong.push(format!(
            "{tasks_after} tasks alive after the load, {tasks_before} before"
        ));
    }
    let hangs = LIVE_HANGS.load(Ordering::SeqCst);
    if hangs != 0 {
        wrong.push(format!("{hangs} hanging tool calls outlived their runs"));
    }

    report(name, runs, seed, wall, &budget, &mut tally);
    // The load exercised what it claims to.
    if runs >= 500 {
        for fault in ["500", "malformed JSON", "429 + Retry-After", "disconnect"] {
            if !tally.mock_faults.contains_key(fault) {
                wrong.push(format!("the mock injected no {fault}"));
            }
        }
        for fault in ["error", "panic", "hang", "poison", "stop"] {
            if !tally.tool_faults.contains_key(fault) {
                wrong.push(format!("no tool call injected {fault}"));
            }
        }
        if tally.timeouts_retried == 0 {
            wrong.push("no slow answer timed out and was retried".into());
        }
        if tally.cache_hits == 0 {
            wrong.push("no call was answered from the cache".into());
        }
    }
    let shown: Vec<_> = wrong.iter().take(20).collect();
    assert!(
        wrong.is_empty(),
        "{} problems in {runs} runs (seed {seed}); the first:\n{}",
        wrong.len(),
        shown
            .iter()
            .map(|w| w.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn report(
    name: &str,
    runs: usize,
    seed: u64,
    wall: Duration,
    budget: &CountingBudget,
    tally: &mut Tally,
) {
    let p50 = quantile(&mut tally.latencies_ms, 0.5);
    let p99 = quantile(&mut tally.latencies_ms, 0.99);
    let max = tally.latencies_ms.last().copied().unwrap_or(0);
    let lines = [
        format!(
            "[{name}] {runs} runs in {:.1} s (seed {seed}); run latency p50 {p50} ms, p99 {p99} ms, max {max} ms (deadline {} s)",
            wall.as_secs_f64(),
            RUN_DEADLINE.as_secs()
        ),
        format!("[{name}] inputs: {:?}", tally.inputs),
        format!("[{name}] outcomes: {:?}", tally.outcomes),
        format!(
            "[{name}] mock: {} requests, {} answered ({} after the run stopped waiting); faults {:?}",
            tally.attempts, tally.answered, tally.abandoned, tally.mock_faults
        ),
        format!(
            "[{name}] tool faults: {:?}; runs failed on a transport error: {}",
            tally.tool_faults, tally.transport_failures
        ),
        format!(
            "[{name}] {} model calls, {} reached the transport; {} retries ({} after a timeout), {} fallbacks, {} cache hits, {} rate-limit waits",
            tally.model_calls,
            tally.transport_calls,
            tally.retries,
            tally.timeouts_retried,
            tally.fallbacks,
            tally.cache_hits,
            tally.rate_limit_waits
        ),
        format!(
            "[{name}] retry budget: {} deposits, {} granted, {} refused (allowance {})",
            budget.deposits(),
            budget.granted(),
            budget.refused(),
            budget.allowance(budget.deposits())
        ),
    ];
    for line in lines {
        support::shout(&line);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn chaos_thousands_of_runs_against_a_faulty_provider() {
    load("chaos", 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn chaos_cancellation_storm() {
    load("storm", 0.2).await;
}
