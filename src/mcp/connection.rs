//! One live session with an MCP server, opened again when it died.

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProtocolVersion, Tool};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, Peer, RoleClient, ServiceExt};

use super::{McpError, McpServer, Transport};

/// What the client does with the server's notifications: it notes that the
/// tool list changed, for the next refresh.
#[derive(Debug, Clone)]
pub(crate) struct Handler {
    changed: Arc<AtomicBool>,
    notify: Arc<tokio::sync::Notify>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changed.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// The session opens with the `initialize` handshake, so it offers the
    /// newest protocol version that has one (the server may answer with an
    /// older one).
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("tower-agent", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }
}

type Session = RunningService<RoleClient, Handler>;

/// A server's session: opened on first use, opened again (up to the
/// server's restart limit) after it died or its transport failed.
pub(crate) struct Connection {
    pub(crate) server: McpServer,
    session: tokio::sync::Mutex<Option<Session>>,
    /// Set when a call saw the transport fail: the next call reconnects.
    broken: AtomicBool,
    restarts: AtomicU32,
    /// The process id of a stdio server's current process (0: none).
    pid: AtomicU32,
    pub(crate) changed: Arc<AtomicBool>,
    /// Woken when the server says its list changed.
    pub(crate) notify: Arc<tokio::sync::Notify>,
}

impl Connection {
    pub(crate) fn new(server: McpServer) -> Self {
        Self {
            server,
            session: tokio::sync::Mutex::new(None),
            broken: AtomicBool::new(false),
            restarts: AtomicU32::new(0),
            pid: AtomicU32::new(0),
            changed: Arc::new(AtomicBool::new(false)),
            notify: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// How many times the session was opened again.
    pub(crate) fn restarts(&self) -> u32 {
        self.restarts.load(Ordering::Acquire)
    }

    /// The process id of a stdio server's current process.
    pub(crate) fn process_id(&self) -> Option<u32> {
        Some(self.pid.load(Ordering::Acquire)).filter(|&pid| pid != 0)
    }

    /// Marks the session broken: the next call opens a new one.
    pub(crate) fn mark_broken(&self) {
        self.broken.store(true, Ordering::Release);
    }

    /// A peer on a live session, opening one when there is none or the last
    /// one died.
    pub(crate) async fn peer(&self) -> Result<Peer<RoleClient>, McpError> {
        let mut session = self.session.lock().await;
        if let Some(live) = session.as_ref() {
            let dead = live.is_closed()
                || live.peer().is_transport_closed()
                || self.broken.load(Ordering::Acquire);
            if !dead {
                return Ok(live.peer().clone());
            }
            let restarts = self.restarts.load(Ordering::Acquire);
            if restarts >= self.server.max_restarts {
                return Err(McpError::Gone {
                    server: self.server.name.clone(),
                    restarts,
                });
            }
            self.restarts.fetch_add(1, Ordering::AcqRel);
            // Dropping the old session kills its child process.
            if let Some(mut old) = session.take() {
                let _ = old.close_with_timeout(self.server.connect_timeout).await;
            }
        }
        self.broken.store(false, Ordering::Release);
        let live = self.open().await?;
        let peer = live.peer().clone();
        *session = Some(live);
        Ok(peer)
    }

    async fn open(&self) -> Result<Session, McpError> {
        let handler = Handler {
            changed: self.changed.clone(),
            notify: self.notify.clone(),
        };
        let name = &self.server.name;
        let connect = async {
            match &self.server.transport {
                Transport::Stdio {
                    program,
                    args,
                    env,
                    cwd,
                } => {
                    let mut command = tokio::process::Command::new(program);
                    command
                        .args(args)
                        .envs(env.iter().cloned())
                        .kill_on_drop(true);
                    if let Some(cwd) = cwd {
                        command.current_dir(cwd);
                    }
                    let (transport, _stderr) = TokioChildProcess::builder(command)
                        .stderr(Stdio::null())
                        .spawn()
                        .map_err(|source| McpError::Spawn {
                            server: name.clone(),
                            source,
                        })?;
                    self.pid
                        .store(transport.id().unwrap_or(0), Ordering::Release);
                    handler
                        .serve(transport)
                        .await
                        .map_err(|e| McpError::Initialize {
                            server: name.clone(),
                            message: e.to_string(),
                        })
                }
                Transport::Http { url } => {
                    let transport = StreamableHttpClientTransport::from_uri(url.as_str());
                    handler
                        .serve(transport)
                        .await
                        .map_err(|e| McpError::Initialize {
                            server: name.clone(),
                            message: e.to_string(),
                        })
                }
            }
        };
        match tokio::time::timeout(self.server.connect_timeout, connect).await {
            Ok(result) => result,
            Err(_) => Err(McpError::Initialize {
                server: name.clone(),
                message: format!(
                    "no answer to `initialize` within {:?}",
                    self.server.connect_timeout
                ),
            }),
        }
    }

    /// Every tool the server lists, following `nextCursor` to the last page.
    pub(crate) async fn list_tools(&self) -> Result<Vec<Tool>, McpError> {
        self.changed.store(false, Ordering::Release);
        let peer = self.peer().await?;
        let listed = tokio::time::timeout(self.server.call_timeout, peer.list_all_tools()).await;
        match listed {
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(e)) => {
                self.mark_broken_if_transport(&e);
                Err(McpError::List {
                    server: self.server.name.clone(),
                    message: e.to_string(),
                })
            }
            Err(_) => Err(McpError::List {
                server: self.server.name.clone(),
                message: format!("no answer within {:?}", self.server.call_timeout),
            }),
        }
    }

    pub(crate) fn mark_broken_if_transport(&self, error: &rmcp::ServiceError) {
        if is_transport(error) {
            self.mark_broken();
        }
    }

    /// Closes the session (and ends its child process).
    pub(crate) async fn close(&self) {
        if let Some(mut live) = self.session.lock().await.take() {
            let _ = live.close_with_timeout(self.server.connect_timeout).await;
        }
    }
}

/// Whether an error says the session itself failed (so a new one may help),
/// rather than the server refusing one request.
pub(crate) fn is_transport(error: &rmcp::ServiceError) -> bool {
    matches!(
        error,
        rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_)
    )
}
