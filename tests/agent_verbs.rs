//! A layered agent keeps `run` and `run_with`; the builder adds tools one
//! at a time.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use tower_agent::prelude::*;

#[derive(Deserialize, JsonSchema)]
struct Nothing {}

fn named(name: &'static str, answer: &'static str) -> tower_agent::FnTool {
    tool_sync(name, "Answers", move |_: Nothing| Ok::<_, BoxError>(answer))
}

#[tokio::test]
async fn a_lifecycle_agent_runs_with_the_agents_verbs() {
    let model = ScriptedModel::new([ScriptedTurn::text("one"), ScriptedTurn::text("two")]);
    let agent = Agent::builder("a").model(model).build().unwrap();
    let agent = LifecycleLayer::new(MiddlewareStack::new()).layer(agent);
    assert_eq!(agent.run("hi").await.unwrap().output, "one");
    let ctx = RunContext::builder().thread_id("t-1").build();
    let run = agent
        .run_with(RunRequest::new("again").context(ctx.clone()))
        .await
        .unwrap();
    assert_eq!(run.output, "two");
    assert_eq!(ctx.run_id(), &run.run_id);
}

#[tokio::test(start_paused = true)]
async fn an_agent_in_towers_layers_runs_and_its_errors_are_classified() {
    let model = ScriptedModel::new([ScriptedTurn::text("late").delay(Duration::from_secs(5))]);
    let agent = Agent::builder("a").model(model).build().unwrap();
    let agent = ServiceBuilder::new()
        .concurrency_limit(4)
        .timeout(Duration::from_secs(1))
        .service(agent);
    let err = agent.run("hi").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
}

#[tokio::test]
async fn tools_are_added_one_at_a_time_beside_a_router() {
    let model = ScriptedModel::new([
        ScriptedTurn::tool_calls([
            ToolCall::new("1", "first", "{}"),
            ToolCall::new("2", "second", "{}"),
            ToolCall::new("3", "third", "{}"),
        ]),
        ScriptedTurn::text("done"),
    ]);
    let agent = Agent::builder("a")
        .model(model)
        .tools(ToolRouter::new().tool(named("first", "1")))
        .tool(named("second", "old"))
        .tool(named("second", "2"))
        .tool(named("third", "3"))
        .build()
        .unwrap();
    let names: Vec<&str> = agent.tool_specs().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["first", "second", "third"]);
    let run = agent.run("go").await.unwrap();
    let results: Vec<String> = run
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.text().into_owned())
        .collect();
    assert_eq!(results, ["1", "2", "3"]);
}
