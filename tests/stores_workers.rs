//! The Redis stores across processes and across a server restart.
//!
//! - Several worker processes (this test binary, re-invoked with
//!   `STORES_WORKER` set) share one quota on the server named by
//!   `TOWER_AGENT_REDIS_URL`: together they are admitted no more than it.
//! - A server of the test's own (`redis-server` on a free port, append-only
//!   file on) is stopped and started again mid-run: the stores fail as they
//!   say while it is down, and afterwards the connection manager has
//!   reconnected and nothing written before is lost.
#![cfg(feature = "redis")]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures::future::join_all;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent::error::kind_of;
use tower_agent::layers::cache::CacheLayer;
use tower_agent::layers::rate_limit::ModelRateLimitLayer;
use tower_agent::stores::redis::{RedisCacheStore, RedisConfig, RedisQuotaStore};
use tower_agent::stores::FailPolicy;
use tower_agent::types::{Message, ModelRequest};
use tower_agent::{ErrorKind, ModelCall, RunContext, ScriptedModel, ScriptedTurn};

const MINUTE: Duration = Duration::from_secs(60);

fn call(text: &str) -> ModelCall {
    ModelCall::new(
        ModelRequest::new("m", vec![Message::user(text)]),
        RunContext::new(),
    )
}

fn shared_url() -> String {
    std::env::var("TOWER_AGENT_REDIS_URL").expect(
        "TOWER_AGENT_REDIS_URL names the Redis server (scripts/peers/run-redis-tests.sh sets it)",
    )
}

/// One worker: `demand` calls at once on a quota of `quota` requests a
/// minute; prints how many were admitted.
async fn worker(prefix: String, quota: u64, demand: usize) {
    let redis = RedisConfig::new(shared_url())
        .prefix(prefix)
        .connect()
        .unwrap();
    let limit = ModelRateLimitLayer::new()
        .requests(quota, MINUTE)
        .max_wait(Duration::ZERO)
        .store(RedisQuotaStore::new(redis));
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::text("ok"));
    let svc = ServiceBuilder::new().layer(limit).service(model.clone());
    let calls = (0..demand).map(|i| {
        let mut svc = svc.clone();
        async move {
            svc.ready()
                .await
                .unwrap()
                .call(call(&format!("q{i}")))
                .await
        }
    });
    let mut admitted = 0;
    for outcome in join_all(calls).await {
        match outcome {
            Ok(_) => admitted += 1,
            Err(e) => assert_eq!(kind_of(e.as_ref()), ErrorKind::RateLimited, "{e}"),
        }
    }
    assert_eq!(model.requests().len(), admitted);
    println!("ADMITTED {admitted}");
}

fn spawn_worker(test: &str, prefix: &str, quota: u64, demand: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("STORES_WORKER", "1")
        .env("STORES_WORKER_PREFIX", prefix)
        .env("STORES_WORKER_QUOTA", quota.to_string())
        .env("STORES_WORKER_DEMAND", demand.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

fn admitted_by(child: Child) -> usize {
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "worker failed: {output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .find_map(|l| l.split("ADMITTED ").nth(1))
        .unwrap_or_else(|| panic!("no ADMITTED line in {stdout}"))
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Runs the worker body when this process is a worker; says whether it was.
async fn as_worker() -> bool {
    if std::env::var_os("STORES_WORKER").is_none() {
        return false;
    }
    let var = |name: &str| std::env::var(name).unwrap();
    worker(
        var("STORES_WORKER_PREFIX"),
        var("STORES_WORKER_QUOTA").parse().unwrap(),
        var("STORES_WORKER_DEMAND").parse().unwrap(),
    )
    .await;
    true
}

fn unique_prefix(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{name}-{}-{nanos}:", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server; run by scripts/peers/run-redis-tests.sh"]
async fn three_processes_share_one_quota() {
    if as_worker().await {
        return;
    }
    const QUOTA: u64 = 30;
    let prefix = unique_prefix("procs");
    // Three processes, each asking for the whole quota: 3N of demand.
    let workers: Vec<Child> = (0..3)
        .map(|_| {
            spawn_worker(
                "three_processes_share_one_quota",
                &prefix,
                QUOTA,
                QUOTA as usize,
            )
        })
        .collect();
    let per_worker: Vec<usize> = workers.into_iter().map(admitted_by).collect();
    let total: usize = per_worker.iter().sum();
    println!("admitted per worker {per_worker:?}, total {total} of quota {QUOTA}");
    // The minute's burst is N; while the workers run (well under the 2 s one
    // more request takes to come back) at most one more refills.
    assert!(
        (QUOTA as usize..=QUOTA as usize + 1).contains(&total),
        "{per_worker:?}"
    );
}

/// A redis-server of the test's own, with an append-only file so what was
/// written survives a restart.
struct OwnServer {
    port: u16,
    dir: std::path::PathBuf,
    child: Option<Child>,
}

impl OwnServer {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(unique_prefix("redis-restart").trim_end_matches(':'));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = Self {
            port,
            dir,
            child: None,
        };
        server.up();
        server
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn up(&mut self) {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--dir", self.dir.to_str().unwrap(), "--save", ""])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (scripts/peers/run-redis-tests.sh installs it)");
        self.child = Some(child);
        // Wait for the process to listen: a real process, a real clock.
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server did not listen on {}", self.port);
    }

    fn down(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.down();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
#[ignore = "needs redis-server; run by scripts/peers/run-redis-tests.sh"]
async fn stores_fail_as_they_say_and_recover_after_a_restart() {
    let mut server = OwnServer::start();
    let redis = RedisConfig::new(server.url())
        .response_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .reconnect_retries(1)
        .connect()
        .unwrap();
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::text("ok"));
    let stack = |policy: FailPolicy| {
        ServiceBuilder::new()
            .layer(CacheLayer::new().store(RedisCacheStore::new(redis.clone())))
            .layer(
                ModelRateLimitLayer::new()
                    .requests(3, MINUTE)
                    .max_wait(Duration::ZERO)
                    .store(RedisQuotaStore::new(redis.clone()))
                    .on_store_error(policy),
            )
            .service(model.clone())
    };
    let mut closed = stack(FailPolicy::Closed);
    let mut open = stack(FailPolicy::Open);

    closed.ready().await.unwrap().call(call("a")).await.unwrap();
    closed.ready().await.unwrap().call(call("a")).await.unwrap(); // a hit
    closed.ready().await.unwrap().call(call("b")).await.unwrap();
    assert_eq!(model.requests().len(), 2);

    server.down();
    // The cache fails open (a miss), the quota closed: UNAVAILABLE, and the
    // model is not called.
    let err = closed
        .ready()
        .await
        .unwrap()
        .call(call("a"))
        .await
        .unwrap_err();
    assert_eq!(kind_of(err.as_ref()), ErrorKind::Unavailable, "{err}");
    assert_eq!(model.requests().len(), 2);
    // Told to fail open, the quota lets the call through.
    open.ready()
        .await
        .unwrap()
        .call(call("down"))
        .await
        .unwrap();
    assert_eq!(model.requests().len(), 3);

    server.up();
    // The manager reconnects on its own: the first calls after the restart
    // may still find the old connection broken.
    let mut recovered = false;
    for _ in 0..50 {
        match closed.ready().await.unwrap().call(call("a")).await {
            Ok(_) => {
                recovered = true;
                break;
            }
            Err(e) => assert_eq!(kind_of(e.as_ref()), ErrorKind::Unavailable, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "the stores never came back");
    // Nothing written before the restart was lost: "a" is still a hit…
    assert_eq!(model.requests().len(), 3);
    // …and two of the minute's three requests are still spent: one more
    // fits, the next is refused.
    closed.ready().await.unwrap().call(call("c")).await.unwrap();
    let err = closed
        .ready()
        .await
        .unwrap()
        .call(call("d"))
        .await
        .unwrap_err();
    assert_eq!(kind_of(err.as_ref()), ErrorKind::RateLimited, "{err}");
    assert_eq!(model.requests().len(), 4);
}
