//! MCP servers' tools as tool services (feature `mcp`), on the official Rust
//! SDK, [`rmcp`].
//!
//! [`McpTools::connect`] opens a session with one server, over **stdio** (a
//! child process, ended with the session) or **streamable HTTP**, and lists
//! its tools (every page). Each tool becomes an [`McpTool`] service in a
//! [`ToolRouter`], so it runs under the same tool layers, verdicts,
//! approvals and policy as a native tool, and the model stack masks what it
//! returns as it masks any tool message.
//!
//! - **Names** are prefixed per server (`github__create_issue`), so two
//!   servers cannot collide; [`McpServer::prefix`] and
//!   [`McpServer::separator`] change how.
//! - **Filters**: [`McpServer::allow`] and [`McpServer::deny`] pick the
//!   tools by their names on the server; a deny always wins.
//! - **Failures are tool messages**: an `isError` result, a protocol error,
//!   a timeout, a server that died; a dead stdio server is started again on
//!   the next call (up to [`McpServer::max_restarts`]), an HTTP session
//!   opened anew.
//! - **Cancellation**: a cancelled run drops its tool calls, and each
//!   dropped call sends `notifications/cancelled` to the server.
//! - **List changes**: the server's `notifications/tools/list_changed` marks
//!   the list stale ([`McpTools::list_changed`], [`McpTools::changed`]).
//!   Given to an agent, [`McpTools::live`] lists again before the next model
//!   call and offers the current tools from then on; the router built by
//!   [`McpTools::router`] finds a tool listed after it was built.
//!   [`McpTools::refresh`] lists again by hand.
//! - **Content**: text as is, structured content as JSON, images, audio and
//!   blobs as a placeholder naming their type and size.
//!
//! ```no_run
//! use tower_agent::mcp::{McpServer, McpTools};
//! use tower_agent::{Agent, ScriptedModel, ScriptedTurn};
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let everything = McpTools::connect(
//!     McpServer::stdio("everything", "npx", ["-y", "@modelcontextprotocol/server-everything"])
//!         .allow(["echo", "get-sum"]),
//! )
//! .await?;
//! let agent = Agent::builder("assistant")
//!     .model(ScriptedModel::new([
//!         ScriptedTurn::tool_call("everything__echo", r#"{"message": "hi"}"#),
//!         ScriptedTurn::text("done"),
//!     ]))
//!     .tools(everything.router())
//!     .build()?;
//! let run = agent.run("Echo hi").await?;
//! assert_eq!(run.output, "done");
//! # Ok(()) }
//! ```

mod connection;
mod convert;
mod live;
mod tool;

use std::collections::HashSet;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub use convert::ToolFilter;
pub use live::LiveMcpTools;
pub use tool::McpTool;

use connection::Connection;
use convert::{prefixed_name, tool_spec};

use crate::service::{ToolDef, ToolRouter, ToolSource};
use crate::types::ToolSpec;

/// Why a server could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The server's process could not start.
    #[error("the MCP server `{server}` could not start: {source}")]
    Spawn {
        /// The server.
        server: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The session could not be opened (`initialize` failed or timed out).
    #[error("the MCP server `{server}` did not initialize: {message}")]
    Initialize {
        /// The server.
        server: String,
        /// Why.
        message: String,
    },
    /// `tools/list` failed.
    #[error("the MCP server `{server}` did not list its tools: {message}")]
    List {
        /// The server.
        server: String,
        /// Why.
        message: String,
    },
    /// The session died again after the last restart allowed.
    #[error("the MCP server `{server}` died and was restarted {restarts} times; it is not started again")]
    Gone {
        /// The server.
        server: String,
        /// How many restarts it had.
        restarts: u32,
    },
}

#[derive(Debug, Clone)]
pub(crate) enum Transport {
    Stdio {
        program: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
        cwd: Option<PathBuf>,
    },
    Http {
        url: String,
    },
}

/// How to reach one MCP server and which of its tools to expose; the
/// argument of [`McpTools::connect`]. Consuming setters; defaults: prefix
/// the server's name, separator `__`, every tool, a 60 s call timeout, a
/// 30 s connect timeout, 3 restarts.
#[derive(Debug, Clone)]
pub struct McpServer {
    pub(crate) name: String,
    pub(crate) transport: Transport,
    prefix: Option<String>,
    separator: String,
    filter: ToolFilter,
    approval: ToolFilter,
    approval_set: bool,
    idempotent: ToolFilter,
    idempotent_set: bool,
    pub(crate) call_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_restarts: u32,
}

impl McpServer {
    fn new(name: impl Into<String>, transport: Transport) -> Self {
        Self {
            name: name.into(),
            transport,
            prefix: None,
            separator: "__".into(),
            filter: ToolFilter::new(),
            approval: ToolFilter::new(),
            approval_set: false,
            idempotent: ToolFilter::new(),
            idempotent_set: false,
            call_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(30),
            max_restarts: 3,
        }
    }

    /// A server run as a child process speaking MCP on its stdin and stdout.
    pub fn stdio<I, S>(name: impl Into<String>, program: impl Into<String>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::new(
            name,
            Transport::Stdio {
                program: program.into(),
                args: args.into_iter().map(Into::into).collect(),
                env: Vec::new(),
                cwd: None,
            },
        )
    }

    /// A server reached over streamable HTTP at `url` (e.g.
    /// `http://127.0.0.1:3001/mcp`).
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self::new(name, Transport::Http { url: url.into() })
    }

    /// Sets an environment variable of a stdio server's process.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        if let Transport::Stdio { env, .. } = &mut self.transport {
            env.push((key.into(), value.into()));
        }
        self
    }

    /// The working directory of a stdio server's process.
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        if let Transport::Stdio { cwd, .. } = &mut self.transport {
            *cwd = Some(dir.into());
        }
        self
    }

    /// The prefix of its tools' names (default: the server's name; empty for
    /// none).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// What joins the prefix and a tool's name (default `__`).
    pub fn separator(mut self, separator: impl Into<String>) -> Self {
        self.separator = separator.into();
        self
    }

    /// Exposes only the tools matching `patterns` (names on the server; a
    /// pattern ending in `*` matches a prefix).
    pub fn allow<I, S>(mut self, patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.filter = self.filter.allow(patterns);
        self
    }

    /// Hides the tools matching `patterns`; a deny wins over an allow.
    pub fn deny<I, S>(mut self, patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.filter = self.filter.deny(patterns);
        self
    }

    /// Each call of the tools matching `patterns` needs approval, as a native
    /// tool marked `requires_approval` does.
    pub fn requires_approval<I, S>(mut self, patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.approval = self.approval.allow(patterns);
        self.approval_set = true;
        self
    }

    /// The tools matching `patterns` are safe to call twice (a retry layer
    /// may retry them).
    pub fn idempotent<I, S>(mut self, patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.idempotent = self.idempotent.allow(patterns);
        self.idempotent_set = true;
        self
    }

    /// How long a call may wait for its answer (default 60 s); then it is
    /// cancelled and the model reads that it timed out.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// How long opening a session may take (default 30 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How many times a dead session is opened again (default 3).
    pub fn max_restarts(mut self, restarts: u32) -> Self {
        self.max_restarts = restarts;
        self
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn exposed_name(&self, remote: &str) -> String {
        let prefix = self.prefix.as_deref().unwrap_or(&self.name);
        prefixed_name(prefix, &self.separator, remote)
    }
}

#[derive(Clone)]
struct Listed {
    remote: String,
    def: ToolDef,
}

/// The tools of one MCP server, as tool services; see the module docs.
///
/// # Clone
///
/// Cheap: clones share the session and the list.
#[derive(Clone)]
pub struct McpTools {
    connection: Arc<Connection>,
    tools: Arc<RwLock<Arc<[Listed]>>>,
}

impl McpTools {
    /// Opens a session with `server` and lists its tools.
    ///
    /// # Errors
    ///
    /// [`McpError`] when the server does not start, initialize or list.
    pub async fn connect(server: McpServer) -> Result<Self, McpError> {
        let tools = Self {
            connection: Arc::new(Connection::new(server)),
            tools: Arc::new(RwLock::new(Arc::from([]))),
        };
        tools.list().await?;
        Ok(tools)
    }

    async fn list(&self) -> Result<(), McpError> {
        let listed = self.connection.list_tools().await?;
        let server = &self.connection.server;
        let mut seen = HashSet::new();
        let tools: Vec<Listed> = listed
            .iter()
            .filter(|t| server.filter.keeps(&t.name))
            .filter_map(|t| {
                let name = server.exposed_name(&t.name);
                // Two remote names that clean to one exposed name: the first wins.
                seen.insert(name.clone()).then(|| {
                    let service = McpTool::new(self.connection.clone(), &t.name, &name);
                    let mut def = ToolDef::new(tool_spec(name, t), service);
                    if server.approval_set && server.approval.keeps(&t.name) {
                        def = def.requires_approval();
                    }
                    if server.idempotent_set && server.idempotent.keeps(&t.name) {
                        def = def.idempotent();
                    }
                    Listed {
                        remote: t.name.to_string(),
                        def,
                    }
                })
            })
            .collect();
        *self
            .tools
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = tools.into();
        Ok(())
    }

    fn snapshot(&self) -> Arc<[Listed]> {
        self.tools
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The server's name.
    pub fn server(&self) -> &str {
        &self.connection.server.name
    }

    /// The specs of the exposed tools, as the model sees them.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.snapshot().iter().map(|t| t.def.spec.clone()).collect()
    }

    /// The exposed tools' names on the server.
    pub fn remote_names(&self) -> Vec<String> {
        self.snapshot().iter().map(|t| t.remote.clone()).collect()
    }

    /// The exposed tools, ready for a [`ToolRouter`].
    pub fn defs(&self) -> Vec<ToolDef> {
        self.snapshot().iter().map(|t| t.def.clone()).collect()
    }

    /// `router` with the exposed tools added, and this server as a
    /// [`ToolSource`] of it, so a tool the server lists later (after
    /// [`refresh`](Self::refresh), or through [`live`](Self::live)) is
    /// called like the others.
    pub fn register(&self, router: ToolRouter) -> ToolRouter {
        self.defs()
            .into_iter()
            .fold(router, ToolRouter::tool)
            .source(self.clone())
    }

    /// A router with the exposed tools.
    pub fn router(&self) -> ToolRouter {
        self.register(ToolRouter::new())
    }

    /// Whether the server said its tool list changed since it was last
    /// listed.
    pub fn list_changed(&self) -> bool {
        self.connection.changed.load(Ordering::Acquire)
    }

    /// Waits until the server says its tool list changed (at once if it did
    /// since the list was last fetched).
    pub async fn changed(&self) {
        loop {
            let notified = self.connection.notify.notified();
            if self.list_changed() {
                return;
            }
            notified.await;
        }
    }

    /// The middleware that keeps an agent's offer of this server's tools
    /// current: see [`LiveMcpTools`].
    pub fn live(&self) -> LiveMcpTools {
        LiveMcpTools::new(self.clone())
    }

    /// Whether `name` (an exposed name) is one of this server's: it carries
    /// the server's prefix, or, with no prefix, is listed now.
    pub(crate) fn owns(&self, name: &str) -> bool {
        let prefix = self.connection.server.exposed_name("");
        if prefix.is_empty() {
            self.snapshot().iter().any(|t| t.def.spec.name == name)
        } else {
            name.starts_with(&prefix)
        }
    }

    /// Lists the tools again when the server said the list changed; answers
    /// whether it did.
    ///
    /// # Errors
    ///
    /// [`McpError`] when listing fails.
    pub async fn refresh(&self) -> Result<bool, McpError> {
        if !self.list_changed() {
            return Ok(false);
        }
        self.list().await?;
        Ok(true)
    }

    /// How many times the session was opened again after it died.
    pub fn restarts(&self) -> u32 {
        self.connection.restarts()
    }

    /// The process id of a stdio server's current process, if it has one.
    pub fn process_id(&self) -> Option<u32> {
        self.connection.process_id()
    }

    /// Ends the session (and a stdio server's process). Calls after it open
    /// a new session.
    pub async fn close(&self) {
        self.connection.close().await;
    }
}

impl ToolSource for McpTools {
    fn tool(&self, name: &str) -> Option<ToolDef> {
        self.snapshot()
            .iter()
            .find(|t| t.def.spec.name == name)
            .map(|t| t.def.clone())
    }

    fn names(&self) -> Vec<String> {
        self.snapshot()
            .iter()
            .map(|t| t.def.spec.name.clone())
            .collect()
    }
}

impl fmt::Debug for McpTools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpTools")
            .field("server", &self.connection.server.name)
            .field(
                "tools",
                &self
                    .snapshot()
                    .iter()
                    .map(|t| t.def.spec.name.clone())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}
