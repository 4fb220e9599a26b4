//! Agents as tools: child contexts and usage rolled up exactly once.

use tower::ServiceExt;
use tower_agent::types::Usage;
use tower_agent::{
    Agent, AgentTool, RunContext, RunRequest, ScriptedModel, ScriptedTurn, ToolRouter,
};

fn leaf(name: &str, usage: Usage) -> Agent {
    Agent::builder(name.to_owned())
        .model(ScriptedModel::new([ScriptedTurn::text(format!(
            "{name} says hi"
        ))
        .usage(usage)]))
        .build()
        .unwrap()
}

#[tokio::test]
async fn nested_usage_rolls_up_exactly_once() {
    // root → middle → leaf, each level with its own usage.
    let middle = Agent::builder("middle")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call("leaf", r#"{"input": "hi"}"#).usage(Usage::new(100, 10)),
            ScriptedTurn::text("middle done").usage(Usage::new(200, 20)),
        ]))
        .tools(ToolRouter::new().tool(AgentTool::new(
            "leaf",
            "The leaf",
            leaf("leaf", Usage::new(1000, 100)),
        )))
        .build()
        .unwrap();
    let root = Agent::builder("root")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call("middle", r#"{"input": "go"}"#).usage(Usage::new(1, 1)),
            ScriptedTurn::text("root done").usage(Usage::new(2, 2)),
        ]))
        .tools(ToolRouter::new().tool(AgentTool::new("middle", "The middle", middle)))
        .build()
        .unwrap();

    let ctx = RunContext::new();
    let run = root
        .oneshot(RunRequest::new("start").context(ctx.clone()))
        .await
        .unwrap();
    assert_eq!(run.output, "root done");
    assert_eq!(run.usage, Usage::new(3, 3));
    assert_eq!(run.usage_total, Usage::new(1303, 133));
    assert_eq!(ctx.total_usage(), run.usage_total);
    // One ledger entry per model call of the tree, each tagged with its agent.
    let entries = ctx.usage_entries();
    let agents: Vec<_> = entries
        .iter()
        .map(|e| e.agent.as_deref().unwrap().to_owned())
        .collect();
    assert_eq!(agents, ["root", "middle", "leaf", "middle", "root"]);
    let summed: Usage = entries.iter().map(|e| e.usage).sum();
    assert_eq!(summed, run.usage_total);
    // The nested answer reached the parent model as a tool result.
    assert!(run.messages.iter().any(|m| m.text() == "middle done"));
}

#[tokio::test]
async fn the_child_context_points_at_its_parent() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let child_model = ScriptedModel::new([ScriptedTurn::text("ok")]);
    let spy = tower::service_fn(move |call: tower_agent::ModelCall| {
        record.lock().unwrap().push((
            call.context.parent_run_id().cloned(),
            call.context.agent_name(),
        ));
        child_model.clone().oneshot(call)
    });
    let child = Agent::builder("child").model(spy).build().unwrap();
    let parent = Agent::builder("parent")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call("child", r#"{"input": "x"}"#),
            ScriptedTurn::text("done"),
        ]))
        .tools(ToolRouter::new().tool(AgentTool::new("child", "A child", child)))
        .build()
        .unwrap();
    let ctx = RunContext::new();
    parent
        .oneshot(RunRequest::new("go").context(ctx.clone()))
        .await
        .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0.as_ref(), Some(ctx.run_id()));
    assert_eq!(seen[0].1.as_deref(), Some("child"));
}

#[tokio::test]
async fn an_agent_tool_without_input_tells_the_model_how_to_call_it() {
    let parent = Agent::builder("parent")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call("child", r#"{"input": 3}"#),
            ScriptedTurn::text("done"),
        ]))
        .tools(ToolRouter::new().tool(AgentTool::new(
            "child",
            "A child",
            leaf("child", Usage::new(1, 1)),
        )))
        .build()
        .unwrap();
    let run = parent.run("go").await.unwrap();
    let tool = run
        .messages
        .iter()
        .find(|m| m.role == tower_agent::types::Role::Tool)
        .unwrap();
    assert!(
        tool.text().contains("is not of type \"string\""),
        "{}",
        tool.text()
    );
    assert_eq!(run.usage_total, run.usage);
}
