//! The onion: registration order, placement levels, inherited hooks.

mod lifecycle_support;

use lifecycle_support::{lookup_tools, run_with, Log, Recorder};
use proptest::prelude::*;
use tower::{Layer, ServiceExt};
use tower_agent::lifecycle::{LifecycleLayer, MiddlewareStack, RunRequestExt, Runtime};
use tower_agent::types::Role;
use tower_agent::{Agent, AgentTool, RunRequest, ScriptedModel, ScriptedTurn, ToolRouter};

/// A model that calls `lookup` once, then answers.
fn one_tool_model() -> ScriptedModel {
    ScriptedModel::from_fn(|request| {
        if request
            .messages
            .last()
            .is_some_and(|m| m.role == Role::Tool)
        {
            ScriptedTurn::text("done")
        } else {
            ScriptedTurn::tool_call("lookup", r#"{"id": "7"}"#)
        }
    })
}

fn agent() -> Agent {
    Agent::builder("a")
        .model(one_tool_model())
        .tools(lookup_tools())
        .build()
        .unwrap()
}

/// The hook sequence of a one-tool run for middleware registered in `names`
/// order.
fn onion(names: &[String]) -> Vec<String> {
    let fwd = |hook: &str| {
        names
            .iter()
            .map(|n| format!("{n}:{hook}"))
            .collect::<Vec<_>>()
    };
    let rev = |hook: &str| {
        names
            .iter()
            .rev()
            .map(|n| format!("{n}:{hook}"))
            .collect::<Vec<_>>()
    };
    let model_turn = || {
        [
            fwd("before_model"),
            fwd("wrap_model"),
            rev("wrap_model:end"),
            rev("after_model"),
        ]
        .concat()
    };
    [
        fwd("before_agent"),
        fwd("before_run"),
        model_turn(),
        fwd("before_tool"),
        fwd("wrap_tool"),
        rev("wrap_tool:end"),
        rev("after_tool"),
        rev("after_tool_batch"),
        model_turn(),
        fwd("before_stop"),
        rev("after_agent:completed"),
    ]
    .concat()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// For any registration order of N middleware, the observed sequence is
    /// the onion.
    #[test]
    fn any_registration_order_is_the_onion(
        order in (1usize..6).prop_flat_map(|n| Just((0..n).collect::<Vec<_>>()).prop_shuffle())
    ) {
        let names: Vec<String> = order.iter().map(|i| format!("m{i}")).collect();
        let log = Log::default();
        let stack = names.iter().fold(MiddlewareStack::new(), |stack, name| {
            stack.extend(Recorder::new(name, &log).stack())
        });
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let run = rt.block_on(run_with(agent(), stack, RunRequest::new("go"))).unwrap();
        prop_assert_eq!(run.output, "done");
        prop_assert_eq!(log.entries(), onion(&names));
    }
}

#[tokio::test]
async fn async_hooks_keep_the_onion() {
    let log = Log::default();
    let names = vec!["x".to_owned(), "y".to_owned()];
    let stack = Recorder::new("x", &log)
        .pending()
        .stack()
        .extend(Recorder::new("y", &log).pending().stack());
    run_with(agent(), stack, RunRequest::new("go"))
        .await
        .unwrap();
    assert_eq!(log.entries(), onion(&names));
}

/// runtime ▸ agent ▸ run ▸ built-ins, the first outermost.
#[tokio::test]
async fn placement_levels_nest_runtime_agent_run_builtins() {
    let log = Log::default();
    let runtime = Runtime::new(Recorder::new("runtime", &log).stack());
    let layer = runtime
        .layer(Recorder::new("agent", &log).stack())
        .builtins(Recorder::new("builtin", &log).stack());
    let service = layer.layer(agent());
    let request = RunRequest::new("go").with_middleware(Recorder::new("run", &log).stack());
    service.oneshot(request).await.unwrap();

    let entries = log.entries();
    let of = |hook: &str| -> Vec<&str> {
        entries
            .iter()
            .filter(|e| e.ends_with(&format!(":{hook}")))
            .map(|e| e.split(':').next().unwrap())
            .collect()
    };
    let levels = ["runtime", "agent", "run", "builtin"];
    // Two model turns: the order repeats.
    assert_eq!(of("before_model"), [levels, levels].concat());
    assert_eq!(of("wrap_tool"), levels);
    let reversed: Vec<&str> = levels.iter().rev().copied().collect();
    assert_eq!(of("after_tool"), reversed);
    assert_eq!(of("completed"), reversed, "after_agent runs in reverse too");
    assert_eq!(of("before_agent"), levels);
}

/// The run's middleware are passed per request: a second run without them
/// does not run them.
#[tokio::test]
async fn run_level_middleware_belong_to_one_run() {
    let log = Log::default();
    let service = LifecycleLayer::new(MiddlewareStack::new()).layer(agent());
    service
        .clone()
        .oneshot(RunRequest::new("go").with_middleware(Recorder::new("run", &log).stack()))
        .await
        .unwrap();
    let first = log.take().len();
    assert!(first > 10);
    service.oneshot(RunRequest::new("go")).await.unwrap();
    assert!(log.entries().is_empty());
}

/// Hooks fire inside a nested agent run; the inherited ones are outermost,
/// and the runtime's middleware run once per run, not once per level.
#[tokio::test]
async fn nested_runs_inherit_hooks_outermost() {
    let log = Log::default();
    let runtime = Runtime::new(Recorder::new("rt", &log).stack());
    let child = Agent::builder("child")
        .model(ScriptedModel::new([ScriptedTurn::text("child says hi")]))
        .build()
        .unwrap();
    let child = runtime
        .layer(Recorder::new("child-mw", &log).stack())
        .layer(child);
    let parent = Agent::builder("parent")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call("ask_child", r#"{"input": "hi"}"#),
            ScriptedTurn::text("parent done"),
        ]))
        .tools(ToolRouter::new().tool(AgentTool::new("ask_child", "Asks the child", child)))
        .build()
        .unwrap();
    let parent = runtime
        .layer(Recorder::new("parent-mw", &log).stack())
        .layer(parent);
    let run = parent.oneshot(RunRequest::new("go")).await.unwrap();
    assert_eq!(run.output, "parent done");

    let entries = log.entries();
    // The child run: between the parent's wrap_tool and its end.
    let start = entries
        .iter()
        .position(|e| e == "parent-mw:wrap_tool")
        .unwrap();
    let end = entries
        .iter()
        .position(|e| e == "parent-mw:wrap_tool:end")
        .unwrap();
    let child_run = &entries[start + 1..end];
    let of = |hook: &str| -> Vec<&str> {
        child_run
            .iter()
            .filter(|e| e.ends_with(&format!(":{hook}")))
            .map(|e| e.split(':').next().unwrap())
            .collect()
    };
    assert_eq!(of("before_agent"), ["rt", "parent-mw", "child-mw"]);
    assert_eq!(of("before_model"), ["rt", "parent-mw", "child-mw"]);
    assert_eq!(of("after_model"), ["child-mw", "parent-mw", "rt"]);
    assert_eq!(of("completed"), ["child-mw", "parent-mw", "rt"]);
    // The runtime's middleware ran once per run: two before_agent in all.
    assert_eq!(
        entries.iter().filter(|e| *e == "rt:before_agent").count(),
        2
    );
}

/// A nested run without a lifecycle layer of its own is bracketed by the
/// loop with the hooks it inherited: before_agent and after_agent once.
#[tokio::test]
async fn an_unlayered_nested_run_is_still_bracketed() {
    let log = Log::default();
    let child = Agent::builder("child")
        .model(ScriptedModel::new([ScriptedTurn::text("ok")]))
        .build()
        .unwrap();
    let parent = Agent::builder("parent")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call("child", r#"{"input": "x"}"#),
            ScriptedTurn::text("done"),
        ]))
        .tools(ToolRouter::new().tool(AgentTool::new("child", "c", child)))
        .build()
        .unwrap();
    run_with(
        parent,
        Recorder::new("p", &log).stack(),
        RunRequest::new("go"),
    )
    .await
    .unwrap();
    let entries = log.entries();
    assert_eq!(entries.iter().filter(|e| *e == "p:before_agent").count(), 2);
    assert_eq!(
        entries
            .iter()
            .filter(|e| *e == "p:after_agent:completed")
            .count(),
        2
    );
    // before_agent of the child comes before its input guard.
    let child_start = entries.iter().rposition(|e| e == "p:before_agent").unwrap();
    assert_eq!(entries[child_start + 1], "p:before_run");
}
