//! [`LiveMcpTools`]: an agent's offer of an MCP server's tools, kept current
//! as the server's list changes.

use std::fmt;
use std::sync::Arc;

use super::McpTools;
use crate::lifecycle::{Middleware, ModelNext, Wrapped};
use crate::request::ModelCall;
use crate::types::ToolSpec;

/// Middleware that keeps the tools a model call offers in step with an MCP
/// server: when the server has said `notifications/tools/list_changed`, it
/// lists the tools again before the next model call, and every model call
/// then offers the server's current tools in place of those it offered
/// before (the other tools, and their order, are kept). A tool the server
/// gained is called through the router made by [`McpTools::router`] or
/// [`McpTools::register`], which looks the server up for names it was not
/// built with.
///
/// Made by [`McpTools::live`]. A model call that offers none of the
/// server's tools (say, a nested agent's) is left as it is; so is one when
/// listing fails (logged at `warn`: the run goes on with the tools it had).
///
/// ```no_run
/// use tower_agent::mcp::{McpServer, McpTools};
/// use tower_agent::{Agent, ScriptedModel, ScriptedTurn};
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let server = McpTools::connect(McpServer::stdio(
///     "everything",
///     "npx",
///     ["-y", "@modelcontextprotocol/server-everything"],
/// ))
/// .await?;
/// let agent = Agent::builder("assistant")
///     .model(ScriptedModel::new([ScriptedTurn::text("done")]))
///     .tools(server.router())
///     .middleware(server.live())
///     .build()?;
/// agent.run("What can you do?").await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LiveMcpTools {
    tools: McpTools,
    name: String,
}

impl LiveMcpTools {
    pub(super) fn new(tools: McpTools) -> Self {
        let name = format!("mcp-live:{}", tools.server());
        Self { tools, name }
    }
}

impl fmt::Debug for LiveMcpTools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveMcpTools")
            .field("server", &self.tools.server())
            .finish()
    }
}

impl Middleware for LiveMcpTools {
    fn name(&self) -> &str {
        &self.name
    }

    fn wrap_model<'a>(&'a self, mut call: ModelCall, next: ModelNext) -> Wrapped<'a, ModelCall> {
        let offered = &call.request.tools;
        if !offered.iter().any(|t| self.tools.owns(&t.name)) {
            return Wrapped::next(call, next);
        }
        Wrapped::new(async move {
            if self.tools.list_changed() {
                if let Err(e) = self.tools.refresh().await {
                    tracing::warn!(server = self.tools.server(), error = %e,
                        "MCP: listing the changed tools failed; offering the tools listed before");
                }
            }
            let current = self.tools.specs();
            if let Some(tools) =
                replace_owned(&call.request.tools, &current, |n| self.tools.owns(n))
            {
                call.request.tools = tools;
            }
            next.run(call).await
        })
    }
}

/// `offered` with the specs `owned` picks replaced by `current`, put where
/// the first owned one was; `None` when that changes nothing.
fn replace_owned(
    offered: &[ToolSpec],
    current: &[ToolSpec],
    owned: impl Fn(&str) -> bool,
) -> Option<Arc<[ToolSpec]>> {
    let were: Vec<&ToolSpec> = offered.iter().filter(|t| owned(&t.name)).collect();
    if were.len() == current.len() && were.iter().zip(current).all(|(a, b)| *a == b) {
        return None;
    }
    let at = offered
        .iter()
        .position(|t| owned(&t.name))
        .unwrap_or(offered.len());
    let mut tools: Vec<ToolSpec> = Vec::with_capacity(offered.len() + current.len());
    tools.extend(offered[..at].iter().cloned());
    tools.extend(current.iter().cloned());
    tools.extend(offered[at..].iter().filter(|t| !owned(&t.name)).cloned());
    Some(tools.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> ToolSpec {
        ToolSpec::new(name, "a tool", serde_json::json!({"type": "object"}))
    }

    fn names(tools: &[ToolSpec]) -> Vec<&str> {
        tools.iter().map(|t| t.name.as_str()).collect()
    }

    fn owned(name: &str) -> bool {
        name.starts_with("srv__")
    }

    #[test]
    fn the_server_tools_are_replaced_in_place() {
        let offered = [spec("a"), spec("srv__x"), spec("b"), spec("srv__y")];
        let current = [spec("srv__y"), spec("srv__z")];
        let tools = replace_owned(&offered, &current, owned).unwrap();
        assert_eq!(names(&tools), ["a", "srv__y", "srv__z", "b"]);
    }

    #[test]
    fn an_unchanged_list_changes_nothing() {
        let offered = [spec("a"), spec("srv__x"), spec("srv__y")];
        let current = [spec("srv__x"), spec("srv__y")];
        assert!(replace_owned(&offered, &current, owned).is_none());
    }

    #[test]
    fn a_shorter_or_longer_list_is_a_change() {
        let offered = [spec("srv__x"), spec("srv__y")];
        let fewer = replace_owned(&offered, &[spec("srv__x")], owned).unwrap();
        assert_eq!(names(&fewer), ["srv__x"]);
        let more = replace_owned(&offered[..1], &offered, owned).unwrap();
        assert_eq!(names(&more), ["srv__x", "srv__y"]);
        let none = replace_owned(&offered, &[], owned).unwrap();
        assert!(none.is_empty());
    }
}
