//! The per-turn cost of each context middleware on a thread of 1, 100 and
//! 10,000 messages, with the same one-turn run and no middleware as the
//! baseline of each group.
//!
//! The figure is one turn in a run already under way, on a thread of that
//! length: each sample times a run of 21 turns and a run of 1 turn on the
//! same history (each from a fresh run context, so the first turn of both
//! counts the whole thread) and reports the difference over 20. The model
//! calls a tool until the run has 20 tool turns, then answers. A
//! middleware's cost per turn is its figure minus `no_middleware`'s. The
//! thresholds are set so that each middleware works on every turn (the trim
//! cuts, the clearing clears) but does not summarise: a compaction's own
//! model call is not what is measured.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tower::{Layer, ServiceExt};
use tower_agent::lifecycle::builtin::{
    ClearToolOutputsMiddleware, ContextCompressionMiddleware, DynamicSystemPromptMiddleware,
    MessageTrimMiddleware, SummarizationPolicy, TrimStrategy,
};
use tower_agent::lifecycle::{LifecycleLayer, MiddlewareStack};
use tower_agent::request::BoxAgent;
use tower_agent::tokens::TokenCounters;
use tower_agent::types::{History, Message, ToolCall};
use tower_agent::{Agent, RunRequest, ScriptedModel, ScriptedTurn};

#[path = "common/mod.rs"]
mod common;

/// A thread of `len` messages: the system prompt, then user turns with a
/// tool call and its result each.
fn thread(len: usize) -> History {
    let mut messages = vec![Message::system("You answer briefly.")];
    let mut i = 0;
    while messages.len() < len {
        match i % 4 {
            0 => messages.push(Message::user(format!("question {i} about the order"))),
            1 => messages.push(Message::assistant_tool_calls(vec![ToolCall::new(
                format!("c{i}"),
                "lookup",
                r#"{"id": 7}"#,
            )])),
            2 => messages.push(Message::tool(
                format!("c{}", i - 1),
                "shipped on Monday ".repeat(8),
            )),
            _ => messages.push(Message::assistant(format!("answer {i}: it shipped"))),
        }
        i += 1;
    }
    // Never end on a call without its result.
    if messages.last().is_some_and(|m| !m.tool_calls.is_empty()) {
        messages.pop();
    }
    History::from(messages)
}

/// Calls `lookup` `turns - 1` times, then answers (runs are sequential:
/// it counts its calls, since a trimmed request does not show them all).
fn agent(stack: Option<MiddlewareStack>, turns: usize) -> BoxAgent {
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let model = ScriptedModel::from_fn(move |_| {
        let call = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if call % turns != 0 {
            ScriptedTurn::tool_call("lookup", r#"{"id": 7}"#)
        } else {
            ScriptedTurn::text("ok")
        }
    })
    .record(false);
    let agent = Agent::builder("a")
        .instructions("You answer briefly.")
        .model(model)
        .tools(common::lookup_tools())
        .max_turns(100)
        .build()
        .unwrap();
    match stack {
        Some(stack) => BoxAgent::new(LifecycleLayer::new(stack).layer(agent).map_err(Into::into)),
        None => BoxAgent::new(agent.map_err(Into::into)),
    }
}

fn cases() -> Vec<(&'static str, Option<MiddlewareStack>)> {
    vec![
        ("no_middleware", None),
        (
            "trim_tokens",
            Some(MiddlewareStack::new().push_model(
                MessageTrimMiddleware::new(TrimStrategy::MaxTokens(2_000)).retain(0.75),
            )),
        ),
        (
            "trim_messages",
            Some(
                MiddlewareStack::new()
                    .push_model(MessageTrimMiddleware::new(TrimStrategy::LastMessages(40))),
            ),
        ),
        (
            "compaction_below_threshold",
            Some(
                MiddlewareStack::new().push(
                    ContextCompressionMiddleware::new(SummarizationPolicy::tokens(100_000_000))
                        .counters(TokenCounters::openai()),
                ),
            ),
        ),
        (
            "clear_tool_outputs",
            Some(MiddlewareStack::new().push(ClearToolOutputsMiddleware::new().keep_turns(3))),
        ),
        (
            "dynamic_system_prompt",
            Some(
                MiddlewareStack::new().push(DynamicSystemPromptMiddleware::new(|_| {
                    "Today is Tuesday.".to_owned()
                })),
            ),
        ),
    ]
}

fn per_turn(c: &mut Criterion) {
    let rt = common::runtime();
    for (name, stack) in cases() {
        let mut group = c.benchmark_group(format!("context_per_turn_{name}"));
        for len in [1usize, 100, 10_000] {
            let history = thread(len);
            let long = agent(stack.clone(), 21);
            let short = agent(stack.clone(), 1);
            let run = |agent: &BoxAgent| {
                let request = RunRequest::new("and now?").history(history.clone());
                agent.clone().oneshot(request)
            };
            assert_eq!(rt.block_on(run(&long)).unwrap().counters.turns, 21);
            assert_eq!(rt.block_on(run(&short)).unwrap().counters.turns, 1);
            group.bench_with_input(BenchmarkId::from_parameter(len), &len, |b, _| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let start = Instant::now();
                        black_box(rt.block_on(run(&long)).unwrap());
                        let long_run = start.elapsed();
                        let start = Instant::now();
                        black_box(rt.block_on(run(&short)).unwrap());
                        let short_run = start.elapsed();
                        total += long_run.saturating_sub(short_run) / 20;
                    }
                    total
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, per_turn);
criterion_main!(benches);
