//! Requests per second and latency percentiles of `POST /v1/agents/{name}/runs`
//! on `ScriptedModel` with 64 concurrent clients over real sockets, beside
//! the same agent called in process by 64 concurrent tasks.
//!
//! ```sh
//! cargo bench --bench serve --features server            # 5 s per side
//! cargo bench --bench serve --features server -- --quick # 1 s per side
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use tower::ServiceExt;
use tower_agent::serve::AgentServer;
use tower_agent::types::Role;
use tower_agent::{
    tool_sync, Agent, BoxError, RunRequest, ScriptedModel, ScriptedTurn, ToolRouter,
};

const CLIENTS: usize = 64;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Sum {
    a: i64,
    b: i64,
}

/// A two-turn run with one tool call.
fn agent() -> Agent {
    Agent::builder("calc")
        .model(
            ScriptedModel::from_fn(|req| {
                if req.messages.iter().any(|m| m.role == Role::Tool) {
                    ScriptedTurn::text("2 + 3 = 5")
                } else {
                    ScriptedTurn::tool_call("add", r#"{"a": 2, "b": 3}"#)
                }
            })
            .record(false),
        )
        .tools(ToolRouter::new().tool(tool_sync("add", "Adds", |s: Sum| {
            Ok::<_, BoxError>(s.a + s.b)
        })))
        .build()
        .unwrap()
}

struct Figures {
    requests: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Figures {
    fn percentile(&self, p: f64) -> Duration {
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i]
    }

    fn print(&self, what: &str) {
        println!(
            "{what:<34} {:>10.0} req/s   p50 {:>9.1?}   p99 {:>9.1?}   ({} requests)",
            self.requests as f64 / self.elapsed.as_secs_f64(),
            self.percentile(0.50),
            self.percentile(0.99),
            self.requests
        );
    }
}

/// `CLIENTS` loops each doing `one` back to back for `duration`.
async fn load<F, Fut>(duration: Duration, one: F) -> Figures
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let one = Arc::new(one);
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let one = one.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    one().await;
                    latencies.push(t.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let elapsed = start.elapsed();
    latencies.sort_unstable();
    Figures {
        requests: latencies.len(),
        elapsed,
        latencies,
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let duration = Duration::from_secs(if quick { 1 } else { 5 });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = AgentServer::new().agent("calc", agent());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/v1/agents/calc/runs",
            listener.local_addr().unwrap()
        );
        let app = server.router();
        let serving = tokio::spawn(async move { axum::serve(listener, app).await });

        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(CLIENTS)
            .build()
            .unwrap();
        let http = load(duration, move || {
            let client = client.clone();
            let url = url.clone();
            async move {
                let response = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(r#"{"input": "What is 2 + 3?"}"#)
                    .send()
                    .await
                    .unwrap();
                assert!(response.status().is_success());
                let _ = response.bytes().await.unwrap();
            }
        })
        .await;

        let agent = agent();
        let in_process = load(duration, move || {
            let agent = agent.clone();
            async move {
                let run = agent
                    .oneshot(RunRequest::new("What is 2 + 3?"))
                    .await
                    .unwrap();
                assert!(run.is_completed());
            }
        })
        .await;
        serving.abort();

        println!(
            "serve: {CLIENTS} concurrent clients, a 2-turn run with one tool call on ScriptedModel"
        );
        http.print("POST /v1/agents/calc/runs (HTTP)");
        in_process.print("the same agent in process");
    });
}
