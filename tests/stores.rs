//! The stores' suite (`tests/stores_suite`) on every backend: the in-memory
//! stores on tokio's paused clock, and the Redis stores on the server named
//! by `TOWER_AGENT_REDIS_URL` (started by `scripts/peers/run-redis-tests.sh`).

mod stores_suite;

macro_rules! suite {
    ($name:ident, #[$test:meta] $(#[$extra:meta])*, cache: $cache:expr, quota: $quota:expr,
     budget: $budget:expr, checkpoint: $checkpoint:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            macro_rules! case {
                ($case:ident, $store:expr) => {
                    #[$test]
                    $(#[$extra])*
                    async fn $case() {
                        stores_suite::$case($store).await;
                    }
                };
            }

            case!(cache_round_trip, $cache);
            case!(cache_zero_ttl_stores_nothing, $cache);
            case!(cache_layer_hit_counts_no_usage, $cache);
            case!(quota_burst_then_wait, $quota);
            case!(quota_both_buckets_or_neither, $quota);
            case!(quota_estimate_clamped_to_limit, $quota);
            case!(quota_settle_refunds, $quota);
            case!(quota_settle_charges, $quota);
            case!(layer_refuses_past_max_wait, $quota);
            case!(layer_settles_real_usage, $quota);
            case!(budget_reserves_on_every_line_or_none, $budget);
            case!(budget_concurrent_reservations_never_overspend, $budget);
            case!(checkpoint_put_get_take, $checkpoint);
            case!(checkpoint_stale_version_conflicts, $checkpoint);
            case!(checkpoint_two_resumers_one_wins, $checkpoint);
        }
    };
}

suite!(
    memory,
    #[tokio::test(start_paused = true)],
    cache: tower_agent::layers::cache::MemoryStore::new(100),
    quota: tower_agent::stores::quota::MemoryQuotaStore::new(),
    budget: tower_agent::stores::budget::MemoryBudgetStore::new(),
    checkpoint: tower_agent::stores::InMemoryCheckpointStore::new()
);

#[cfg(feature = "redis")]
mod on_redis {
    use tower_agent::stores::redis::{RedisConfig, RedisConnection};

    /// A connection under a prefix of its own, so tests running at once
    /// never share keys.
    pub(crate) fn connection() -> RedisConnection {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let url = std::env::var("TOWER_AGENT_REDIS_URL").expect(
            "TOWER_AGENT_REDIS_URL names the Redis server (scripts/peers/run-redis-tests.sh sets it)",
        );
        let prefix = format!(
            "test-{}-{}-{}:",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        );
        RedisConfig::new(url).prefix(prefix).connect().unwrap()
    }
}

#[cfg(feature = "redis")]
suite!(
    redis,
    #[tokio::test]
    #[ignore = "needs redis-server; run by scripts/peers/run-redis-tests.sh"],
    cache: tower_agent::stores::redis::RedisCacheStore::new(crate::on_redis::connection()),
    quota: tower_agent::stores::redis::RedisQuotaStore::new(crate::on_redis::connection()),
    budget: tower_agent::stores::redis::RedisBudgetStore::new(crate::on_redis::connection()),
    checkpoint: tower_agent::stores::redis::RedisCheckpointStore::new(crate::on_redis::connection())
);

/// The Redis cache sets the time to live on the key itself.
#[cfg(feature = "redis")]
#[tokio::test]
#[ignore = "needs redis-server; run by scripts/peers/run-redis-tests.sh"]
async fn redis_cache_entries_carry_their_ttl() {
    use std::time::Duration;
    use tower_agent::layers::cache::{CacheKey, CacheStore};
    use tower_agent::types::{Message, ModelRequest, ModelResponse};

    let conn = on_redis::connection();
    let store = tower_agent::stores::redis::RedisCacheStore::new(conn.clone());
    let key = CacheKey::of(&ModelRequest::new("m", vec![Message::user("ttl")]));
    let response = ModelResponse::new("m", Message::assistant("x"));
    store
        .put(key, response, Duration::from_secs(30))
        .await
        .unwrap();
    let url = std::env::var("TOWER_AGENT_REDIS_URL").unwrap();
    let mut raw = ::redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let name = format!("{}cache:{}", conn.key_prefix(), key.to_hex());
    let pttl: i64 = ::redis::cmd("PTTL")
        .arg(&name)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(pttl > 25_000 && pttl <= 30_000, "{pttl}");
}

/// A settlement made before the next reservation of its key rides on it,
/// and is applied exactly once: the settling future then sends nothing.
#[cfg(feature = "redis")]
#[tokio::test]
#[ignore = "needs redis-server; run by scripts/peers/run-redis-tests.sh"]
async fn redis_settlement_rides_on_the_next_reservation() {
    use std::time::Duration;
    use tower_agent::stores::quota::{Limits, QuotaStore, Reservation};

    let store = tower_agent::stores::redis::RedisQuotaStore::new(on_redis::connection());
    let limits = Limits::new().tokens(100, Duration::from_secs(60));
    let first = store.reserve("fold", limits, 1, 100).await.unwrap();
    assert_eq!(first, Reservation::Admitted { tokens: 100 });
    // Used 20 of the 100 reserved; the settling future is not run yet.
    let settling = store.settle("fold", limits, 100, 20);
    // The next reservation carries the refund: 80 came back.
    let second = store.reserve("fold", limits, 1, 79).await.unwrap();
    assert_eq!(second, Reservation::Admitted { tokens: 79 });
    // The settling future finds the refund taken, and refunds nothing twice:
    // 99 of 100 are in use, so 2 more wait.
    settling.await.unwrap();
    assert!(matches!(
        store.reserve("fold", limits, 1, 2).await.unwrap(),
        Reservation::Wait(_)
    ));
}

/// Behind a store, the calls of one process still wait in arrival order,
/// and a call that waited reports it.
#[tokio::test(start_paused = true)]
async fn store_backed_calls_wait_in_arrival_order() {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use tower::{Service, ServiceBuilder, ServiceExt};
    use tower_agent::event::{AgentEvent, CollectingSink};
    use tower_agent::layers::rate_limit::ModelRateLimitLayer;
    use tower_agent::stores::quota::MemoryQuotaStore;
    use tower_agent::types::{Message, ModelRequest};
    use tower_agent::{ModelCall, RunContext, ScriptedModel, ScriptedTurn};

    let limit = ModelRateLimitLayer::new()
        .requests(1, Duration::from_secs(1))
        .max_wait(Duration::from_secs(10))
        .store(MemoryQuotaStore::new());
    let order = Arc::new(Mutex::new(Vec::new()));
    let seen = order.clone();
    let model = ScriptedModel::from_fn(move |request: &ModelRequest| {
        let text: String = request
            .messages
            .last()
            .map(|m| m.text().into_owned())
            .unwrap_or_default();
        seen.lock()
            .unwrap()
            .push((text, tokio::time::Instant::now()));
        ScriptedTurn::text("ok")
    });
    let svc = ServiceBuilder::new().layer(limit).service(model);
    let events = CollectingSink::new();
    let start = tokio::time::Instant::now();
    let calls = (0..4).map(|i| {
        let mut svc = svc.clone();
        let ctx = RunContext::builder().events(events.clone()).build();
        let request = ModelRequest::new("m", vec![Message::user(format!("q{i}"))]);
        async move {
            svc.ready()
                .await
                .unwrap()
                .call(ModelCall::new(request, ctx))
                .await
        }
    });
    for outcome in futures::future::join_all(calls).await {
        outcome.unwrap();
    }
    let order = order.lock().unwrap();
    let texts: Vec<_> = order.iter().map(|(t, _)| t.clone()).collect();
    assert_eq!(texts, ["q0", "q1", "q2", "q3"]);
    for (i, (_, at)) in order.iter().enumerate() {
        assert_eq!(at.duration_since(start).as_secs(), i as u64);
    }
    let waits = events
        .events()
        .iter()
        .filter(|e| matches!(e, AgentEvent::RateLimitWait { .. }))
        .count();
    assert_eq!(waits, 3);
}
