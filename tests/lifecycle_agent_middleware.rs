//! An agent's own middleware (`AgentBuilder::middleware`), and what a
//! middleware error inside a nested agent run does to the run around it.

use std::sync::{Arc, Mutex};

use tower::{Layer, ServiceExt};
use tower_agent::lifecycle::{Hook, LifecycleLayer, Middleware, MiddlewareStack};
use tower_agent::types::{History, Role};
use tower_agent::{
    Agent, AgentTool, BoxError, RunContext, RunRequest, ScriptedModel, ScriptedTurn, ToolRouter,
};

/// Records `agent:hook` for every `before_model` and `after_agent`.
#[derive(Clone, Default)]
struct Trace(Arc<Mutex<Vec<String>>>);

impl Trace {
    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

impl Middleware for Trace {
    fn name(&self) -> &str {
        "trace"
    }

    fn before_model<'a>(&'a self, ctx: &'a RunContext, _: &'a mut History) -> Hook<'a, ()> {
        let agent = ctx.agent_name().map(|a| a.to_string()).unwrap_or_default();
        self.0.lock().unwrap().push(format!("{agent}:before_model"));
        Hook::ok(())
    }

    fn after_agent<'a>(
        &'a self,
        ctx: &'a RunContext,
        outcome: tower_agent::hooks::RunOutcome<'a>,
    ) -> Hook<'a, ()> {
        let agent = ctx.agent_name().map(|a| a.to_string()).unwrap_or_default();
        self.0
            .lock()
            .unwrap()
            .push(format!("{agent}:after_agent {}", outcome.status()));
        Hook::ok(())
    }
}

/// Fails `before_model` with a plain error in runs of agent `target`.
struct FailIn {
    target: &'static str,
}

impl Middleware for FailIn {
    fn name(&self) -> &str {
        "fail-in"
    }

    fn before_model<'a>(&'a self, ctx: &'a RunContext, _: &'a mut History) -> Hook<'a, ()> {
        if ctx.agent_name().is_some_and(|a| &*a == self.target) {
            return Hook::err("the store is down");
        }
        Hook::ok(())
    }
}

fn child(middleware: Option<MiddlewareStack>) -> Agent {
    let builder =
        Agent::builder("child").model(ScriptedModel::new([ScriptedTurn::text("from the child")]));
    match middleware {
        Some(stack) => builder.middleware(stack),
        None => builder,
    }
    .build()
    .unwrap()
}

fn parent_model() -> ScriptedModel {
    ScriptedModel::new([
        ScriptedTurn::tool_call("ask_child", r#"{"input": "help"}"#),
        ScriptedTurn::text("parent done"),
    ])
}

fn parent(model: ScriptedModel, child: Agent) -> tower_agent::AgentBuilder {
    Agent::builder("parent")
        .model(model)
        .tools(ToolRouter::new().tool(AgentTool::new("ask_child", "Asks the child", child)))
}

#[tokio::test]
async fn an_agent_with_middleware_keeps_run_and_brackets_nested_runs() {
    let trace = Trace::default();
    let agent = parent(parent_model(), child(None))
        .middleware(trace.clone())
        .build()
        .unwrap();
    let run = agent.run("go").await.unwrap();
    assert_eq!(run.output, "parent done");
    let seen = trace.all();
    // The parent's hooks see the nested run too, and close each run once.
    assert_eq!(
        seen,
        [
            "parent:before_model",
            "child:before_model",
            "child:after_agent completed",
            "parent:before_model",
            "parent:after_agent completed",
        ]
    );
}

#[tokio::test]
async fn several_middleware_calls_append_in_order() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let (a, b) = (order.clone(), order.clone());
    let agent = Agent::builder("a")
        .model(ScriptedModel::new([ScriptedTurn::text("ok")]))
        .middleware(MiddlewareStack::new().before_model("first", move |_, _| {
            a.lock().unwrap().push("first");
            Ok::<_, BoxError>(())
        }))
        .middleware(MiddlewareStack::new().before_model("second", move |_, _| {
            b.lock().unwrap().push("second");
            Ok::<_, BoxError>(())
        }))
        .build()
        .unwrap();
    agent.run("go").await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["first", "second"]);
}

#[tokio::test]
async fn a_nested_runs_own_middleware_error_is_a_failed_tool_call() {
    let model = parent_model();
    let agent = parent(
        model.clone(),
        child(Some(
            MiddlewareStack::new().push(FailIn { target: "child" }),
        )),
    )
    .build()
    .unwrap();
    // The parent run goes on: its model reads the failed call.
    let run = agent.run("go").await.unwrap();
    assert_eq!(run.output, "parent done");
    let tool_message = model.requests()[1]
        .messages
        .iter()
        .find(|m| m.role == Role::Tool)
        .map(|m| m.text().into_owned())
        .unwrap();
    assert!(tool_message.contains("the store is down"), "{tool_message}");
    assert!(tool_message.contains("failed"), "{tool_message}");
}

#[tokio::test]
async fn a_parent_hook_failing_inside_the_nested_run_fails_the_parent() {
    let agent = parent(parent_model(), child(None)).build().unwrap();
    let layered =
        LifecycleLayer::new(MiddlewareStack::new().push(FailIn { target: "child" })).layer(agent);
    let err = layered.oneshot(RunRequest::new("go")).await.unwrap_err();
    assert_eq!(err.code(), "MIDDLEWARE_FAILED");
    assert!(
        matches!(&err, tower_agent::AgentError::Middleware { middleware, hook, .. }
            if middleware == "fail-in" && hook == "before_model"),
        "{err}"
    );
}

#[tokio::test]
async fn a_nested_runs_own_middleware_failing_still_fails_that_run() {
    let err = child(Some(
        MiddlewareStack::new().push(FailIn { target: "child" }),
    ))
    .run("alone")
    .await
    .unwrap_err();
    assert_eq!(err.code(), "MIDDLEWARE_FAILED");
}
