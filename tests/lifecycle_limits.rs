//! Call limits in full agent runs: a model-call limit ends the run with
//! `LIMIT_EXCEEDED` or stops it, an exhausted tool is answered and the
//! model finishes, and a nested run counts toward the root's limit.

use tower::{ServiceBuilder, ServiceExt};
use tower_agent::lifecycle::builtin::limits::{
    ModelCallLimitMiddleware, ModelLimitAction, ToolCallLimitMiddleware, ToolLimitAction,
};
use tower_agent::lifecycle::{Lifecycle, LifecycleLayer, MiddlewareStack};
use tower_agent::types::{ModelRequest, Role, RunStatus};
use tower_agent::{
    tool_sync, Agent, AgentError, AgentTool, BoxError, RunContext, RunRequest, ScriptedModel,
    ScriptedTurn, ToolRouter,
};

/// Calls `search` until it reads an "exhausted" answer, then finishes.
fn searcher() -> ScriptedModel {
    ScriptedModel::from_fn(|request: &ModelRequest| {
        let last = request.messages.last().unwrap();
        if last.role == Role::Tool && last.text().contains("exhausted") {
            ScriptedTurn::text("done without more searching")
        } else {
            ScriptedTurn::tool_call("search", r#"{"q": "more"}"#)
        }
    })
}

fn search_tools() -> ToolRouter {
    ToolRouter::new().tool(tool_sync("search", "Searches", |_: serde_json::Value| {
        Ok::<_, BoxError>("a result")
    }))
}

fn agent(model: ScriptedModel, stack: MiddlewareStack) -> Lifecycle<Agent> {
    let agent = Agent::builder("a")
        .model(model)
        .tools(search_tools())
        .max_turns(50)
        .build()
        .unwrap();
    ServiceBuilder::new()
        .layer(LifecycleLayer::new(stack))
        .service(agent)
}

#[tokio::test]
async fn a_model_call_limit_ends_the_run_with_limit_exceeded() {
    let model = searcher();
    let stack = MiddlewareStack::new().push(ModelCallLimitMiddleware::new().run_limit(3));
    let err = agent(model.clone(), stack)
        .oneshot(RunRequest::new("search forever"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "LIMIT_EXCEEDED");
    assert!(
        matches!(&err, AgentError::LimitExceeded(e) if e.max == 3 && e.limit == "model calls per run")
    );
    assert_eq!(model.requests().len(), 3);
}

#[tokio::test]
async fn a_model_call_limit_can_stop_the_run_instead() {
    let model = searcher();
    let stack = MiddlewareStack::new().push(
        ModelCallLimitMiddleware::new()
            .run_limit(2)
            .on_limit(ModelLimitAction::Stop),
    );
    let run = agent(model.clone(), stack)
        .oneshot(RunRequest::new("search forever"))
        .await
        .unwrap();
    let RunStatus::Stopped(stop) = &run.status else {
        panic!("expected a stopped run, got {:?}", run.status)
    };
    assert_eq!(stop.by.as_deref(), Some("model-call-limit"));
    assert_eq!(model.requests().len(), 2);
}

#[tokio::test]
async fn an_exhausted_tool_is_answered_and_the_model_finishes() {
    let model = searcher();
    let stack = MiddlewareStack::new().push(ToolCallLimitMiddleware::tool("search").run_limit(2));
    let run = agent(model.clone(), stack)
        .oneshot(RunRequest::new("search"))
        .await
        .unwrap();
    assert_eq!(run.output, "done without more searching");
    assert_eq!(run.counters.tool_calls, 2, "the third call did not run");
}

#[tokio::test]
async fn a_tool_limit_over_a_thread_spans_runs_and_can_end_the_run() {
    let limit = ToolCallLimitMiddleware::all()
        .thread_limit(3)
        .on_limit(ToolLimitAction::Error);
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("search", "{}"),
        ScriptedTurn::tool_call("search", "{}"),
        ScriptedTurn::text("first done"),
        ScriptedTurn::tool_call("search", "{}"),
        ScriptedTurn::tool_call("search", "{}"),
    ]);
    let svc = agent(model, MiddlewareStack::new().push(limit));
    let in_thread =
        || RunRequest::new("go").context(RunContext::builder().thread_id("t-1").build());
    assert_eq!(
        svc.clone().oneshot(in_thread()).await.unwrap().output,
        "first done"
    );
    let err = svc.oneshot(in_thread()).await.unwrap_err();
    assert!(
        matches!(&err, AgentError::LimitExceeded(e) if e.limit == "tool calls per thread" && e.max == 3)
    );
}

fn parent() -> Agent {
    let child = Agent::builder("child")
        .model(ScriptedModel::new([ScriptedTurn::text("child done")]))
        .build()
        .unwrap();
    Agent::builder("parent")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call("child", r#"{"input": "go"}"#),
            ScriptedTurn::text("parent done"),
        ]))
        .tools(ToolRouter::new().tool(AgentTool::new("child", "A child", child)))
        .build()
        .unwrap()
}

async fn run_with(mw: ModelCallLimitMiddleware) -> Result<tower_agent::AgentRun, AgentError> {
    ServiceBuilder::new()
        .layer(LifecycleLayer::new(MiddlewareStack::new().push(mw)))
        .service(parent())
        .oneshot(RunRequest::new("go"))
        .await
}

#[tokio::test]
async fn a_nested_run_counts_toward_its_own_limit_and_optionally_the_roots() {
    // On their own, the parent makes 2 calls and the child 1: within 2 each.
    let run = run_with(ModelCallLimitMiddleware::new().run_limit(2))
        .await
        .unwrap();
    assert_eq!(run.output, "parent done");
    // Counted in the root too, the parent's second call is the root's third.
    let err = run_with(
        ModelCallLimitMiddleware::new()
            .run_limit(2)
            .count_in_root(true),
    )
    .await
    .unwrap_err();
    assert!(matches!(&err, AgentError::LimitExceeded(e) if e.limit == "model calls per run"));
    // A limit of 1 stops the child's call inside the nested run, and the
    // nested tripwire ends the parent run too.
    let err = run_with(
        ModelCallLimitMiddleware::new()
            .run_limit(1)
            .count_in_root(true),
    )
    .await
    .unwrap_err();
    assert!(matches!(&err, AgentError::LimitExceeded(e) if e.limit == "model calls per root run"));
}
