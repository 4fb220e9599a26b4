//! MCP tools in full agent runs against real servers from npm:
//! `@modelcontextprotocol/server-everything` over stdio and streamable HTTP,
//! `@modelcontextprotocol/server-filesystem` on a temp directory.
//! Run by `scripts/peers/run-edge-tests.sh`, which installs and starts them.
#![cfg(feature = "mcp")]

use std::path::PathBuf;
use std::time::Duration;

use tower::ServiceExt;
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::mcp::{McpServer, McpTools};
use tower_agent::types::{ApprovalDecision, Role};
use tower_agent::{Agent, AgentRun, RunContext, RunRequest, ScriptedModel, ScriptedTurn};

fn npm_bin(package: &str) -> String {
    let var = format!(
        "TOWER_AGENT_MCP_{}",
        package.rsplit('-').next().unwrap().to_uppercase()
    );
    let path = std::env::var(&var).map(PathBuf::from).unwrap_or_else(|_| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(".peers/npm/node_modules/@modelcontextprotocol")
            .join(package)
            .join("dist/index.js")
    });
    assert!(
        path.exists(),
        "{} is missing: install it with scripts/peers/run-edge-tests.sh",
        path.display()
    );
    path.display().to_string()
}

fn everything_stdio() -> McpServer {
    McpServer::stdio(
        "everything",
        "node",
        [npm_bin("server-everything"), "stdio".into()],
    )
}

fn everything_url() -> String {
    std::env::var("TOWER_AGENT_MCP_EVERYTHING_URL")
        .expect("TOWER_AGENT_MCP_EVERYTHING_URL is not set: scripts/peers/run-edge-tests.sh starts the server")
}

/// The tool messages of a run, in order.
fn tool_messages(run: &AgentRun) -> Vec<String> {
    run.messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.text().into_owned())
        .collect()
}

async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("the MCP test took longer than 60 s")
}

#[tokio::test]
#[ignore = "needs the npm MCP servers; run by scripts/peers/run-edge-tests.sh"]
async fn stdio_server_tools_run_in_a_full_agent_run() {
    within(async {
        let mcp = McpTools::connect(everything_stdio().deny(["trigger-*", "toggle-*"]))
            .await
            .unwrap();
        let names: Vec<String> = mcp.specs().into_iter().map(|s| s.name).collect();
        assert!(names.contains(&"everything__echo".to_owned()), "{names:?}");
        assert!(
            names.contains(&"everything__get-sum".to_owned()),
            "{names:?}"
        );
        assert!(
            !names.iter().any(|n| n.contains("trigger-")),
            "denied: {names:?}"
        );
        let echo = mcp
            .specs()
            .into_iter()
            .find(|s| s.name == "everything__echo")
            .unwrap();
        assert_eq!(echo.parameters["type"], "object");
        assert_eq!(echo.parameters["properties"]["message"]["type"], "string");

        let model = ScriptedModel::new([
            ScriptedTurn::tool_call("everything__echo", r#"{"message": "hello mcp"}"#),
            ScriptedTurn::tool_call("everything__get-sum", r#"{"a": 2, "b": 40}"#),
            ScriptedTurn::tool_call("everything__get-tiny-image", "{}"),
            ScriptedTurn::tool_call(
                "everything__get-structured-content",
                r#"{"location": "New York"}"#,
            ),
            ScriptedTurn::text("done"),
        ]);
        let agent = Agent::builder("assistant")
            .model(model)
            .tools(mcp.router())
            .build()
            .unwrap();
        let sink = CollectingSink::new();
        let run = agent
            .oneshot(
                RunRequest::new("use the tools")
                    .context(RunContext::builder().events(sink.clone()).build()),
            )
            .await
            .unwrap();
        assert_eq!(run.output, "done");
        let tools = tool_messages(&run);
        assert_eq!(tools[0], "Echo: hello mcp");
        assert!(tools[1].contains("42"), "{}", tools[1]);
        assert!(tools[2].contains("[image: image/png"), "{}", tools[2]);
        assert!(
            tools[3].contains("temperature") || tools[3].contains("New York"),
            "{}",
            tools[3]
        );
        let completed = sink
            .events()
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    AgentEvent::ToolCallCompleted {
                        is_error: false,
                        ..
                    }
                )
            })
            .count();
        assert_eq!(completed, 4);
        mcp.close().await;
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the npm MCP servers; run by scripts/peers/run-edge-tests.sh"]
async fn protocol_errors_and_bad_arguments_are_tool_messages_the_model_reads() {
    within(async {
        let mcp = McpTools::connect(everything_stdio().allow(["echo", "get-sum"]))
            .await
            .unwrap();
        assert_eq!(mcp.specs().len(), 2);
        let model = ScriptedModel::new([
            // The router checks the schema before the server sees it.
            ScriptedTurn::tool_call("everything__get-sum", r#"{"a": "two", "b": 1}"#),
            ScriptedTurn::text("done"),
        ]);
        let agent = Agent::builder("assistant")
            .model(model)
            .tools(mcp.router())
            .build()
            .unwrap();
        let run = agent.run("sum").await.unwrap();
        assert!(
            tool_messages(&run)[0].contains("do not match its schema"),
            "{:?}",
            tool_messages(&run)
        );

        mcp.close().await;
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the npm MCP servers; run by scripts/peers/run-edge-tests.sh"]
async fn approvals_apply_to_mcp_tools_as_to_native_ones() {
    within(async {
        let mcp = McpTools::connect(
            everything_stdio()
                .allow(["echo"])
                .requires_approval(["echo"]),
        )
        .await
        .unwrap();
        let model = ScriptedModel::new([
            ScriptedTurn::tool_call("everything__echo", r#"{"message": "secret"}"#),
            ScriptedTurn::text("declined"),
        ]);
        let agent = Agent::builder("assistant")
            .model(model)
            .tools(mcp.router())
            .approver(|call, _| async move { Some(ApprovalDecision::decline(&call, "not today")) })
            .build()
            .unwrap();
        let run = agent.run("echo").await.unwrap();
        let tools = tool_messages(&run);
        assert!(tools[0].contains("declined: not today"), "{tools:?}");
        assert!(!tools[0].contains("Echo:"), "the server never ran it");
        mcp.close().await;
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the npm MCP servers; run by scripts/peers/run-edge-tests.sh"]
async fn a_call_past_its_timeout_is_cancelled_and_the_model_reads_why() {
    within(async {
        let mcp = McpTools::connect(
            everything_stdio()
                .allow(["trigger-long-running-operation", "echo"])
                .call_timeout(Duration::from_millis(500)),
        )
        .await
        .unwrap();
        let model = ScriptedModel::new([
            ScriptedTurn::tool_call(
                "everything__trigger-long-running-operation",
                r#"{"duration": 10, "steps": 5}"#,
            ),
            ScriptedTurn::tool_call("everything__echo", r#"{"message": "still alive"}"#),
            ScriptedTurn::text("done"),
        ]);
        let agent = Agent::builder("assistant")
            .model(model)
            .tools(mcp.router())
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        let run = agent.run("wait").await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "the timeout ended the call"
        );
        let tools = tool_messages(&run);
        assert!(tools[0].contains("did not answer"), "{tools:?}");
        assert_eq!(
            tools[1], "Echo: still alive",
            "the session survives a timed-out call"
        );
        mcp.close().await;
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the npm MCP servers; run by scripts/peers/run-edge-tests.sh"]
async fn cancelling_the_run_ends_the_call_in_flight() {
    within(async {
        let mcp =
            McpTools::connect(everything_stdio().allow(["trigger-long-running-operation", "echo"]))
                .await
                .unwrap();
        let model = ScriptedModel::new([
            ScriptedTurn::tool_call(
                "everything__trigger-long-running-operation",
                r#"{"duration": 20, "steps": 4}"#,
            ),
            ScriptedTurn::text("never"),
        ]);
        let agent = Agent::builder("assistant")
            .model(model)
            .tools(mcp.router())
            .build()
            .unwrap();
        let sink = CollectingSink::new();
        let ctx = RunContext::builder().events(sink.clone()).build();
        let cancel = ctx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            cancel.cancel();
        });
        let started = std::time::Instant::now();
        let err = agent
            .clone()
            .oneshot(RunRequest::new("wait").context(ctx))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "CANCELLED");
        assert!(started.elapsed() < Duration::from_secs(10));
        let events = sink.events();
        let started_runs = events
            .iter()
            .filter(|e| matches!(e, AgentEvent::RunStarted { .. }))
            .count();
        let ended_runs = events
            .iter()
            .filter(|e| matches!(e, AgentEvent::RunCompleted { .. }))
            .count();
        assert_eq!(started_runs, ended_runs, "events balance: {events:?}");
        // The session is still good for the next run.
        let model = ScriptedModel::new([
            ScriptedTurn::tool_call("everything__echo", r#"{"message": "after"}"#),
            ScriptedTurn::text("ok"),
        ]);
        let agent = Agent::builder("assistant")
            .model(model)
            .tools(mcp.router())
            .build()
            .unwrap();
        assert_eq!(
            tool_messages(&agent.run("echo").await.unwrap())[0],
            "Echo: after"
        );
        mcp.close().await;
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the npm MCP servers; run by scripts/peers/run-edge-tests.sh"]
async fn a_dead_stdio_server_is_started_again_on_the_next_call_up_to_the_limit() {
    within(async {
        let mcp = McpTools::connect(everything_stdio().allow(["echo"]).max_restarts(1))
            .await
            .unwrap();
        let router = mcp.router();
        let call = |message: &str| {
            let router = router.clone();
            let call = tower_agent::types::ToolCall::new(
                "c",
                "everything__echo",
                format!(r#"{{"message": "{message}"}}"#),
            );
            async move {
                router
                    .oneshot(tower_agent::ToolInvocation::new(call, RunContext::new()))
                    .await
                    .unwrap()
            }
        };
        assert_eq!(call("one").await.content, "Echo: one");

        let kill = |pid: u32| {
            let status = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status()
                .unwrap();
            assert!(status.success());
        };
        let first = mcp.process_id().expect("a stdio server has a process");
        kill(first);
        // The session notices the death when the pipe closes; a call in that
        // window reads that the server is not reachable. Either way the next
        // call runs on a new process.
        let mut answer = call("two").await;
        for _ in 0..20 {
            if !answer.is_error {
                break;
            }
            assert!(
                answer.content.contains("not reachable") || answer.content.contains("restarted"),
                "{}",
                answer.content
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            answer = call("two").await;
        }
        assert_eq!(answer.content, "Echo: two");
        assert_eq!(mcp.restarts(), 1);
        let second = mcp.process_id().unwrap();
        assert_ne!(first, second);

        // Past the limit, the model reads that the server is gone.
        kill(second);
        let mut answer = call("three").await;
        for _ in 0..20 {
            if answer.content.contains("not started again") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            answer = call("three").await;
        }
        assert!(answer.is_error);
        assert!(
            answer.content.contains("not started again"),
            "{}",
            answer.content
        );
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the npm MCP servers; run by scripts/peers/run-edge-tests.sh"]
async fn streamable_http_server_tools_run_in_a_full_agent_run() {
    within(async {
        let mcp = McpTools::connect(
            McpServer::http("remote", everything_url())
                .prefix("ev")
                .allow(["echo", "get-sum"]),
        )
        .await
        .unwrap();
        let mut names: Vec<String> = mcp.specs().into_iter().map(|s| s.name).collect();
        names.sort();
        assert_eq!(names, ["ev__echo", "ev__get-sum"]);
        let model = ScriptedModel::new([
            ScriptedTurn::tool_calls([
                tower_agent::types::ToolCall::new("c1", "ev__echo", r#"{"message": "over http"}"#),
                tower_agent::types::ToolCall::new("c2", "ev__get-sum", r#"{"a": 1, "b": 2}"#),
            ]),
            ScriptedTurn::text("done"),
        ]);
        let agent = Agent::builder("assistant")
            .model(model)
            .tools(mcp.router())
            .build()
            .unwrap();
        let run = agent.run("go").await.unwrap();
        let tools = tool_messages(&run);
        assert_eq!(tools[0], "Echo: over http");
        assert!(tools[1].contains('3'), "{}", tools[1]);
        assert!(mcp.process_id().is_none());
        mcp.close().await;

        // A closed session is opened anew (a new `initialize`) on the next call.
        let again = agent_with(&mcp, "ev__echo", r#"{"message": "again"}"#)
            .run("go")
            .await
            .unwrap();
        assert_eq!(tool_messages(&again)[0], "Echo: again");
    })
    .await;
}

fn agent_with(mcp: &McpTools, tool: &str, args: &str) -> Agent {
    Agent::builder("assistant")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call(tool, args),
            ScriptedTurn::text("ok"),
        ]))
        .tools(mcp.router())
        .build()
        .unwrap()
}

#[tokio::test]
#[ignore = "needs the npm MCP servers; run by scripts/peers/run-edge-tests.sh"]
async fn filesystem_server_reads_and_writes_a_temp_directory() {
    within(async {
        let dir = std::env::temp_dir().join(format!("tower-agent-mcp-fs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dir = dir.canonicalize().unwrap();
        std::fs::write(dir.join("notes.txt"), "the answer is 42\n").unwrap();
        let mcp = McpTools::connect(
            McpServer::stdio(
                "fs",
                "node",
                [npm_bin("server-filesystem"), dir.display().to_string()],
            )
            .allow(["read_text_file", "write_file", "list_directory"]),
        )
        .await
        .unwrap();
        assert_eq!(mcp.specs().len(), 3);
        let read = serde_json::json!({"path": dir.join("notes.txt")}).to_string();
        let write =
            serde_json::json!({"path": dir.join("out.txt"), "content": "written by an agent"})
                .to_string();
        let outside = serde_json::json!({"path": "/etc/hostname"}).to_string();
        let model = ScriptedModel::new([
            ScriptedTurn::tool_call("fs__read_text_file", read),
            ScriptedTurn::tool_call("fs__write_file", write),
            ScriptedTurn::tool_call("fs__read_text_file", outside),
            ScriptedTurn::text("done"),
        ]);
        let agent = Agent::builder("assistant")
            .model(model)
            .tools(mcp.router())
            .build()
            .unwrap();
        let run = agent.run("read and write").await.unwrap();
        let tools = tool_messages(&run);
        assert!(tools[0].contains("the answer is 42"), "{tools:?}");
        assert_eq!(
            std::fs::read_to_string(dir.join("out.txt")).unwrap(),
            "written by an agent"
        );
        assert!(
            tools[2].to_lowercase().contains("denied") || tools[2].contains("outside"),
            "{tools:?}"
        );
        let errors: Vec<bool> = run
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .map(|m| m.text().contains("denied"))
            .collect();
        assert_eq!(errors, [false, false, true]);
        mcp.close().await;
        std::fs::remove_dir_all(&dir).unwrap();
    })
    .await;
}

/// The server lists more tools once it knows the client (a
/// `tools/list_changed` after `initialize`): given to the agent,
/// `McpTools::live` lists again before the next model call, the model is
/// offered the current tools, and the router calls a tool it was not built
/// with.
#[tokio::test]
#[ignore = "needs the npm MCP servers; run by scripts/peers/run-edge-tests.sh"]
async fn a_changed_tool_list_is_offered_from_the_next_model_call() {
    within(async {
        let mcp = McpTools::connect(everything_stdio()).await.unwrap();
        let router = mcp.router();
        // The server's notification, whenever it comes.
        mcp.changed().await;
        assert!(mcp.list_changed());

        let added = "everything__simulate-research-query";
        let model = ScriptedModel::new([
            ScriptedTurn::tool_call(added, r#"{"topic": "tides"}"#),
            ScriptedTurn::text("done"),
        ]);
        let agent = Agent::builder("assistant")
            .model(model.clone())
            .tools(router)
            .middleware(mcp.live())
            .build()
            .unwrap();
        let run = agent.run("research tides").await.unwrap();
        assert_eq!(run.output, "done");
        assert!(!mcp.list_changed(), "listed again");

        // Both model calls offered the server's current list.
        let current: Vec<String> = mcp.specs().into_iter().map(|s| s.name).collect();
        assert!(current.iter().any(|n| n == added), "{current:?}");
        for request in model.requests() {
            let offered: Vec<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
            assert_eq!(offered, current, "offered");
        }
        // The call reached the server, whatever it answered.
        let answer = &tool_messages(&run)[0];
        assert!(!answer.contains("unknown tool"), "{answer}");
        mcp.close().await;
    })
    .await;
}
