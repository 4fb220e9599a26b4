//! The MCP client that `@modelcontextprotocol/conformance client` drives:
//! it connects to the server URL given as the last argument over
//! streamable HTTP and, in an agent run on `ScriptedModel`, calls what the
//! scenario (`MCP_CONFORMANCE_SCENARIO`) expects a client to call.
//!
//! ```sh
//! npx @modelcontextprotocol/conformance client \
//!   --command "target/debug/examples/mcp_conformance_client" --scenario tools_call
//! ```
//!
//! `scripts/peers/run-edge-tests.sh` runs the client scenarios this way.

use tower_agent::mcp::{McpServer, McpTools};
use tower_agent::prelude::*;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .next_back()
        .filter(|a| a.starts_with("http"))
        .ok_or("usage: mcp_conformance_client <server url>")?;
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    let server = McpTools::connect(McpServer::http("conformance", url)).await?;
    let names = server.remote_names();
    println!("scenario `{scenario}`: the server lists {names:?}");

    // What the model asks for in each scenario: a call of the server's
    // tool, then an answer.
    let turns = match scenario.as_str() {
        "tools_call" => vec![
            ScriptedTurn::tool_call("conformance__add_numbers", r#"{"a": 2, "b": 3}"#),
            ScriptedTurn::text("2 + 3 = 5"),
        ],
        "sse-retry" => vec![
            ScriptedTurn::tool_call("conformance__test_reconnection", "{}"),
            ScriptedTurn::text("reconnected"),
        ],
        "elicitation-sep1034-client-defaults" => vec![
            ScriptedTurn::tool_call("conformance__test_client_elicitation_defaults", "{}"),
            ScriptedTurn::text("done"),
        ],
        _ => vec![ScriptedTurn::text("connected")],
    };
    let agent = Agent::builder("conformance")
        .model(ScriptedModel::new(turns))
        .tools(server.router())
        .build()?;
    let run = agent.run("Run the scenario").await?;
    for message in run.messages.iter().filter(|m| m.role == Role::Tool) {
        println!("tool result: {}", message.text());
    }
    println!("answer: {}", run.output);
    server.close().await;
    Ok(())
}
