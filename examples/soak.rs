//! A soak: continuous load on the production stack over `ScriptedModel`,
//! with faults injected, printing every 10 s the runs a second, the p50/p99
//! run latency and the resident memory (RSS, from `/proc/self/statm`).
//!
//! ```sh
//! cargo run --release --example soak                 # 10 minutes, 64 runs at a time
//! cargo run --release --example soak -- 180 128      # 3 minutes, 128 at a time
//! ```
//!
//! Each run is a 3-turn trip plan with two tool calls, on retry ▸ timeout ▸
//! fallback ▸ cache ▸ rate limit (keyed by one of 100,000 tenants) ▸ PII, a
//! tool timeout, and a lifecycle layer with the injection guard and a
//! logging middleware. The model fails 4 % of its calls as unavailable,
//! rate-limits 2 % and answers 2 % past the call timeout; tools fail, panic
//! or hang. Most inputs are unique, so the response cache fills to its
//! bound; the tenants make the rate limiter see far more keys than it keeps.
//!
//! Memory must stay flat once warm (the cache full, the limiter's idle keys
//! at their bound): the last line compares the RSS after warm-up with the
//! highest seen since.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::Rng;
use tower_agent::lifecycle::builtin::guards::InjectionGuardMiddleware;
use tower_agent::lifecycle::LoggingMiddleware;
use tower_agent::prelude::*;
use tower_agent::types::ToolCall;

/// A call answered after this is one the call timeout abandons.
const CALL_TIMEOUT: Duration = Duration::from_millis(100);
const TOOL_TIMEOUT: Duration = Duration::from_millis(50);
const TENANTS: u64 = 100_000;
const EVERY: Duration = Duration::from_secs(10);

/// The run's tenant, for the rate limiter's key.
#[derive(Clone)]
struct Tenant(u64);

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct City {
    city: String,
}

/// Resident memory in MiB (Linux; `None` elsewhere).
fn rss_mib() -> Option<f64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: f64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096.0 / (1024.0 * 1024.0))
}

/// The model: which turn a request is at decides the answer, and a roll of
/// the dice decides whether it fails instead.
fn model() -> ScriptedModel {
    ScriptedModel::from_fn(|request| {
        let mut rng = rand::rng();
        let roll = rng.random_range(0..100);
        if roll < 4 {
            return ScriptedTurn::error(ErrorKind::Unavailable, "soak: overloaded");
        }
        if roll < 6 {
            return ScriptedTurn::rate_limited(Duration::from_millis(10));
        }
        let turn = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let answer = match turn {
            0 => ScriptedTurn::tool_call("weather", r#"{"city": "Paris"}"#),
            1 => ScriptedTurn::message(Message::assistant_tool_calls(vec![ToolCall::new(
                "",
                "weather",
                r#"{"city": "Rome"}"#,
            )])),
            _ => ScriptedTurn::text("Paris and Rome are sunny; book either."),
        };
        if roll < 8 {
            answer.delay(CALL_TIMEOUT * 3)
        } else {
            answer
        }
    })
    .record(false)
}

fn tools() -> ToolRouter {
    ToolRouter::new().tool(tool_fn("weather", "The weather", |c: City| async move {
        let roll = rand::rng().random_range(0..100);
        match roll {
            0..=2 => Err::<String, BoxError>("soak: the weather service is down".into()),
            3..=4 => panic!("soak: the tool panicked"),
            5..=6 => {
                tokio::time::sleep(TOOL_TIMEOUT * 4).await;
                Ok(String::new())
            }
            _ => Ok(format!("{}: sunny, 21C", c.city)),
        }
    }))
}

/// The agent under its lifecycle layer, boxed.
type Runner = tower::util::BoxCloneSyncService<RunRequest, AgentRun, AgentError>;

fn agent(logging: &LoggingMiddleware) -> Result<Runner, AgentError> {
    let budget = tower_agent::layers::retry::RetryBudget::default();
    let limits = ModelRateLimitLayer::new()
        .requests(1_000, Duration::from_secs(1))
        .key_fn(|call: &ModelCall| {
            let tenant = call.context.state::<Tenant>().map_or(0, |t| t.0);
            format!("tenant-{tenant}")
        });
    let model = ServiceBuilder::new()
        .llm_retry(LlmRetryLayer::new().budget(budget.clone()).backoff(
            tower_agent::layers::retry::Backoff::new(
                Duration::from_millis(5),
                Duration::from_millis(50),
            ),
        ))
        .call_timeout(CALL_TIMEOUT)
        .fallback(FallbackLayer::new().models(["backup-model"]).budget(budget))
        .response_cache(CacheLayer::new())
        .model_rate_limit(limits)
        .mask_pii(MaskPiiLayer::default())
        .service(model());
    let agent = Agent::builder("soak")
        .instructions("You plan trips.")
        .model(model)
        .model_name("main-model")
        .tools(tools())
        .tool_layer(CallTimeoutLayer::new(TOOL_TIMEOUT))
        .build()?;
    let stack = MiddlewareStack::new()
        .push(InjectionGuardMiddleware::new())
        .push(logging.clone());
    Ok(Runner::new(LifecycleLayer::new(stack).layer(agent)))
}

/// What the workers report to the printer.
#[derive(Default)]
struct Window {
    latencies_us: Vec<u64>,
    outcomes: BTreeMap<&'static str, u64>,
}

fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() -> Result<(), AgentError> {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(600);
    let concurrency: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    // The tools' panics are part of the load; keep them off the terminal,
    // and report every other.
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
        if !message.is_some_and(|m| m.starts_with("soak:")) {
            default(info);
        }
    }));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(soak(Duration::from_secs(secs), concurrency))
}

async fn soak(length: Duration, concurrency: usize) -> Result<(), AgentError> {
    let logging = LoggingMiddleware::new();
    let service = agent(&logging)?;
    let window = Arc::new(Mutex::new(Window::default()));
    let outcomes_total = Arc::new(Mutex::new(BTreeMap::<&'static str, u64>::new()));
    let next_run = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    println!(
        "soak: {} s, {concurrency} runs at a time; RSS at start {:.1} MiB",
        length.as_secs(),
        rss_mib().unwrap_or(f64::NAN)
    );

    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let service = service.clone();
            let window = window.clone();
            let next_run = next_run.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let n = next_run.fetch_add(1, Ordering::Relaxed);
                    let tenant = rand::rng().random_range(0..TENANTS);
                    // One run in ten asks what many others asked: a cache hit.
                    let input = if n % 10 == 0 {
                        "Plan a night in Paris or Rome".to_owned()
                    } else {
                        format!("Plan night #{n} in Paris or Rome for ann@example.com")
                    };
                    let events = CollectingSink::new();
                    let ctx = RunContext::builder()
                        .events(events)
                        .timeout(Duration::from_secs(10))
                        .state(Tenant(tenant))
                        .build();
                    let started = Instant::now();
                    let result = service
                        .clone()
                        .oneshot(RunRequest::new(input).context(ctx))
                        .await;
                    let outcome = match &result {
                        Ok(run) => run.status.as_str(),
                        Err(err) => err.code(),
                    };
                    let mut w = window.lock().unwrap_or_else(PoisonError::into_inner);
                    w.latencies_us.push(started.elapsed().as_micros() as u64);
                    *w.outcomes.entry(outcome).or_default() += 1;
                }
            })
        })
        .collect();

    let started = Instant::now();
    let mut curve = Vec::new();
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + EVERY, EVERY);
    while started.elapsed() < length {
        ticker.tick().await;
        let Window {
            mut latencies_us,
            outcomes,
        } = std::mem::take(&mut *window.lock().unwrap_or_else(PoisonError::into_inner));
        latencies_us.sort_unstable();
        let rss = rss_mib().unwrap_or(f64::NAN);
        let t = started.elapsed().as_secs();
        println!(
            "t={t:>4} s  {:>7.0} runs/s  p50 {:>6.2} ms  p99 {:>6.2} ms  RSS {rss:>7.1} MiB  {outcomes:?}",
            latencies_us.len() as f64 / EVERY.as_secs_f64(),
            quantile(&latencies_us, 0.5) as f64 / 1000.0,
            quantile(&latencies_us, 0.99) as f64 / 1000.0,
        );
        let mut total = outcomes_total
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (code, n) in outcomes {
            *total.entry(code).or_default() += n;
        }
        curve.push((t, rss));
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        let _ = worker.await;
    }

    // Warm after a fifth of the soak (at least the first sample).
    let warm = (curve.len() / 5).max(1).min(curve.len());
    if let Some(&(warm_t, warm_rss)) = curve.get(warm - 1) {
        let (peak_t, peak) = curve[warm - 1..]
            .iter()
            .copied()
            .fold((warm_t, warm_rss), |a, b| if b.1 > a.1 { b } else { a });
        let last = curve.last().map_or(warm_rss, |c| c.1);
        let growth = (peak - warm_rss) / warm_rss * 100.0;
        println!(
            "runs started: {}; outcomes {:?}; hooks counted {}",
            next_run.load(Ordering::Relaxed),
            outcomes_total
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            logging.counts().total()
        );
        println!(
            "RSS after warm-up (t={warm_t} s) {warm_rss:.1} MiB, peak since {peak:.1} MiB (t={peak_t} s, {growth:+.1} %), last {last:.1} MiB: {}",
            if growth <= 5.0 { "flat (within 5 %)" } else { "GROWING" }
        );
    }
    Ok(())
}
