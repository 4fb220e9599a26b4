//! A 3-turn run (model → tool → model → tool → model) on ScriptedModel,
//! against a minimal loop written directly on tower (the floor).
//!
//! For instruction counts, which hold still on a busy machine:
//! `BENCH_CASE=agent_no_middleware BENCH_RUNS=1000 valgrind --tool=callgrind
//! target/release/deps/run-…` runs one case that many times without
//! criterion; the difference between two run counts, divided by the
//! difference in runs, is the instructions per run.

use std::convert::Infallible;

use criterion::{criterion_group, Criterion};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_agent::lifecycle::{Lifecycle, LifecycleLayer, LoggingMiddleware, MiddlewareStack};
use tower_agent::types::{AgentRun, Message, ToolCall};
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

/// The agent with no middleware.
fn bare_agent() -> Agent {
    Agent::builder("bench")
        .model(common::three_turn_model())
        .tools(common::lookup_tools())
        .build()
        .unwrap()
}

/// The full stack: the default model layers (a cache miss every turn: each
/// run asks something new) and a lifecycle layer with one middleware.
fn full_stack() -> Lifecycle<Agent> {
    let agent = Agent::builder("bench")
        .model(common::default_stack(common::three_turn_model(), true))
        .tools(common::lookup_tools())
        .build()
        .unwrap();
    LifecycleLayer::new(MiddlewareStack::new().push(LoggingMiddleware::new())).layer(agent)
}

/// `BENCH_CASE` run `BENCH_RUNS` times, without criterion: for callgrind.
/// Each run asks something new, as in the group.
fn counted_runs(case: &str, runs: usize) {
    let rt = common::runtime();
    match case {
        "raw_tower_loop" => rt.block_on(async {
            for _ in 0..runs {
                raw_tower_run().await;
            }
        }),
        "agent_no_middleware" => rt.block_on(agent_runs(bare_agent(), runs)),
        "agent_full_default_stack" => rt.block_on(agent_runs(full_stack(), runs)),
        _ => panic!("BENCH_CASE names a case of the group"),
    }
}

/// `runs` runs of `service`, as the group makes them.
async fn agent_runs<S>(service: S, runs: usize)
where
    S: Service<RunRequest, Response = AgentRun> + Clone,
    S::Error: std::fmt::Debug,
{
    for n in 0..runs {
        service
            .clone()
            .oneshot(RunRequest::new(format!("question {n}")))
            .await
            .unwrap();
    }
}

fn run(c: &mut Criterion) {
    let rt = common::runtime();
    let agent = bare_agent();
    let full = full_stack();
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

fn main() {
    common::main(counted_runs, benches);
}
