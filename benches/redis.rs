//! Microseconds per model call through a Redis-backed rate limit and cache,
//! beside the in-memory ones and the bare service, in the same groups; and
//! the round trips each call makes (counted with `INFO commandstats`), so
//! the fast path's cost in round trips is read from the same run.
//!
//! The server is the one `TOWER_AGENT_REDIS_URL` names, or a `redis-server`
//! from `PATH` that the bench starts on a free port of 127.0.0.1 and stops
//! (`scripts/peers/run-redis-tests.sh` installs it). With neither, the bench
//! fails and says so.
//!
//! ```sh
//! cargo bench --features redis --bench redis
//! ```

use std::future::{ready, Ready};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use tower::{Layer, Service, ServiceExt};
use tower_agent::layers::cache::CacheLayer;
use tower_agent::layers::rate_limit::ModelRateLimitLayer;
use tower_agent::stores::redis::{RedisCacheStore, RedisConfig, RedisConnection, RedisQuotaStore};
use tower_agent::types::{History, Message, ModelRequest, ModelResponse, Usage};
use tower_agent::{BoxError, ModelCall, RunContext};

/// A model that answers at once, with the usage the limiter settles.
#[derive(Clone)]
struct Noop(Arc<ModelResponse>);

impl Noop {
    fn new() -> Self {
        let mut response = ModelResponse::new("bench-model", Message::assistant("ok"));
        response.usage = Usage::new(12, 4);
        Self(Arc::new(response))
    }
}

impl Service<ModelCall> for Noop {
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = Ready<Result<ModelResponse, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _call: ModelCall) -> Self::Future {
        let mut response = ModelResponse::clone(&self.0);
        response.usage_recorded = true;
        ready(Ok(response))
    }
}

/// The Redis server the bench talks to; one it started is stopped on drop.
struct Server {
    url: String,
    child: Option<Child>,
    dir: Option<std::path::PathBuf>,
}

impl Server {
    fn get() -> Self {
        if let Ok(url) = std::env::var("TOWER_AGENT_REDIS_URL") {
            return Self {
                url,
                child: None,
                dir: None,
            };
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = std::env::temp_dir().join(format!("tower-agent-bench-redis-{port}"));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--dir", dir.to_str().expect("a UTF-8 temp dir")])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect(
                "the Redis bench needs a server: set TOWER_AGENT_REDIS_URL, or put redis-server \
                 on PATH (scripts/peers/run-redis-tests.sh installs it)",
            );
        let server = Self {
            url: format!("redis://127.0.0.1:{port}/"),
            child: Some(child),
            dir: Some(dir),
        };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server did not listen on 127.0.0.1:{port}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Calls of `commands` the server has answered so far (`INFO
/// commandstats`). A script's own `redis.call`s count under their own names,
/// so naming the commands a store sends counts its round trips.
fn calls_of(url: &str, commands: &[&str]) -> u64 {
    let client = redis::Client::open(url).expect("a Redis URL");
    let mut conn = client.get_connection().expect("a connection to Redis");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn)
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.strip_prefix("calls=")?.split(',').next()?;
            commands
                .contains(&name)
                .then(|| calls.parse::<u64>().ok())
                .flatten()
        })
        .sum()
}

fn call(text: &str) -> ModelCall {
    let history = History::from(vec![Message::user(text)]);
    history.digest();
    ModelCall::new(ModelRequest::new("bench-model", history), RunContext::new())
}

/// Runs `calls` calls through `svc` and answers the round trips per call:
/// the calls of `commands` (what the store sends) the server answered.
fn round_trips<S>(
    rt: &tokio::runtime::Runtime,
    url: &str,
    svc: &S,
    commands: &[&str],
    calls: u64,
) -> f64
where
    S: Service<ModelCall, Response = ModelResponse> + Clone,
    S::Error: std::fmt::Debug,
{
    let before = calls_of(url, commands);
    rt.block_on(async {
        for i in 0..calls {
            svc.clone()
                .oneshot(call(&format!("count {i}")))
                .await
                .unwrap();
        }
        // Let settlements spawned by the last call finish.
        tokio::task::yield_now().await;
    });
    (calls_of(url, commands) - before) as f64 / calls as f64
}

fn limiter() -> ModelRateLimitLayer {
    ModelRateLimitLayer::new()
        .requests(u64::MAX / 4, Duration::from_secs(1))
        .tokens(u64::MAX / 4, Duration::from_secs(1))
}

fn redis_benches(c: &mut Criterion) {
    let server = Server::get();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let connect = || -> RedisConnection {
        let _guard = rt.enter();
        RedisConfig::new(server.url.clone())
            .prefix(format!("bench-{}:", std::process::id()))
            .connect()
            .expect("a Redis connection")
    };
    let model = Noop::new();

    // The rate limit: ample capacity, so every call is admitted at once.
    let memory_limit = limiter().layer(model.clone());
    let redis_limit = limiter()
        .store(RedisQuotaStore::new(connect()))
        .layer(model.clone());
    let scripts = ["evalsha", "eval", "script|load"];
    let per_call = round_trips(&rt, &server.url, &redis_limit, &scripts, 200);
    println!("redis rate limit: {per_call:.2} round trips per call (reserve with the settlement folded in)");

    let mut group = c.benchmark_group("redis_rate_limit");
    let fixed = call("Where is order A-1042?");
    group.bench_function("bare", |b| {
        b.to_async(&rt)
            .iter(|| model.clone().oneshot(fixed.clone()))
    });
    group.bench_function("in_memory", |b| {
        b.to_async(&rt)
            .iter(|| memory_limit.clone().oneshot(fixed.clone()))
    });
    group.bench_function("redis", |b| {
        b.to_async(&rt)
            .iter(|| redis_limit.clone().oneshot(fixed.clone()))
    });
    group.finish();

    // The cache: a hit on a warm key, and a miss on a fresh one.
    let memory_cache = CacheLayer::new().layer(model.clone());
    let redis_cache = CacheLayer::new()
        .store(RedisCacheStore::new(connect()))
        .layer(model.clone());
    let per_miss = round_trips(&rt, &server.url, &redis_cache, &["get", "psetex"], 200);
    println!("redis cache: {per_miss:.2} round trips per miss (a get, then the answer stored)");
    rt.block_on(async {
        memory_cache.clone().oneshot(fixed.clone()).await.unwrap();
        redis_cache.clone().oneshot(fixed.clone()).await.unwrap();
    });

    let mut group = c.benchmark_group("redis_cache");
    group.bench_function("bare", |b| {
        b.to_async(&rt)
            .iter(|| model.clone().oneshot(fixed.clone()))
    });
    group.bench_function("hit_in_memory", |b| {
        b.to_async(&rt)
            .iter(|| memory_cache.clone().oneshot(fixed.clone()))
    });
    group.bench_function("hit_redis", |b| {
        b.to_async(&rt)
            .iter(|| redis_cache.clone().oneshot(fixed.clone()))
    });
    let fresh = AtomicU64::new(0);
    group.bench_function("miss_in_memory", |b| {
        b.to_async(&rt).iter_batched(
            || {
                call(&format!(
                    "memory miss {}",
                    fresh.fetch_add(1, Ordering::Relaxed)
                ))
            },
            |call| memory_cache.clone().oneshot(call),
            criterion::BatchSize::SmallInput,
        )
    });
    group.bench_function("miss_redis", |b| {
        b.to_async(&rt).iter_batched(
            || {
                call(&format!(
                    "redis miss {}",
                    fresh.fetch_add(1, Ordering::Relaxed)
                ))
            },
            |call| redis_cache.clone().oneshot(call),
            criterion::BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, redis_benches);
criterion_main!(benches);
