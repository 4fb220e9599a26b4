//! One MCP tool as a tool service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use rmcp::model::CallToolRequestParams;
use serde_json::Value;
use tower::Service;

use super::connection::{is_transport, Connection};
use super::convert::tool_output;
use crate::error::BoxError;
use crate::request::{ToolInvocation, ToolOutput};

/// A tool of an MCP server, as a `Service<ToolInvocation>`: each call is a
/// `tools/call` on the server's session.
///
/// What goes wrong on the server's side becomes a [`ToolOutput::error`] the
/// model reads, never a failed run: a result with `isError`, a protocol
/// error, no answer within the server's call timeout (the call is then
/// cancelled on the server), a session that died (the next call opens a new
/// one, up to the server's restart limit). Dropping the call's future, as a
/// cancelled run does, sends `notifications/cancelled` for it.
///
/// # Clone
///
/// Cheap: clones share the server's session.
#[derive(Clone)]
pub struct McpTool {
    connection: Arc<Connection>,
    remote: Arc<str>,
    name: Arc<str>,
}

impl McpTool {
    pub(crate) fn new(connection: Arc<Connection>, remote: &str, name: &str) -> Self {
        Self {
            connection,
            remote: remote.into(),
            name: name.into(),
        }
    }

    /// The name the model calls it by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its name on the server.
    pub fn remote_name(&self) -> &str {
        &self.remote
    }

    /// The server it belongs to.
    pub fn server(&self) -> &str {
        &self.connection.server.name
    }
}

impl fmt::Debug for McpTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpTool")
            .field("server", &self.connection.server.name)
            .field("name", &self.name)
            .field("remote", &self.remote)
            .finish()
    }
}

impl Service<ToolInvocation> for McpTool {
    type Response = ToolOutput;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<ToolOutput, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, invocation: ToolInvocation) -> Self::Future {
        let connection = self.connection.clone();
        let remote = self.remote.clone();
        Box::pin(async move { Ok(call(&connection, &remote, invocation.args).await) })
    }
}

async fn call(connection: &Connection, remote: &str, args: Value) -> ToolOutput {
    let server = &connection.server.name;
    let arguments = match args {
        Value::Object(map) => Some(map),
        Value::Null => None,
        other => {
            return ToolOutput::error(format!(
                "the arguments of `{remote}` must be a JSON object, not {other}"
            ))
        }
    };
    let peer = match connection.peer().await {
        Ok(peer) => peer,
        Err(e) => return ToolOutput::error(e.to_string()),
    };
    let mut params = CallToolRequestParams::new(remote.to_owned());
    params.arguments = arguments;
    let timeout = connection.server.call_timeout;
    // Dropping `call_tool` (on the timeout, or when the run drops this
    // future) sends `notifications/cancelled` for the request.
    match tokio::time::timeout(timeout, peer.call_tool(params)).await {
        Ok(Ok(result)) => tool_output(result),
        Ok(Err(rmcp::ServiceError::McpError(e))) => ToolOutput::error(format!(
            "the MCP server `{server}` refused `{remote}`: {} (code {})",
            e.message, e.code.0
        )),
        Ok(Err(e)) if is_transport(&e) => {
            connection.mark_broken();
            ToolOutput::error(format!(
                "the MCP server `{server}` is not reachable ({e}); it is started again on the next call"
            ))
        }
        Ok(Err(e)) => ToolOutput::error(format!(
            "the MCP server `{server}` failed `{remote}`: {e}"
        )),
        Err(_) => ToolOutput::error(format!(
            "the MCP server `{server}` did not answer `{remote}` within {timeout:?}; the call was cancelled"
        )),
    }
}
