//! The overhead of one turn as the thread grows: a run continuing a history
//! of 1, 100 and 10,000 messages, under the default stack without PII. Each size is its own baseline; the target
//! is a 10,000-to-1 ratio of at most 1.2.
//!
//! The history is built outside the measurement as the previous run of the
//! thread leaves it: its incremental digest warm, and room to grow (a `Vec`
//! grown by pushes has spare capacity; a freshly loaded exact-size one pays
//! one O(n) reallocation on its first push, which is the loading's cost, not
//! the turn's). Dropping the run's output is outside the measurement too.

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use tower::ServiceExt;
use tower_agent::types::{History, Message};
use tower_agent::{Agent, RunRequest, ScriptedModel, ScriptedTurn};

#[path = "common/mod.rs"]
mod common;

const INSTRUCTIONS: &str = "You answer briefly.";

fn thread(len: usize) -> Vec<Message> {
    let mut messages = vec![Message::system(INSTRUCTIONS)];
    for i in 1..len {
        messages.push(if i % 2 == 1 {
            Message::user(format!("question {i} about the order"))
        } else {
            Message::assistant(format!("answer {i}: it shipped"))
        });
    }
    messages
}

fn history(c: &mut Criterion) {
    let rt = common::runtime();
    // The default stack without PII (a cache miss on every run).
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::text("ok")).record(false);
    let agent = Agent::builder("bench")
        .instructions(INSTRUCTIONS)
        .model(common::default_stack(model, false))
        .build()
        .unwrap();
    let mut group = c.benchmark_group("one_turn_by_history_length");
    let mut n = 0u64;
    for len in [1usize, 100, 10_000] {
        let messages = thread(len);
        group.bench_with_input(BenchmarkId::from_parameter(len), &len, |b, _| {
            b.to_async(&rt).iter_batched(
                || {
                    let mut grown = Vec::with_capacity(messages.len() + 16);
                    grown.extend(messages.iter().cloned());
                    let history = History::from(grown);
                    history.digest();
                    history.text_len();
                    n += 1;
                    RunRequest::new(format!("and now? ({n})")).history(history)
                },
                |request| agent.clone().oneshot(request),
                BatchSize::LargeInput,
            );
        });
    }
    group.finish();
}

criterion_group!(benches, history);
criterion_main!(benches);
