//! A 3-turn run (model → tool → model → tool → model) on ScriptedModel,
//! against a minimal loop written directly on tower (the floor).

use std::convert::Infallible;

use criterion::{criterion_group, criterion_main, Criterion};
use tower::{service_fn, Layer, ServiceExt};
use tower_agent::lifecycle::{LifecycleLayer, LoggingMiddleware, MiddlewareStack};
use tower_agent::types::{Message, ToolCall};
use tower_agent::{Agent, RunRequest};

#[path = "common/mod.rs"]
mod common;

/// The floor: a model and a tool as plain tower services, a loop that keeps
/// the messages in a `Vec`.
async fn raw_tower_run() -> usize {
    let model = service_fn(|messages: Vec<Message>| async move {
        let turns = messages.iter().filter(|m| !m.tool_calls.is_empty()).count();
        Ok::<_, Infallible>(if turns < 2 {
            Message::assistant_tool_calls(vec![ToolCall::new("c", "lookup", r#"{"id": 7}"#)])
        } else {
            Message::assistant("done")
        })
    });
    let tool = service_fn(|call: ToolCall| async move {
        let args: serde_json::Value = serde_json::from_str(&call.arguments).unwrap_or_default();
        Ok::<_, Infallible>(Message::tool(call.id, args["id"].to_string()))
    });
    let mut messages = vec![Message::user("hi")];
    loop {
        let answer = model.oneshot(messages.clone()).await.unwrap();
        let calls = answer.tool_calls.clone();
        messages.push(answer);
        if calls.is_empty() {
            return messages.len();
        }
        for call in calls {
            messages.push(tool.oneshot(call).await.unwrap());
        }
    }
}

fn run(c: &mut Criterion) {
    let rt = common::runtime();
    let agent = Agent::builder("bench")
        .model(common::three_turn_model())
        .tools(common::lookup_tools())
        .build()
        .unwrap();
    // The full stack: the default model layers (a cache miss every turn:
    // each run asks something new) and a lifecycle layer with one middleware.
    let full = LifecycleLayer::new(MiddlewareStack::new().push(LoggingMiddleware::new())).layer(
        Agent::builder("bench")
            .model(common::default_stack(common::three_turn_model(), true))
            .tools(common::lookup_tools())
            .build()
            .unwrap(),
    );
    let mut group = c.benchmark_group("run_3_turns");
    group.bench_function("raw_tower_loop", |b| {
        b.to_async(&rt).iter(raw_tower_run);
    });
    let mut n = 0u64;
    group.bench_function("agent_no_middleware", |b| {
        b.to_async(&rt).iter(|| {
            n += 1;
            agent
                .clone()
                .oneshot(RunRequest::new(format!("question {n}")))
        });
    });
    group.bench_function("agent_full_default_stack", |b| {
        b.to_async(&rt).iter(|| {
            n += 1;
            full.clone()
                .oneshot(RunRequest::new(format!("question {n}")))
        });
    });
    group.finish();
}

criterion_group!(benches, run);
criterion_main!(benches);
