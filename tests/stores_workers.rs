//! The Redis stores across processes and across a server restart.
//!
//! - Several worker processes (this test binary, re-invoked with
//!   `STORES_WORKER` set) share one quota on the server named by
//!   `TOWER_AGENT_REDIS_URL`: together they are admitted no more than it.
//! - Three processes on one budget never spend more than it together, and
//!   of three processes resuming one paused run, exactly one does.
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
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::layers::cache::CacheLayer;
use tower_agent::layers::rate_limit::ModelRateLimitLayer;
use tower_agent::stores::budget::{BudgetLine, BudgetStore, Spend};
use tower_agent::stores::redis::{
    RedisBudgetStore, RedisCacheStore, RedisCheckpointStore, RedisConfig, RedisQuotaStore,
};
use tower_agent::stores::{CheckpointError, CheckpointStore, FailPolicy};
use tower_agent::types::{Checkpoint, Counters, Message, ModelRequest, Usage};
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

fn spawn_worker(role: &str, test: &str, prefix: &str, quota: u64, demand: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("STORES_WORKER", role)
        .env("STORES_WORKER_PREFIX", prefix)
        .env("STORES_WORKER_QUOTA", quota.to_string())
        .env("STORES_WORKER_DEMAND", demand.to_string())
        .env("STORES_WORKER_START_AT", start_at().to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Half a second from now, in Unix milliseconds: the workers' common start.
/// Spawned within it, they start together.
fn start_at() -> u128 {
    use std::sync::OnceLock;
    static AT: OnceLock<u128> = OnceLock::new();
    *AT.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            + 500
    })
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

/// One worker on a budget of one dollar: `demand` calls of 0.10 at once,
/// each reserved then settled at what it cost; prints how many went.
async fn budget_worker(prefix: String, demand: usize) {
    let redis = RedisConfig::new(shared_url())
        .prefix(prefix)
        .connect()
        .unwrap();
    let store = RedisBudgetStore::new(redis);
    let line = BudgetLine::new("daily", "tenant:shared")
        .window(Duration::from_secs(86_400))
        .max_cost("1.00".parse().unwrap());
    let tries = (0..demand).map(|_| {
        let store = store.clone();
        let lines = [line.clone()];
        async move {
            let dime = Spend::cost("0.10".parse().unwrap());
            match store.reserve(&lines, dime).await {
                Ok(held) => {
                    store.settle(held, dime).await.unwrap();
                    1
                }
                Err(e) => {
                    assert!(e.to_string().contains("exceeded"), "{e}");
                    0
                }
            }
        }
    });
    let admitted: usize = join_all(tries).await.into_iter().sum();
    println!("ADMITTED {admitted}");
}

/// One worker that resumes the paused run `run-x` if it wins the take;
/// prints 1 if it did, 0 if another worker did.
async fn resume_worker(prefix: String) {
    let redis = RedisConfig::new(shared_url())
        .prefix(prefix)
        .connect()
        .unwrap();
    let store = RedisCheckpointStore::new(redis);
    let Some(stored) = store.get("run-x").await.unwrap() else {
        println!("ADMITTED 0");
        return;
    };
    match store.take("run-x", stored.version).await {
        Ok(checkpoint) => {
            assert_eq!(checkpoint.run_id, "run-x");
            println!("ADMITTED 1");
        }
        Err(CheckpointError::NotFound { .. } | CheckpointError::Conflict { .. }) => {
            println!("ADMITTED 0");
        }
        Err(e) => panic!("{e}"),
    }
}

/// Runs the worker body when this process is a worker; says whether it was.
async fn as_worker() -> bool {
    let Ok(role) = std::env::var("STORES_WORKER") else {
        return false;
    };
    let var = |name: &str| std::env::var(name).unwrap();
    let prefix = var("STORES_WORKER_PREFIX");
    let demand = var("STORES_WORKER_DEMAND").parse().unwrap();
    // Every worker starts at the same wall-clock moment, so their calls
    // race on the server.
    let start_at: u128 = var("STORES_WORKER_START_AT").parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    if let Some(ahead) = start_at.checked_sub(now) {
        tokio::time::sleep(Duration::from_millis(ahead as u64)).await;
    }
    match role.as_str() {
        "quota" => worker(prefix, var("STORES_WORKER_QUOTA").parse().unwrap(), demand).await,
        "budget" => budget_worker(prefix, demand).await,
        "resume" => resume_worker(prefix).await,
        other => panic!("no worker role `{other}`"),
    }
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
                "quota",
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server; run by scripts/peers/run-redis-tests.sh"]
async fn three_processes_never_overspend_one_budget() {
    if as_worker().await {
        return;
    }
    let prefix = unique_prefix("budget");
    // A dollar's budget, three processes each trying 10 dimes at once.
    let workers: Vec<Child> = (0..3)
        .map(|_| {
            spawn_worker(
                "budget",
                "three_processes_never_overspend_one_budget",
                &prefix,
                0,
                10,
            )
        })
        .collect();
    let per_worker: Vec<usize> = workers.into_iter().map(admitted_by).collect();
    let total: usize = per_worker.iter().sum();
    println!("budget: admitted per worker {per_worker:?}, total {total} dimes of 10");
    assert_eq!(total, 10, "{per_worker:?}");
    let redis = RedisConfig::new(shared_url())
        .prefix(prefix)
        .connect()
        .unwrap();
    let line = BudgetLine::new("daily", "tenant:shared")
        .window(Duration::from_secs(86_400))
        .max_cost("1.00".parse().unwrap());
    let state = RedisBudgetStore::new(redis).state(&line).await.unwrap();
    assert_eq!(state.spent.cost, "1.00".parse().unwrap());
    assert!(state.reserved.cost.amount().is_zero());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server; run by scripts/peers/run-redis-tests.sh"]
async fn a_run_paused_here_is_resumed_by_exactly_one_other_process() {
    if as_worker().await {
        return;
    }
    let prefix = unique_prefix("resume");
    let redis = RedisConfig::new(shared_url())
        .prefix(prefix.clone())
        .connect()
        .unwrap();
    let store = RedisCheckpointStore::new(redis);
    let checkpoint = Checkpoint {
        agent: "billing".into(),
        run_id: "run-x".into(),
        thread_id: None,
        messages: vec![Message::user("refund order 42")],
        completed: vec![],
        pending: vec![],
        iteration: 1,
        usage: Usage::default(),
        usage_total: Usage::default(),
        counters: Counters::default(),
        output_attempts: 0,
        handoff: None,
        approvals: Vec::new(),
    };
    store.put(checkpoint).await.unwrap();
    let workers: Vec<Child> = (0..3)
        .map(|_| {
            spawn_worker(
                "resume",
                "a_run_paused_here_is_resumed_by_exactly_one_other_process",
                &prefix,
                0,
                1,
            )
        })
        .collect();
    let per_worker: Vec<usize> = workers.into_iter().map(admitted_by).collect();
    assert_eq!(per_worker.iter().sum::<usize>(), 1, "{per_worker:?}");
    assert!(store.get("run-x").await.unwrap().is_none());
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
    // model is not called. Both failures are in the run's events.
    let sink = CollectingSink::new();
    let watched = ModelCall::new(
        ModelRequest::new("m", vec![Message::user("a")]),
        RunContext::builder().events(sink.clone()).build(),
    );
    let err = closed
        .ready()
        .await
        .unwrap()
        .call(watched)
        .await
        .unwrap_err();
    assert_eq!(kind_of(err.as_ref()), ErrorKind::Unavailable, "{err}");
    assert_eq!(model.requests().len(), 2);
    let failures: Vec<_> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::StoreFailed {
                store,
                operation,
                failed_open,
                ..
            } => Some((store, operation, failed_open)),
            _ => None,
        })
        .collect();
    assert_eq!(
        failures,
        [("cache", "get", true), ("quota", "reserve", false)]
    );
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
