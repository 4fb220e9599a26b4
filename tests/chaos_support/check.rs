//! What must hold for every run of the load, and the tallies reported at
//! the end.

use std::collections::{BTreeMap, HashMap};

use tower_agent::error::find;
use tower_agent::event::AgentEvent;
use tower_agent::types::{RunStatus, Usage};

use super::journal::{Attempt, Fault};
use super::{Input, Observed, ToolFault, FINAL, TURN_2_TEXT};

/// Counts over the whole load.
#[derive(Debug, Default)]
pub struct Tally {
    pub outcomes: BTreeMap<String, u64>,
    pub mock_faults: BTreeMap<String, u64>,
    pub tool_faults: BTreeMap<&'static str, u64>,
    pub inputs: BTreeMap<String, u64>,
    pub attempts: u64,
    pub answered: u64,
    pub model_calls: u64,
    pub retries: u64,
    pub fallbacks: u64,
    pub cache_hits: u64,
    pub rate_limit_waits: u64,
    pub timeouts_retried: u64,
    /// Answers the mock sent (and billed) after the run stopped waiting.
    pub abandoned: u64,
    /// Runs that failed on a transport error (the mock may have seen none).
    pub transport_failures: u64,
    pub transport_calls: u64,
    pub after_agent: u64,
    pub latencies_ms: Vec<u64>,
}

impl Tally {
    fn bump<K: Ord>(map: &mut BTreeMap<K, u64>, key: K) {
        *map.entry(key).or_default() += 1;
    }
}

/// Checks one run against its journal; returns what is wrong with it.
pub fn run(run: &Observed, journal: &[Attempt], tally: &mut Tally) -> Vec<String> {
    let id = &run.test_id;
    let mut wrong = Vec::new();
    let s = &run.scenario;
    Tally::bump(&mut tally.inputs, format!("{:?}", s.input));
    tally.latencies_ms.push(run.elapsed.as_millis() as u64);
    tally.transport_calls += u64::from(run.transport_calls);
    tally.after_agent += u64::from(run.after_agent);
    tally.attempts += journal.len() as u64;

    if !run.in_time {
        wrong.push(format!(
            "{id}: still running {:?} after its start",
            run.elapsed
        ));
    }
    wrong.extend(
        balance(&run.events)
            .into_iter()
            .map(|e| format!("{id}: {e}")),
    );

    // after_agent once for a run that ended; a dropped run may have missed it.
    let after_ok = if run.dropped() {
        run.after_agent <= 1
    } else {
        run.after_agent == 1
    };
    if !after_ok {
        wrong.push(format!(
            "{id}: after_agent ran {} times (dropped: {})",
            run.after_agent,
            run.dropped()
        ));
    }

    // Faults the mock injected, and what the run's tools did.
    for attempt in journal {
        match attempt.outcome {
            Ok(_) => tally.answered += 1,
            Err(fault) => Tally::bump(&mut tally.mock_faults, fault.name()),
        }
    }
    let mut model_ok = 0u64;
    let mut cache_hits = 0u64;
    for event in &run.events {
        match event {
            AgentEvent::ModelCallStarted { .. } => tally.model_calls += 1,
            AgentEvent::ModelCallCompleted { error: None, .. } => model_ok += 1,
            AgentEvent::RetryAttempt { code, .. } => {
                tally.retries += 1;
                if *code == "TIMEOUT" {
                    tally.timeouts_retried += 1;
                }
            }
            AgentEvent::FallbackUsed { .. } => tally.fallbacks += 1,
            AgentEvent::CacheHit { .. } => cache_hits += 1,
            AgentEvent::RateLimitWait { .. } => tally.rate_limit_waits += 1,
            AgentEvent::ToolCallStarted { tool, .. } => {
                let fault = s.tools[usize::from(tool == "book_hotel")];
                if fault != ToolFault::None {
                    Tally::bump(&mut tally.tool_faults, fault.name());
                }
            }
            _ => {}
        }
    }
    tally.cache_hits += cache_hits;

    // Usage: what the ledger holds is what the mock reported.
    let mut billed: Vec<(String, Usage)> = run
        .ledger
        .iter()
        .map(|e| (e.model.to_string(), e.usage))
        .collect();
    let mut reported: Vec<(String, Usage)> = journal
        .iter()
        .filter_map(|a| a.outcome.ok().map(|u| (a.model.clone(), u)))
        .collect();
    billed.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    reported.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    // An attempt the run gave up on (its call timed out, or the run was cut
    // short) may have been answered and billed by the mock without the
    // answer ever reaching the run; every other answer is billed exactly.
    let timeouts = run
        .events
        .iter()
        .filter(|e| {
            matches!(
                e,
                AgentEvent::RetryAttempt {
                    code: "TIMEOUT",
                    ..
                }
            )
        })
        .count()
        + usize::from(matches!(&run.result, Some(Err(e)) if e.code() == "TIMEOUT"));
    let cut_short = run.dropped() || run.token_cancelled;
    let may_abandon = timeouts + usize::from(cut_short);
    let mut abandoned = reported.clone();
    for entry in &billed {
        match abandoned.iter().position(|r| r == entry) {
            Some(i) => {
                abandoned.remove(i);
            }
            None => wrong.push(format!(
                "{id}: billed {entry:?}, which the mock never reported ({reported:?})"
            )),
        }
    }
    tally.abandoned += abandoned.len() as u64;
    if abandoned.len() > may_abandon {
        wrong.push(format!(
            "{id}: billed {billed:?}, the mock reported {reported:?}: {} answers unbilled, with {timeouts} timeouts (cut short: {cut_short})",
            abandoned.len()
        ));
    }
    // Each model call that succeeded was answered once: by the mock or
    // from the cache.
    let answered = (reported.len() - abandoned.len()) as u64;
    if !cut_short && answered + cache_hits != model_ok {
        wrong.push(format!(
            "{id}: {model_ok} model calls succeeded, the mock answered {answered} (and {} unread) and the cache {cache_hits}",
            abandoned.len()
        ));
    }
    let billed_sum = billed.iter().fold(Usage::default(), |sum, (_, u)| sum + *u);

    // The outcome: completed, stopped, or failed with a defined code.
    let canonical = format!("{TURN_2_TEXT}{FINAL}");
    let (status, code) = match &run.result {
        None => ("dropped", None),
        Some(Ok(done)) => {
            if done.usage != billed_sum {
                wrong.push(format!(
                    "{id}: the run reports {:?}, its ledger sums to {billed_sum:?}",
                    done.usage
                ));
            }
            match &done.status {
                RunStatus::Completed => {
                    if done.output != FINAL
                        || done.counters.turns != 3
                        || done.counters.tool_calls != 2
                    {
                        wrong.push(format!(
                            "{id}: completed with {:?} after {} turns and {} tool calls",
                            done.output, done.counters.turns, done.counters.tool_calls
                        ));
                    }
                    if s.streamed && run.streamed != canonical {
                        wrong.push(format!(
                            "{id}: completed, but its sink got {:?}",
                            run.streamed
                        ));
                    }
                    ("completed", None)
                }
                RunStatus::Stopped(_) => {
                    if !s.tools.contains(&ToolFault::Stop) {
                        wrong.push(format!("{id}: stopped, but no tool asked it to"));
                    }
                    ("stopped", None)
                }
                RunStatus::Paused(_) => {
                    wrong.push(format!("{id}: paused, with nothing to approve"));
                    ("paused", None)
                }
            }
        }
        Some(Err(err)) => {
            let code = err.code();
            let guarded = s.input == Input::Injection || s.tools.contains(&ToolFault::Poison);
            let defined = match code {
                // A fault the mock injected, or a connection that failed
                // before the mock saw the request.
                "PROVIDER_UNAVAILABLE" => {
                    let transport = find::<reqwest::Error>(err).is_some();
                    if transport {
                        tally.transport_failures += 1;
                    }
                    transport
                        || journal.iter().any(|a| {
                            matches!(
                                a.outcome,
                                Err(Fault::Drop
                                    | Fault::Malformed
                                    | Fault::Disconnect
                                    | Fault::Cut)
                            )
                        })
                }
                "RATE_LIMITED" => journal.iter().any(|a| a.outcome == Err(Fault::RateLimit)),
                // A slow answer, a hanging tool, or a machine too busy to
                // read an answer within the call timeout.
                "TIMEOUT" => true,
                "GUARDRAIL_TRIPPED" => guarded,
                "CANCELLED" => run.token_cancelled,
                _ => false,
            };
            if !defined {
                wrong.push(format!(
                    "{id}: failed with {code} ({err}), which its faults do not explain; journal {journal:?}"
                ));
            }
            if s.input == Input::Injection && !run.token_cancelled && code != "GUARDRAIL_TRIPPED" {
                wrong.push(format!("{id}: the injection got past the guard: {code}"));
            }
            ("failed", Some(code))
        }
    };
    let key = match code {
        Some(code) => format!("failed {code}"),
        None => status.to_owned(),
    };
    Tally::bump(&mut tally.outcomes, key);
    if let Some(AgentEvent::RunCompleted {
        status: said,
        error,
        ..
    }) = run
        .events
        .iter()
        .rev()
        .find(|e| matches!(e, AgentEvent::RunCompleted { .. }))
    {
        if !run.dropped() && (*said != status || *error != code) {
            wrong.push(format!(
                "{id}: RunCompleted says {said} {error:?}, the run {status} {code:?}"
            ));
        }
    }

    // The sink holds no text twice: it is a prefix of the one canonical
    // text whatever happened, and empty when nothing streamed.
    if !s.streamed && !run.streamed.is_empty() {
        wrong.push(format!("{id}: not streamed, but its sink got text"));
    }
    if !canonical.starts_with(&run.streamed) {
        wrong.push(format!(
            "{id}: its sink got {:?}, not a prefix of {canonical:?}",
            run.streamed
        ));
    }
    wrong
}

/// Every `*Started` has its `*Completed`, none before it, one run at most.
fn balance(events: &[AgentEvent]) -> Vec<String> {
    let mut open: HashMap<String, i64> = HashMap::new();
    let mut wrong = Vec::new();
    for event in events {
        let (key, step) = match event {
            AgentEvent::RunStarted { run_id, .. } => (format!("run {run_id}"), 1),
            AgentEvent::RunCompleted { run_id, .. } => (format!("run {run_id}"), -1),
            AgentEvent::ModelCallStarted {
                run_id, iteration, ..
            } => (format!("model call {run_id} {iteration}"), 1),
            AgentEvent::ModelCallCompleted {
                run_id, iteration, ..
            } => (format!("model call {run_id} {iteration}"), -1),
            AgentEvent::ToolCallStarted {
                run_id, call_id, ..
            } => (format!("tool call {run_id} {call_id}"), 1),
            AgentEvent::ToolCallCompleted {
                run_id, call_id, ..
            } => (format!("tool call {run_id} {call_id}"), -1),
            AgentEvent::MiddlewareStarted {
                run_id,
                middleware,
                hook,
            } => (format!("hook {run_id} {middleware} {hook}"), 1),
            AgentEvent::MiddlewareCompleted {
                run_id,
                middleware,
                hook,
                ..
            } => (format!("hook {run_id} {middleware} {hook}"), -1),
            _ => continue,
        };
        let count = open.entry(key.clone()).or_default();
        *count += step;
        if *count < 0 {
            wrong.push(format!("{key} completed before it started"));
        }
    }
    let runs = events
        .iter()
        .filter(|e| matches!(e, AgentEvent::RunStarted { .. }))
        .count();
    if runs > 1 {
        wrong.push(format!("{runs} RunStarted events"));
    }
    let mut unbalanced: Vec<_> = open.into_iter().filter(|(_, n)| *n != 0).collect();
    unbalanced.sort();
    for (key, n) in unbalanced {
        wrong.push(format!("{key} is unbalanced by {n}"));
    }
    wrong
}

/// The `q`-quantile of `values` (sorted in place).
pub fn quantile(values: &mut [u64], q: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    let i = ((values.len() - 1) as f64 * q).round() as usize;
    values[i]
}
