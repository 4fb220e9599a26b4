//! What a tool call may send and what its result may write into the
//! conversation, and what the model reads of a tool's panic.

use schemars::JsonSchema;
use serde::Deserialize;
use tower::ServiceExt;
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::types::{Role, ToolCall};
use tower_agent::{
    tool_sync, Agent, AgentBuilder, AgentRun, BoxError, RunContext, RunRequest, ScriptedModel,
    ScriptedTurn, ToolRouter,
};

#[derive(Deserialize, JsonSchema)]
struct Text {
    text: String,
}

#[derive(Deserialize, JsonSchema)]
struct Size {
    bytes: usize,
}

fn tools() -> ToolRouter {
    ToolRouter::new()
        .tool(tool_sync("echo", "Echoes", |t: Text| {
            Ok::<_, BoxError>(format!("{} bytes", t.text.len()))
        }))
        .tool(tool_sync("produce", "Writes `bytes` bytes", |s: Size| {
            Ok::<_, BoxError>("x".repeat(s.bytes))
        }))
        .tool(tool_sync(
            "explode",
            "Panics",
            |_: Size| -> Result<String, BoxError> { panic!("secret at /srv/app.rs:12") },
        ))
        .tool(
            tool_sync(
                "explode_blocking",
                "Panics on a blocking thread",
                |_: Size| -> Result<String, BoxError> { panic!("secret on a thread") },
            )
            .blocking(),
        )
}

fn agent(calls: Vec<ToolCall>) -> AgentBuilder {
    Agent::builder("limits")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_calls(calls),
            ScriptedTurn::text("done"),
        ]))
        .tools(tools())
}

fn tool_results(run: &AgentRun) -> Vec<String> {
    run.messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.text().into_owned())
        .collect()
}

fn echo(len: usize) -> String {
    serde_json::json!({ "text": "a".repeat(len) }).to_string()
}

#[tokio::test]
async fn arguments_past_one_mebibyte_are_refused_by_default() {
    // 11 bytes of JSON around the text.
    let fits = echo(1024 * 1024 - 11);
    let too_long = echo(1024 * 1024 - 10);
    assert_eq!(fits.len(), 1024 * 1024);
    let run = agent(vec![
        ToolCall::new("fits", "echo", fits),
        ToolCall::new("long", "echo", too_long),
    ])
    .build()
    .unwrap()
    .run("go")
    .await
    .unwrap();
    let results = tool_results(&run);
    assert_eq!(results[0], format!("{} bytes", 1024 * 1024 - 11));
    assert!(
        results[1].contains("1048577 bytes, more than the 1048576 bytes"),
        "{}",
        results[1]
    );
    assert_eq!(run.counters.tool_calls, 1, "the long call was not made");
}

#[tokio::test]
async fn the_argument_cap_is_configurable_and_the_refusal_is_logged() {
    let sink = CollectingSink::new();
    let agent = agent(vec![ToolCall::new("c", "echo", echo(100))])
        .max_tool_argument_bytes(64)
        .build()
        .unwrap();
    let ctx = RunContext::builder().events(sink.clone()).build();
    let run = agent
        .oneshot(RunRequest::new("go").context(ctx))
        .await
        .unwrap();
    let results = tool_results(&run);
    assert!(
        results[0].contains("are 111 bytes, more than the 64 bytes"),
        "{}",
        results[0]
    );
    assert!(sink.events().iter().any(|e| matches!(
        e,
        AgentEvent::ToolDecision { call_id, decision: "deny", decided_by, .. }
            if call_id == "c" && decided_by == "agent"
    )));
}

#[tokio::test]
async fn a_result_past_256_kib_is_cut_with_a_note() {
    let limit = 256 * 1024;
    let run = agent(vec![
        ToolCall::new("fits", "produce", format!(r#"{{"bytes": {limit}}}"#)),
        ToolCall::new(
            "long",
            "produce",
            format!(r#"{{"bytes": {}}}"#, limit + 1000),
        ),
    ])
    .build()
    .unwrap()
    .run("go")
    .await
    .unwrap();
    let results = tool_results(&run);
    assert_eq!(results[0].len(), limit);
    let (kept, note) = results[1].split_at(limit);
    assert!(kept.bytes().all(|b| b == b'x'));
    assert_eq!(
        note,
        "\n[The result was cut: 1000 of its 263144 bytes are left out, past the limit of \
         262144 bytes.]"
    );
}

#[tokio::test]
async fn the_result_cap_is_configurable() {
    let run = agent(vec![ToolCall::new("c", "produce", r#"{"bytes": 50}"#)])
        .max_tool_result_bytes(10)
        .build()
        .unwrap()
        .run("go")
        .await
        .unwrap();
    let results = tool_results(&run);
    assert!(results[0].starts_with("xxxxxxxxxx\n[The result was cut: 40 of its 50 bytes"));
}

#[tokio::test]
async fn zero_caps_are_a_configuration_error() {
    for agent in [
        agent(vec![]).max_tool_argument_bytes(0),
        agent(vec![]).max_tool_result_bytes(0),
    ] {
        assert_eq!(agent.build().unwrap_err().code(), "INVALID_CONFIG");
    }
}

#[tokio::test]
async fn a_panic_reaches_the_event_and_not_the_model() {
    let sink = CollectingSink::new();
    let agent = agent(vec![
        ToolCall::new("1", "explode", r#"{"bytes": 0}"#),
        ToolCall::new("2", "explode_blocking", r#"{"bytes": 0}"#),
    ])
    .build()
    .unwrap();
    let ctx = RunContext::builder().events(sink.clone()).build();
    let run = agent
        .oneshot(RunRequest::new("go").context(ctx))
        .await
        .unwrap();
    assert_eq!(
        tool_results(&run),
        [
            "The tool `explode` failed unexpectedly and returned no result.",
            "The tool `explode_blocking` failed unexpectedly and returned no result."
        ]
    );
    let panics: Vec<(String, Option<String>)> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::ToolCallCompleted { call_id, panic, .. } => Some((call_id, panic)),
            _ => None,
        })
        .collect();
    assert_eq!(
        panics,
        [
            ("1".to_owned(), Some("secret at /srv/app.rs:12".to_owned())),
            ("2".to_owned(), Some("secret on a thread".to_owned()))
        ]
    );
}

#[tokio::test]
async fn the_model_reads_the_panic_when_told_to() {
    let run = agent(vec![
        ToolCall::new("1", "explode", r#"{"bytes": 0}"#),
        ToolCall::new("2", "explode_blocking", r#"{"bytes": 0}"#),
    ])
    .show_tool_panics(true)
    .build()
    .unwrap()
    .run("go")
    .await
    .unwrap();
    assert_eq!(
        tool_results(&run),
        [
            "The tool `explode` panicked: secret at /srv/app.rs:12",
            "The tool `explode_blocking` panicked: secret on a thread"
        ]
    );
}
