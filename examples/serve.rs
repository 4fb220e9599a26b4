//! The quickstart's kind of agent behind the HTTP server, on the embedded
//! `ScriptedModel`: no key and no network. Open the printed URL for the run
//! viewer, or use curl:
//!
//! ```sh
//! cargo run --example serve --features server
//! curl -s localhost:3000/v1/agents/support/runs -H 'content-type: application/json' \
//!   -d '{"input": "Where is order A-1042?"}'
//! curl -N localhost:3000/v1/agents/support/runs -H 'content-type: application/json' \
//!   -H 'accept: text/event-stream' -d '{"input": "Where is order A-1042?"}'
//! ```
//!
//! `PORT` picks the port (default 3000). The `refunds` agent pauses before
//! each refund until a person approves it (in the viewer, or with
//! `POST /v1/runs/{id}/resume`). Ctrl-C stops the server, letting running
//! runs finish for up to 10 s.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use tower::Layer;
use tower_agent::hooks::{ToolDecision, ToolVerdict};
use tower_agent::lifecycle::{Hook, LifecycleLayer, Middleware, MiddlewareStack};
use tower_agent::serve::AgentServer;
use tower_agent::types::{Role, ToolCall};
use tower_agent::{
    tool_sync, Agent, BoxError, RunContext, ScriptedModel, ScriptedTurn, ToolRouter,
};

#[derive(Deserialize, JsonSchema)]
struct OrderId {
    /// The order's id, such as `A-1042`.
    id: String,
}

fn tools() -> ToolRouter {
    ToolRouter::new()
        .tool(tool_sync(
            "order_status",
            "Where an order is",
            |o: OrderId| {
                Ok::<_, BoxError>(format!(
                    "{} left the warehouse yesterday; arrives Thursday",
                    o.id
                ))
            },
        ))
        .tool(tool_sync("refund", "Refunds an order", |o: OrderId| {
            Ok::<_, BoxError>(format!("refunded {}", o.id))
        }))
}

/// Scripted turns: call `tool` first, then answer from its result.
fn scripted(tool: &'static str, answer: &'static str) -> ScriptedModel {
    ScriptedModel::from_fn(move |request| {
        match request.messages.iter().rev().find(|m| m.role == Role::Tool) {
            Some(result) => {
                ScriptedTurn::text(format!("{answer} ({})", result.text())).chunk_chars(4)
            }
            None => ScriptedTurn::tool_call(tool, r#"{"id": "A-1042"}"#),
        }
    })
    .name("scripted-support")
}

/// Defers every refund: the run pauses until a person decides.
struct ApproveRefunds;

impl Middleware for ApproveRefunds {
    fn name(&self) -> &str {
        "approve-refunds"
    }

    fn before_tool<'a>(
        &'a self,
        _: &'a RunContext,
        call: &'a ToolCall,
        resumed: bool,
    ) -> Hook<'a, ToolVerdict> {
        let decision = if call.name == "refund" && !resumed {
            ToolDecision::Defer
        } else {
            ToolDecision::Continue
        };
        Hook::ok(ToolVerdict::decision(decision))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let support: Agent = Agent::builder("support")
        .instructions("You help customers with their orders.")
        .model(scripted("order_status", "Here is where your order is"))
        .tools(tools())
        .build()?;
    let refunds = LifecycleLayer::new(MiddlewareStack::new().push(ApproveRefunds)).layer(
        Agent::builder("refunds")
            .instructions("You refund orders once a person approved.")
            .model(scripted("refund", "Done"))
            .tools(tools())
            .build()?,
    );
    let server = AgentServer::new()
        .agent("support", support)
        .agent("refunds", refunds);

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("run viewer: http://{}/", listener.local_addr()?);
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    server
        .serve(listener, server.router(), shutdown, Duration::from_secs(10))
        .await?;
    Ok(())
}
