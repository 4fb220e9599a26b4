//! What the model did wrong, and what a tool did wrong, reach the model as
//! tool messages; the run goes on.

use schemars::JsonSchema;
use serde::Deserialize;
use tower_agent::types::{Role, ToolCall};
use tower_agent::{
    tool_fn, tool_sync, Agent, AgentError, BoxError, ScriptedModel, ScriptedTurn, ToolRouter,
};

#[derive(Deserialize, JsonSchema)]
struct Item {
    /// The item's id.
    id: u32,
}

fn tools() -> ToolRouter {
    ToolRouter::new()
        .tool(tool_sync("lookup", "Looks an item up", |item: Item| {
            Ok::<_, BoxError>(format!("item {}", item.id))
        }))
        .tool(tool_sync(
            "explode",
            "Panics",
            |_: Item| -> Result<String, BoxError> { panic!("kaboom") },
        ))
        .tool(tool_fn("fail", "Fails", |_: Item| async {
            Err::<String, _>(std::io::Error::other("disk full"))
        }))
        .tool(
            tool_sync(
                "explode_blocking",
                "Panics on a blocking thread",
                |_: Item| -> Result<String, BoxError> { panic!("kaboom on a thread") },
            )
            .blocking(),
        )
}

fn tool_results(run: &tower_agent::AgentRun) -> Vec<String> {
    run.messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.text().into_owned())
        .collect()
}

#[tokio::test]
async fn every_mistake_reaches_the_model_and_the_run_completes() {
    let model = ScriptedModel::new([
        ScriptedTurn::tool_calls([
            ToolCall::new("1", "lookup", r#"{"id": 7}"#),
            ToolCall::new("2", "lookup", r#"{"id": "seven"}"#),
            ToolCall::new("3", "lookup", r#"{"id": 7"#),
            ToolCall::new("4", "teleport", r#"{}"#),
            ToolCall::new("5", "explode", r#"{"id": 1}"#),
            ToolCall::new("6", "fail", r#"{"id": 1}"#),
            ToolCall::new("7", "explode_blocking", r#"{"id": 1}"#),
            ToolCall::new("8", "lookup", r#"{}"#),
        ]),
        ScriptedTurn::text("sorted"),
    ]);
    let agent = Agent::builder("a")
        .model(model.clone())
        .tools(tools())
        .build()
        .unwrap();
    let run = agent.run("go").await.unwrap();
    assert_eq!(run.output, "sorted");
    let results = tool_results(&run);
    assert_eq!(results[0], "item 7");
    assert!(
        results[1].contains("do not match its schema") && results[1].contains("\"seven\""),
        "{}",
        results[1]
    );
    assert!(results[2].contains("not valid JSON"), "{}", results[2]);
    assert!(
        results[3].contains("unknown tool `teleport`") && results[3].contains("lookup"),
        "{}",
        results[3]
    );
    // A panic reads as a failure of the named tool; its message stays out
    // of the conversation (`show_tool_panics` lets it in).
    assert!(
        results[4].contains("The tool `explode` failed") && !results[4].contains("kaboom"),
        "{}",
        results[4]
    );
    assert!(results[5].contains("disk full"), "{}", results[5]);
    assert!(
        results[6].contains("The tool `explode_blocking` failed") && !results[6].contains("kaboom"),
        "{}",
        results[6]
    );
    assert!(
        results[7].contains("\"id\" is a required property"),
        "{}",
        results[7]
    );
    // The model read them all in its next turn.
    let seen = model.requests()[1]
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .count();
    assert_eq!(seen, 8);
}

#[tokio::test]
async fn a_tripwire_from_a_tool_ends_the_run() {
    let tools = ToolRouter::new().tool(tool_sync(
        "guard",
        "Guards",
        |_: Item| -> Result<String, BoxError> {
            Err(tower_agent::tripwire_with(
                "refunds go to a person",
                serde_json::json!({"queue": "billing"}),
            )
            .into())
        },
    ));
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("guard", r#"{"id": 1}"#),
        ScriptedTurn::text("unreached"),
    ]);
    let agent = Agent::builder("a")
        .model(model)
        .tools(tools)
        .build()
        .unwrap();
    let err = agent.run("refund me").await.unwrap_err();
    assert_eq!(err.code(), "GUARDRAIL_TRIPPED");
    let AgentError::Tripwire { reason, info, .. } = err else {
        panic!()
    };
    assert_eq!(reason, "refunds go to a person");
    assert_eq!(info.unwrap()["queue"], "billing");
}

#[tokio::test]
async fn unknown_agent_configuration_is_a_typed_error() {
    let err = Agent::builder("no-model").build().unwrap_err();
    assert_eq!(err.code(), "INVALID_CONFIG");
    let err = Agent::builder("bad-schema")
        .model(ScriptedModel::new([]))
        .response_schema(serde_json::json!({"type": 12}))
        .build()
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_CONFIG");
}

#[tokio::test]
async fn sync_tools_run_inline_on_the_runs_task() {
    // A current-thread runtime with no blocking pool use: the inline tool
    // sees the same thread as the test.
    let main_thread = std::thread::current().id();
    let tools = ToolRouter::new().tool(tool_sync("where", "Which thread", move |_: Item| {
        Ok::<_, BoxError>(std::thread::current().id() == main_thread)
    }));
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("where", r#"{"id": 1}"#),
        ScriptedTurn::text("ok"),
    ]);
    let run = Agent::builder("a")
        .model(model)
        .tools(tools)
        .build()
        .unwrap()
        .run("?")
        .await
        .unwrap();
    assert_eq!(tool_results(&run), ["true"]);
}
