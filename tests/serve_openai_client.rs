//! The official `openai` Python client (PyPI) against `/v1/chat/completions`,
//! streamed and not. Run by `scripts/peers/run-edge-tests.sh`, which installs
//! the client into a venv and sets `TOWER_AGENT_PYTHON`.
#![cfg(feature = "server")]

use std::time::Duration;

use tower_agent::serve::AgentServer;
use tower_agent::types::Role;
use tower_agent::{tool_sync, Agent, BoxError, ScriptedModel, ScriptedTurn, ToolRouter};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Sum {
    a: i64,
    b: i64,
}

#[tokio::test]
#[ignore = "needs the openai Python client; run by scripts/peers/run-edge-tests.sh"]
async fn the_official_openai_client_talks_to_an_agent() {
    let python = std::env::var("TOWER_AGENT_PYTHON").expect(
        "TOWER_AGENT_PYTHON is not set: scripts/peers/run-edge-tests.sh installs the client",
    );
    let agent = Agent::builder("calc")
        .model(ScriptedModel::from_fn(|req| {
            if req.messages.iter().any(|m| m.role == Role::Tool) {
                ScriptedTurn::text("2 + 3 = 5").chunk_chars(2)
            } else {
                ScriptedTurn::tool_call("add", r#"{"a": 2, "b": 3}"#)
            }
        }))
        .tools(ToolRouter::new().tool(tool_sync("add", "Adds", |s: Sum| {
            Ok::<_, BoxError>(s.a + s.b)
        })))
        .build()
        .unwrap();
    let server = AgentServer::new().agent("calc", agent);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = server.router();
    let serving = tokio::spawn(async move { axum::serve(listener, app).await });

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/openai_chat.py");
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(python)
            .arg(script)
            .arg(format!("http://{addr}/v1"))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the Python client took longer than 60 s")
    .unwrap();
    serving.abort();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the client failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("streamed"), "{stdout}");
}
