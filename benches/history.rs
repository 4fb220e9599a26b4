//! The overhead of one turn as the thread grows: a run continuing a history
//! of 1, 100 and 10,000 messages, under the default stack without PII. Each
//! size is its own baseline; the target is a 10,000-to-1 ratio of at most
//! 1.2.
//!
//! Each iteration continues one long-lived thread, as a server keeping the
//! thread in memory would: the run appends its input and answer, then the
//! thread is truncated back to its length, keeping its incremental digests.
//! (Rebuilding a 10,000-message history per iteration would measure the
//! allocator's clean-up of the previous one, not the turn.)
//!
//! `caller_keeps_the_thread` continues a 100,000-message thread two ways:
//! `handed_over` gives the run the only handle (the baseline), `kept` gives
//! it a clone while the caller keeps its own, as a server holding a thread
//! in a map does. Appending to the shared thread must not copy it, so the
//! two should cost the same.

use std::cell::RefCell;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tower::ServiceExt;
use tower_agent::types::{History, Message};
use tower_agent::{Agent, RunRequest, ScriptedModel, ScriptedTurn};

#[path = "common/mod.rs"]
mod common;

const INSTRUCTIONS: &str = "You answer briefly.";

fn thread(len: usize) -> History {
    let mut messages = vec![Message::system(INSTRUCTIONS)];
    for i in 1..len {
        messages.push(if i % 2 == 1 {
            Message::user(format!("question {i} about the order"))
        } else {
            Message::assistant(format!("answer {i}: it shipped"))
        });
    }
    let history = History::from(messages);
    history.digest();
    history.text_len();
    history
}

fn history(c: &mut Criterion) {
    let rt = common::runtime();
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::text("ok")).record(false);
    let agent = Agent::builder("bench")
        .instructions(INSTRUCTIONS)
        .model(common::default_stack(model, false))
        .build()
        .unwrap();
    let mut group = c.benchmark_group("one_turn_by_history_length");
    let mut n = 0u64;
    for len in [1usize, 100, 10_000] {
        let thread = RefCell::new(thread(len));
        group.bench_with_input(BenchmarkId::from_parameter(len), &len, |b, &len| {
            b.to_async(&rt).iter(|| {
                n += 1;
                let request = RunRequest::new(format!("and now? ({n})")).history(thread.take());
                let agent = agent.clone();
                let thread = &thread;
                async move {
                    let mut messages = agent.oneshot(request).await.unwrap().messages;
                    messages.truncate(len);
                    *thread.borrow_mut() = messages;
                }
            });
        });
    }
    group.finish();
}

fn caller_keeps_the_thread(c: &mut Criterion) {
    const LEN: usize = 100_000;
    let rt = common::runtime();
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::text("ok")).record(false);
    let agent = Agent::builder("bench")
        .instructions(INSTRUCTIONS)
        .model(common::default_stack(model, false))
        .build()
        .unwrap();
    let mut group = c.benchmark_group("caller_keeps_the_thread");
    let mut n = 0u64;
    let handed = RefCell::new(thread(LEN));
    group.bench_function(BenchmarkId::new("handed_over", LEN), |b| {
        b.to_async(&rt).iter(|| {
            n += 1;
            let request = RunRequest::new(format!("and now? ({n})")).history(handed.take());
            let agent = agent.clone();
            let handed = &handed;
            async move {
                let mut messages = agent.oneshot(request).await.unwrap().messages;
                messages.truncate(LEN);
                *handed.borrow_mut() = messages;
            }
        });
    });
    let kept = thread(LEN);
    group.bench_function(BenchmarkId::new("kept", LEN), |b| {
        b.to_async(&rt).iter(|| {
            n += 1;
            let request = RunRequest::new(format!("and now? ({n})")).history(kept.clone());
            let agent = agent.clone();
            async move {
                let run = agent.oneshot(request).await.unwrap();
                assert_eq!(run.messages.len(), LEN + 2);
            }
        });
    });
    group.finish();
}

criterion_group!(benches, history, caller_keeps_the_thread);
criterion_main!(benches);
