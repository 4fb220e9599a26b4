//! The run viewer in a real browser: headless Chromium drives the page
//! against a server on ScriptedModel, checks the timeline's rows and an
//! approval round trip, and saves screenshots under `target/artifacts/`.
//! Run by `scripts/peers/run-edge-tests.sh` (it installs Chromium and
//! playwright-core).
#![cfg(feature = "server")]

use std::time::Duration;

use tower::Layer;
use tower_agent::hooks::{ToolDecision, ToolVerdict};
use tower_agent::lifecycle::{Hook, LifecycleLayer, Middleware, MiddlewareStack};
use tower_agent::serve::AgentServer;
use tower_agent::types::{Role, ToolCall};
use tower_agent::{
    tool_sync, Agent, BoxError, RunContext, ScriptedModel, ScriptedTurn, ToolRouter,
};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Sum {
    a: i64,
    b: i64,
}

/// Defers the first call of `pay`: a person decides in the page.
struct DeferPay;

impl Middleware for DeferPay {
    fn name(&self) -> &str {
        "approvals"
    }

    fn before_tool<'a>(
        &'a self,
        _: &'a RunContext,
        call: &'a ToolCall,
        resumed: bool,
    ) -> Hook<'a, ToolVerdict> {
        if call.name == "pay" && !resumed {
            Hook::ok(ToolVerdict::decision(ToolDecision::Defer))
        } else {
            Hook::ok(ToolVerdict::proceed())
        }
    }
}

fn tools() -> ToolRouter {
    ToolRouter::new()
        .tool(tool_sync("add", "Adds", |s: Sum| {
            Ok::<_, BoxError>(s.a + s.b)
        }))
        .tool(tool_sync("pay", "Pays", |s: Sum| {
            Ok::<_, BoxError>(format!("paid {}", s.a))
        }))
}

#[tokio::test]
#[ignore = "needs Chromium and playwright-core; run by scripts/peers/run-edge-tests.sh"]
async fn the_viewer_shows_a_run_live_and_resumes_an_approval() {
    let playwright = std::env::var("TOWER_AGENT_PLAYWRIGHT")
        .expect("TOWER_AGENT_PLAYWRIGHT is not set: scripts/peers/run-edge-tests.sh installs it");
    let calc = LifecycleLayer::new(MiddlewareStack::new().push(DeferPay)).layer(
        Agent::builder("calc")
            .model(ScriptedModel::from_fn(|req| {
                if req.messages.iter().any(|m| m.role == Role::Tool) {
                    ScriptedTurn::text("2 + 3 = 5").chunk_chars(3)
                } else {
                    ScriptedTurn::tool_call("add", r#"{"a": 2, "b": 3}"#)
                }
            }))
            .tools(tools())
            .build()
            .unwrap(),
    );
    let payer = LifecycleLayer::new(MiddlewareStack::new().push(DeferPay)).layer(
        Agent::builder("payer")
            .model(ScriptedModel::from_fn(|req| {
                match req.messages.last().map(|m| m.text().into_owned()) {
                    Some(t) if t.starts_with("paid") => ScriptedTurn::text("payment sent"),
                    _ => ScriptedTurn::tool_call("pay", r#"{"a": 30, "b": 0}"#),
                }
            }))
            .tools(tools())
            .build()
            .unwrap(),
    );
    let server = AgentServer::new().agent("calc", calc).agent("payer", payer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = server.router();
    let serving = tokio::spawn(async move { axum::serve(listener, app).await });

    let artifacts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let screenshot = artifacts.join("run-viewer.png");
    let _ = std::fs::remove_file(&screenshot);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/viewer_browser.cjs"
    );
    let output = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new("node")
            .arg(script)
            .arg(format!("http://{addr}"))
            .arg(&screenshot)
            .env("TOWER_AGENT_PLAYWRIGHT", playwright)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the browser took longer than 90 s")
    .unwrap();
    serving.abort();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the browser check failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("\"ok\":true"), "{stdout}");
    let png = std::fs::read(&screenshot).expect("the screenshot was saved");
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
}
