//! Helpers shared by the provider tests: the peers' addresses, and a tiny
//! HTTP/1.1 server that answers from a script of recorded responses.
#![allow(dead_code, unreachable_pub)]

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The variable `name`, from the environment or else from `.peers/env` (what
/// `scripts/peers/start.sh` wrote).
pub fn peer_var(name: &str) -> Option<String> {
    if let Ok(value) = std::env::var(name) {
        if !value.is_empty() {
            return Some(value);
        }
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".peers/env");
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == name).then(|| unquote(value.trim()))
    })
}

/// Undoes the `'...'` quoting of `.peers/env` (`'\''` is a quote).
fn unquote(value: &str) -> String {
    match value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
        Some(inner) => inner.replace("'\\''", "'"),
        None => value.to_owned(),
    }
}

/// The peer's URL; panics (the test fails, loudly) when it is not running.
pub fn require_peer(var: &str) -> String {
    peer_var(var).unwrap_or_else(|| {
        panic!("{var} is not set: start the peers first with `bash scripts/peers/start.sh`")
    })
}

/// Writes a line straight to the process's stderr, past the test harness's
/// capture, so it shows even for a passing test.
pub fn shout(line: &str) {
    let mut err = std::io::stderr();
    let _ = writeln!(err, "{line}");
    let _ = err.flush();
}

/// A name unique to this process and call, for aimock's `X-Test-Id`.
pub fn unique(name: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{name}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// One scripted answer of the [`TestServer`].
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// Written one after the other, flushed each time.
    pub chunks: Vec<Vec<u8>>,
    /// Never answer: hold the connection open until the client gives up.
    pub stall: bool,
    /// After the chunks, hold the connection open instead of closing it: a
    /// body that stops coming.
    pub hold: bool,
}

impl Reply {
    pub fn json(status: u16, body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            chunks: vec![body.into()],
            stall: false,
            hold: false,
        }
    }

    pub fn sse(chunks: Vec<Vec<u8>>) -> Reply {
        Reply {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            chunks,
            stall: false,
            hold: false,
        }
    }

    pub fn stall() -> Reply {
        Reply {
            status: 200,
            headers: Vec::new(),
            chunks: Vec::new(),
            stall: true,
            hold: false,
        }
    }

    /// The chunks, then nothing more while the connection stays open.
    pub fn then_stall(mut self) -> Reply {
        self.hold = true;
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// A fixture file of `tests/fixtures/`.
pub fn fixture(path: &str) -> Vec<u8> {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(path);
    std::fs::read(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// A request the [`TestServer`] received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("the request body is JSON")
    }
}

/// A one-request-per-connection HTTP/1.1 server on 127.0.0.1 that answers
/// each connection with the next scripted [`Reply`] (bodies end when the
/// connection closes) and keeps what it received.
pub struct TestServer {
    pub url: String,
    received: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    pub async fn start(script: Vec<Reply>) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let seen = received.clone();
        let task = tokio::spawn(async move {
            for reply in script {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let seen = seen.clone();
                tokio::spawn(async move { serve(socket, reply, seen).await });
            }
        });
        TestServer {
            url,
            received,
            task,
        }
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut socket: TcpStream, reply: Reply, seen: Arc<Mutex<Vec<Received>>>) {
    let Some(request) = read_request(&mut socket).await else {
        return;
    };
    seen.lock().unwrap().push(request);
    if reply.stall {
        return hold(socket).await;
    }
    let reason = http::StatusCode::from_u16(reply.status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Status");
    let mut head = format!("HTTP/1.1 {} {reason}\r\n", reply.status);
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("connection: close\r\n\r\n");
    if socket.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    for chunk in &reply.chunks {
        if socket.write_all(chunk).await.is_err() || socket.flush().await.is_err() {
            return;
        }
    }
    if reply.hold {
        return hold(socket).await;
    }
    let _ = socket.shutdown().await;
}

/// Keeps the connection open, reading what comes, until the client closes it.
async fn hold(mut socket: TcpStream) {
    let mut sink = [0u8; 64];
    while let Ok(n) = socket.read(&mut sink).await {
        if n == 0 {
            break;
        }
    }
}

async fn read_request(socket: &mut TcpStream) -> Option<Received> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
    let path = first.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Received {
        method,
        path,
        headers,
        body,
    })
}
