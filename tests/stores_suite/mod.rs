//! One suite for every backend of the stores: each function takes the
//! store under test; `tests/stores.rs` runs it on the in-memory stores (on a
//! paused clock) and on Redis.

#![allow(dead_code)]

use std::time::Duration;

use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent::error::{kind_of, retry_after};
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::layers::cache::{CacheKey, CacheLayer, CacheStore};
use tower_agent::layers::rate_limit::ModelRateLimitLayer;
use tower_agent::stores::quota::{Limits, QuotaStore, Reservation};
use tower_agent::types::{Message, ModelRequest, ModelResponse, Usage};
use tower_agent::{ErrorKind, ModelCall, RunContext, ScriptedModel, ScriptedTurn};

pub(crate) const MINUTE: Duration = Duration::from_secs(60);

fn request(text: &str) -> ModelRequest {
    ModelRequest::new("m", vec![Message::user(text)])
}

fn call(text: &str) -> ModelCall {
    ModelCall::new(request(text), RunContext::new())
}

/// A wait the store names is the GCRA's, give or take the time the test
/// itself took (a real server's clock moves on).
fn about(wait: Duration, expected: Duration) -> bool {
    wait <= expected && wait + Duration::from_secs(2) >= expected
}

// ---- cache ----

pub(crate) async fn cache_round_trip(store: impl CacheStore) {
    let key = CacheKey::of(&request("capital of France?"));
    let other = CacheKey::of(&request("capital of Spain?"));
    let response = ModelResponse::new("m", Message::assistant("Paris")).usage(Usage::new(12, 3));
    assert_eq!(store.get(key).await.unwrap(), None);
    store.put(key, response.clone(), MINUTE).await.unwrap();
    assert_eq!(store.get(key).await.unwrap(), Some(response.clone()));
    assert_eq!(store.get(other).await.unwrap(), None);
    // A put replaces.
    let newer = ModelResponse::new("m", Message::assistant("Paris, France"));
    store.put(key, newer.clone(), MINUTE).await.unwrap();
    assert_eq!(store.get(key).await.unwrap(), Some(newer));
}

pub(crate) async fn cache_zero_ttl_stores_nothing(store: impl CacheStore) {
    let key = CacheKey::of(&request("zero"));
    let response = ModelResponse::new("m", Message::assistant("x"));
    store.put(key, response, Duration::ZERO).await.unwrap();
    assert_eq!(store.get(key).await.unwrap(), None);
}

pub(crate) async fn cache_layer_hit_counts_no_usage(store: impl CacheStore) {
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::text("Paris.").usage(Usage::new(10, 2)));
    let mut cached = ServiceBuilder::new()
        .layer(CacheLayer::new().store(store))
        .service(model.clone());
    let events = CollectingSink::new();
    let ctx = RunContext::builder().events(events.clone()).build();
    let req = request("Capital of France?");
    let first = cached
        .ready()
        .await
        .unwrap()
        .call(ModelCall::new(req.clone(), ctx.clone()))
        .await
        .unwrap();
    let second = cached
        .ready()
        .await
        .unwrap()
        .call(ModelCall::new(req, ctx.clone()))
        .await
        .unwrap();
    assert_eq!(second.message, first.message);
    assert!(!first.usage.is_zero());
    assert!(second.usage.is_zero());
    assert_eq!(ctx.usage(), first.usage);
    assert_eq!(model.requests().len(), 1);
    assert!(events
        .events()
        .iter()
        .any(|e| matches!(e, AgentEvent::CacheHit { .. })));
}

// ---- quota ----

pub(crate) async fn quota_burst_then_wait(store: impl QuotaStore) {
    let limits = Limits::new().requests(3, MINUTE);
    for _ in 0..3 {
        let r = store.reserve("burst", limits, 1, 0).await.unwrap();
        assert_eq!(r, Reservation::Admitted { tokens: 0 });
    }
    match store.reserve("burst", limits, 1, 0).await.unwrap() {
        Reservation::Wait(wait) => assert!(about(wait, Duration::from_secs(20)), "{wait:?}"),
        other => panic!("admitted past the burst: {other:?}"),
    }
    // Another key has its own quota.
    let r = store.reserve("other", limits, 1, 0).await.unwrap();
    assert_eq!(r, Reservation::Admitted { tokens: 0 });
}

pub(crate) async fn quota_both_buckets_or_neither(store: impl QuotaStore) {
    let limits = Limits::new().requests(3, MINUTE).tokens(100, MINUTE);
    let r = store.reserve("both", limits, 1, 80).await.unwrap();
    assert_eq!(r, Reservation::Admitted { tokens: 80 });
    // 50 more tokens do not fit: nothing is taken, not even the request.
    assert!(matches!(
        store.reserve("both", limits, 1, 50).await.unwrap(),
        Reservation::Wait(_)
    ));
    // So two requests (of 10 tokens each) still fit, and then the third
    // request slot is gone.
    for _ in 0..2 {
        let r = store.reserve("both", limits, 1, 10).await.unwrap();
        assert_eq!(r, Reservation::Admitted { tokens: 10 });
    }
    assert!(matches!(
        store.reserve("both", limits, 1, 0).await.unwrap(),
        Reservation::Wait(_)
    ));
}

pub(crate) async fn quota_estimate_clamped_to_limit(store: impl QuotaStore) {
    let limits = Limits::new().tokens(100, MINUTE);
    let r = store.reserve("clamp", limits, 1, 5_000).await.unwrap();
    assert_eq!(r, Reservation::Admitted { tokens: 100 });
}

pub(crate) async fn quota_settle_refunds(store: impl QuotaStore) {
    let limits = Limits::new().tokens(100, MINUTE);
    let r = store.reserve("refund", limits, 1, 100).await.unwrap();
    assert_eq!(r, Reservation::Admitted { tokens: 100 });
    store.settle("refund", limits, 100, 20).await.unwrap();
    // 80 came back.
    let r = store.reserve("refund", limits, 1, 79).await.unwrap();
    assert_eq!(r, Reservation::Admitted { tokens: 79 });
}

pub(crate) async fn quota_settle_charges(store: impl QuotaStore) {
    let limits = Limits::new().tokens(100, MINUTE);
    store.reserve("charge", limits, 1, 50).await.unwrap();
    store.settle("charge", limits, 50, 150).await.unwrap();
    // 150 used of 100 a minute: the bucket is 50 below empty, so one token
    // waits for 51 to come back (30.6 s).
    match store.reserve("charge", limits, 1, 1).await.unwrap() {
        Reservation::Wait(wait) => assert!(about(wait, Duration::from_millis(30_600)), "{wait:?}"),
        other => panic!("admitted while overdrawn: {other:?}"),
    }
}

pub(crate) async fn layer_refuses_past_max_wait(store: impl QuotaStore) {
    let limit = ModelRateLimitLayer::new()
        .requests(1, MINUTE)
        .max_wait(Duration::from_secs(5))
        .store(store);
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::text("ok"));
    let mut first = ServiceBuilder::new()
        .layer(limit.clone())
        .service(model.clone());
    let mut second = ServiceBuilder::new().layer(limit).service(model.clone());
    first.ready().await.unwrap().call(call("a")).await.unwrap();
    let err = second
        .ready()
        .await
        .unwrap()
        .call(call("b"))
        .await
        .unwrap_err();
    assert_eq!(kind_of(err.as_ref()), ErrorKind::RateLimited);
    let after = retry_after(err.as_ref()).unwrap();
    assert!(about(after, MINUTE), "{after:?}");
    assert_eq!(model.requests().len(), 1);
}

pub(crate) async fn layer_settles_real_usage(store: impl QuotaStore) {
    // Each call is estimated at 100 tokens (its max_tokens) and uses 10.
    let limit = ModelRateLimitLayer::new()
        .tokens(300, MINUTE)
        .estimate(|_| 100)
        .max_wait(Duration::ZERO)
        .store(store);
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::text("ok").usage(Usage::new(5, 5)));
    let mut svc = ServiceBuilder::new().layer(limit).service(model.clone());
    // Without settling, three calls would spend the minute; settled, ten fit.
    for i in 0..10 {
        svc.ready()
            .await
            .unwrap()
            .call(call(&format!("q{i}")))
            .await
            .unwrap_or_else(|e| panic!("call {i}: {e}"));
        // Settlement runs beside the response: let it land.
        settle_lands().await;
    }
    assert_eq!(model.requests().len(), 10);
}

/// Lets a settlement spawned beside a response send its command: once sent
/// on the store's one connection, it is ahead of the next reservation.
async fn settle_lands() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

// ---- budget ----

use tower_agent::stores::budget::{BudgetLine, BudgetStore, Spend};
use tower_agent::stores::{CheckpointError, CheckpointStore};
use tower_agent::types::{Checkpoint, Cost, Counters};

fn cost(s: &str) -> Cost {
    s.parse().unwrap()
}

pub(crate) async fn budget_reserves_on_every_line_or_none(store: impl BudgetStore) {
    let tenant = BudgetLine::new("daily", "tenant:acme").max_cost(cost("1.00"));
    let run = BudgetLine::new("run", "run:1").max_tokens(1_000);
    let lines = [tenant.clone(), run.clone()];
    let held = store
        .reserve(&lines, Spend::new(cost("0.60"), 400))
        .await
        .unwrap();
    // The tenant line has no room for 0.60 more: nothing is held on either.
    let err = store
        .reserve(&lines, Spend::new(cost("0.60"), 100))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<tower_agent::AgentError>(),
            Some(tower_agent::AgentError::BudgetExceeded(_))
        ),
        "{err}"
    );
    assert!(err.to_string().contains("tenant:acme"), "{err}");
    assert_eq!(store.state(&run).await.unwrap().reserved.tokens, 400);
    store
        .settle(held, Spend::new(cost("0.25"), 300))
        .await
        .unwrap();
    let state = store.state(&tenant).await.unwrap();
    assert_eq!(state.spent.cost, cost("0.25"));
    assert_eq!(state.reserved.cost, Cost::ZERO);
    // Now 0.75 is left.
    let held = store
        .reserve(&lines, Spend::new(cost("0.75"), 700))
        .await
        .unwrap();
    store
        .settle(held, Spend::new(cost("0.75"), 700))
        .await
        .unwrap();
    assert_eq!(store.state(&tenant).await.unwrap().spent.cost, cost("1.00"));
    assert!(store
        .reserve(&lines, Spend::cost(cost("0.01")))
        .await
        .is_err());
}

pub(crate) async fn budget_concurrent_reservations_never_overspend<B>(store: B)
where
    B: BudgetStore + Clone,
{
    let line = BudgetLine::new("daily", "tenant:busy").max_cost(cost("1.00"));
    let tries = (0..40).map(|_| {
        let store = store.clone();
        let lines = [line.clone()];
        async move {
            match store.reserve(&lines, Spend::cost(cost("0.10"))).await {
                Ok(held) => {
                    store.settle(held, Spend::cost(cost("0.10"))).await.unwrap();
                    1
                }
                Err(_) => 0,
            }
        }
    });
    let admitted: u32 = futures::future::join_all(tries).await.into_iter().sum();
    assert_eq!(admitted, 10);
    assert_eq!(store.state(&line).await.unwrap().spent.cost, cost("1.00"));
}

// ---- checkpoints ----

pub(crate) fn checkpoint(run_id: &str, iteration: u32) -> Checkpoint {
    Checkpoint {
        agent: "billing".into(),
        run_id: run_id.into(),
        thread_id: None,
        messages: vec![Message::user("refund order 42")],
        completed: vec![],
        pending: vec![],
        iteration: iteration as _,
        usage: Usage::new(10, 2),
        usage_total: Usage::new(10, 2),
        counters: Counters::default(),
        output_attempts: 0,
        handoff: None,
        approvals: Vec::new(),
    }
}

pub(crate) async fn checkpoint_put_get_take(store: impl CheckpointStore) {
    assert!(store.get("run-a").await.unwrap().is_none());
    let version = store.put(checkpoint("run-a", 1)).await.unwrap();
    let stored = store.get("run-a").await.unwrap().unwrap();
    assert_eq!(stored.version, version);
    assert_eq!(stored.checkpoint, checkpoint("run-a", 1));
    let taken = store.take("run-a", version).await.unwrap();
    assert_eq!(taken, checkpoint("run-a", 1));
    assert!(store.get("run-a").await.unwrap().is_none());
    assert!(matches!(
        store.take("run-a", version).await,
        Err(CheckpointError::NotFound { .. })
    ));
}

pub(crate) async fn checkpoint_stale_version_conflicts(store: impl CheckpointStore) {
    let first = store.put(checkpoint("run-b", 1)).await.unwrap();
    // The run paused again: a resumer holding the first version loses.
    let second = store.put(checkpoint("run-b", 2)).await.unwrap();
    assert_ne!(first, second);
    match store.take("run-b", first).await {
        Err(CheckpointError::Conflict {
            expected, found, ..
        }) => {
            assert_eq!((expected, found), (first, second));
        }
        other => panic!("a stale take went through: {other:?}"),
    }
    // Taken and paused anew, a version is never reused.
    assert_eq!(store.take("run-b", second).await.unwrap().iteration, 2);
    let third = store.put(checkpoint("run-b", 3)).await.unwrap();
    assert!(third > second);
}

pub(crate) async fn checkpoint_two_resumers_one_wins<C>(store: C)
where
    C: CheckpointStore + Clone,
{
    store.put(checkpoint("run-c", 1)).await.unwrap();
    let version = store.get("run-c").await.unwrap().unwrap().version;
    let (a, b) = tokio::join!(store.take("run-c", version), store.take("run-c", version));
    assert!(
        a.is_ok() != b.is_ok(),
        "exactly one resumer wins: {a:?} {b:?}"
    );
    let lost = if a.is_ok() { b } else { a };
    assert!(matches!(lost, Err(CheckpointError::NotFound { .. })));
}
