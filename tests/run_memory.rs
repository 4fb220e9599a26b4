//! The bytes a suspended run holds while it waits on its model, counted by
//! this binary's global allocator on tokio's paused clock: the same on any
//! machine, however loaded.
//!
//! One test function: the allocator's count is global to the process, so
//! the measures run one after the other, never beside other tests.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use peak_alloc::PeakAlloc;
use tower::Service;
use tower_agent::request::box_model;
use tower_agent::types::{Message, ModelRequest};
use tower_agent::{Agent, ModelCall, RunContext, ScriptedModel, ScriptedTurn};

#[global_allocator]
static ALLOCATOR: PeakAlloc = PeakAlloc;

const LATENCY: Duration = Duration::from_millis(50);

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a tokio runtime")
}

/// The bytes a boxed `ScriptedModel` call holds while it waits on the
/// model's latency, beyond the call itself.
fn scripted_call_bytes() -> usize {
    let runtime = paused_runtime();
    runtime.block_on(async {
        let mut model = box_model(
            ScriptedModel::from_fn(|_| ScriptedTurn::text("ok"))
                .latency(LATENCY)
                .record(false),
        );
        let call = ModelCall::new(
            ModelRequest::new("scripted", vec![Message::user("hi")]),
            RunContext::new(),
        );
        let before = ALLOCATOR.current_usage();
        let mut fut = model.call(call);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(fut.as_mut().poll(&mut cx).is_pending(), "it waits");
        let held = ALLOCATOR.current_usage().saturating_sub(before);
        let response = fut.await.expect("an answer");
        assert_eq!(response.message.text(), "ok");
        held
    })
}

/// A `ScriptedModel` with no latency answers on its first poll, with no
/// timer: the runtime has none.
fn zero_latency_answers_at_once() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let mut model = ScriptedModel::new([ScriptedTurn::text("now")]).latency(Duration::ZERO);
        let call = ModelCall::new(
            ModelRequest::new("scripted", vec![Message::user("hi")]),
            RunContext::new(),
        );
        let mut fut = pin!(model.call(call));
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready(answer) = fut.as_mut().poll(&mut cx) else {
            panic!("a model without latency answers on the first poll");
        };
        assert_eq!(answer.expect("an answer").message.text(), "now");
    });
}

/// The bytes each of `runs` runs holds while all of them wait on the model,
/// as `examples/concurrency.rs` counts them.
fn held_per_run(runs: usize) -> usize {
    let agent = Agent::builder("concurrent")
        .instructions("Answer in one word.")
        .model(
            ScriptedModel::from_fn(|_| ScriptedTurn::text("ok"))
                .latency(LATENCY)
                .record(false),
        )
        .build()
        .expect("an agent");
    let runtime = paused_runtime();
    runtime.block_on(async move {
        let mut tasks = tokio::task::JoinSet::new();
        // A first batch, joined, so the runtime's own first-use allocations
        // are not counted against the runs.
        for _ in 0..16 {
            let agent = agent.clone();
            tasks.spawn(async move { agent.run("warm up").await });
        }
        while let Some(joined) = tasks.join_next().await {
            joined.expect("a run task").expect("a completed run");
        }
        let before = ALLOCATOR.current_usage();
        for i in 0..runs {
            let agent = agent.clone();
            tasks.spawn(async move { agent.run(format!("question {i}")).await });
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        let held = ALLOCATOR.current_usage().saturating_sub(before);
        let mut completed = 0;
        while let Some(joined) = tasks.join_next().await {
            assert_eq!(joined.expect("a run task").expect("a run").output, "ok");
            completed += 1;
        }
        assert_eq!(completed, runs);
        held / runs
    })
}

#[test]
fn waiting_runs_hold_few_bytes() {
    zero_latency_answers_at_once();

    let call = scripted_call_bytes();
    // The model's future (its handle, the call, the timer: 136 bytes), in
    // the one box the type-erased stack puts it in; 152 bytes when the model
    // boxed its future and the stack boxed that box, and 720 when the future
    // kept the whole request and turn as well.
    assert!(call <= 144, "a waiting scripted call holds {call} bytes");

    let run = held_per_run(2_000);
    println!("scripted call: {call} bytes; waiting run: {run} bytes");
    // 3,217 bytes before the model's future, the context and the request's
    // settings shrank; 2,799 before the run's future stopped keeping its
    // result and the model turn's answer beside the futures that make them,
    // and the context its token and run id before they are asked for; 2,068
    // before the runs of an agent shared its system prompt, the observers
    // kept their tracing state off the run, and the context its thread,
    // deadline and event sink in one shared allocation; 1,628 before the
    // model calls shared the agent's settings, the context kept its price
    // table and hook points off its own room, and the model's future was
    // boxed once instead of twice.
    assert!(run <= 1_520, "a waiting run holds {run} bytes");
}
