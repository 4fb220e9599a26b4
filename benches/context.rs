//! The per-turn cost of each context middleware on a thread of 1, 100 and
//! 10,000 messages, with the same one-turn run and no middleware as the
//! baseline of each group.
//!
//! Each iteration is one turn of a long-lived thread: a run on the same
//! history and the same run context (so what the middleware keeps per run
//! carries over, as it does from turn to turn of one run), whose model
//! answers at once. The middleware's figure is its time minus the
//! baseline's. The thresholds are set so that each middleware works on
//! every turn (the trim cuts, the clearing clears) but does not
//! re-summarise: a compaction's own model call is not what is measured.

use std::hint::black_box;

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
use tower_agent::{Agent, RunContext, RunRequest, ScriptedModel, ScriptedTurn};

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

fn agent(stack: Option<MiddlewareStack>) -> BoxAgent {
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::text("ok")).record(false);
    let agent = Agent::builder("a")
        .instructions("You answer briefly.")
        .model(model)
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
        let mut group = c.benchmark_group(format!("context_one_turn_{name}"));
        for len in [1usize, 100, 10_000] {
            let history = thread(len);
            let agent = agent(stack.clone());
            let ctx = RunContext::new();
            let turn = || {
                let request = RunRequest::new("and now?")
                    .history(history.clone())
                    .context(ctx.clone());
                agent.clone().oneshot(request)
            };
            // The first turn counts the whole thread; the rest are measured.
            rt.block_on(turn()).unwrap();
            group.bench_with_input(BenchmarkId::from_parameter(len), &len, |b, _| {
                b.to_async(&rt)
                    .iter(|| async { black_box(turn().await.unwrap()) })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, per_turn);
criterion_main!(benches);
