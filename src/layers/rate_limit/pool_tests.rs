//! The lock-free pool's edges through the layer and the limiter: a need
//! that is exactly the level, a waiter that keeps the pool closed (FIFO),
//! threads drawing at once never exceeding the limits, and sequences of
//! admissions and settlements that never admit what an exact bucket,
//! settled as each call answers, would refuse.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_test::mock;

use super::bucket::Bucket;
use super::key::{Entered, KeyShared};
use super::limiter::Limiter;
use super::limits::{Config, Limits, Rate};
use super::ticket::Settlement;
use super::{ModelRateLimitLayer, RateLimited};
use crate::types::{Message, ModelRequest, ModelResponse, Usage};
use crate::{ModelCall, RunContext, ScriptedModel, ScriptedTurn};

/// A call whose estimate is `tokens` (see [`by_max_tokens`]).
fn call(tokens: u32) -> ModelCall {
    let mut request = ModelRequest::new("m", vec![Message::user("hi")]);
    request.settings_mut().max_tokens = Some(tokens);
    ModelCall::new(request, RunContext::new())
}

/// A layer on `tokens` a minute, estimating each call at its `max_tokens`.
fn by_max_tokens(tokens: u64) -> ModelRateLimitLayer {
    ModelRateLimitLayer::new()
        .tokens(tokens, Duration::from_secs(60))
        .estimate(|r| r.settings.max_tokens.map_or(0, u64::from))
}

#[tokio::test(start_paused = true)]
async fn a_need_of_exactly_the_level_is_admitted_and_the_next_unit_is_not() {
    let mut service = by_max_tokens(1_000)
        .max_wait(Duration::ZERO)
        .layer(ScriptedModel::from_fn(|_| {
            ScriptedTurn::text("ok").usage(Usage::new(600, 400))
        }));
    let ok = service.ready().await.unwrap().call(call(1_000)).await;
    assert!(ok.is_ok(), "the whole bucket, exactly");
    // Used exactly its estimate: nothing is left for one more token.
    let err = service
        .ready()
        .await
        .unwrap()
        .call(call(1))
        .await
        .unwrap_err();
    let refused = err.downcast_ref::<RateLimited>().unwrap();
    assert_eq!(refused.retry_after(), Duration::from_millis(60));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_keeps_newcomers_behind_it_though_they_would_fit() {
    let (mut service, mut handle) = mock::spawn_layer::<ModelCall, ModelResponse, _>(
        by_max_tokens(1_000).max_wait(Duration::from_secs(60)),
    );
    // 800 of 1,000 go out at once, and use all 800.
    assert!(service.poll_ready().is_ready());
    let first = tokio::spawn(service.call(call(800)));
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_response(
        ModelResponse::new("m", Message::assistant("ok")).usage(Usage::new(700, 100)),
    );
    first.await.unwrap().unwrap();
    let start = Instant::now();
    // 800 more must wait for 600 to refill (36 s).
    assert!(service.poll_ready().is_ready());
    let big = tokio::spawn(service.call(call(800)));
    // 100 would fit in the 200 left, but queues behind the big one.
    assert!(service.poll_ready().is_ready());
    let small = tokio::spawn(service.call(call(100)));

    // The big one goes first, after 36 s; the small one once 100 more
    // refilled, 6 s later.
    let (seen, reply) = handle.next_request().await.unwrap();
    assert_eq!(seen.request.settings.max_tokens, Some(800));
    assert_eq!(start.elapsed(), Duration::from_secs(36));
    reply.send_response(
        ModelResponse::new("m", Message::assistant("ok")).usage(Usage::new(700, 100)),
    );
    let (seen, reply) = handle.next_request().await.unwrap();
    assert_eq!(seen.request.settings.max_tokens, Some(100));
    assert_eq!(start.elapsed(), Duration::from_secs(42));
    reply
        .send_response(ModelResponse::new("m", Message::assistant("ok")).usage(Usage::new(90, 10)));
    big.await.unwrap().unwrap();
    small.await.unwrap().unwrap();

    // Nobody waits any more, and the bucket is empty as of 42 s: one more
    // token is 60 ms away, pool or not.
    assert!(service.poll_ready().is_ready());
    let last = tokio::spawn(service.call(call(1)));
    let (_, reply) = handle.next_request().await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(42_060));
    reply.send_response(ModelResponse::new("m", Message::assistant("ok")));
    last.await.unwrap().unwrap();
}

/// A call needing `need` tokens admitted at once, from the pool or under
/// the key's lock; `None` when refused. Nothing waits in these tests.
fn admit_now(key: &Arc<KeyShared>, need: u64) -> Option<Settlement> {
    if let Some(drawn) = key.draw(need) {
        return Some(Settlement::drawn(key.clone(), drawn));
    }
    match key.enter_call(need, Duration::ZERO) {
        Ok(Entered::Admitted((_, grant, slot))) => Some(Settlement::new(key.clone(), grant, slot)),
        Ok(Entered::Queued(_)) => unreachable!("no waiting allowed"),
        Err(_) => None,
    }
}

#[test]
fn threads_drawing_at_once_never_exceed_the_limits() {
    // 500 requests and 100,000 tokens over a thousand days: nothing
    // refills while the threads run.
    let days = Duration::from_secs(1_000 * 86_400);
    let limits = Limits::new().requests(500, days).tokens(100_000, days);
    let limiter = Limiter::new(Config {
        default: limits,
        ..Config::default()
    });
    let key = limiter.key("k");
    let (requests, tokens) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|scope| {
        for thread in 0..8u64 {
            let (key, requests, tokens) = (&key, &requests, &tokens);
            scope.spawn(move || {
                for i in 0..200u64 {
                    let need = (thread * 7 + i) % 400;
                    let Some(settlement) = admit_now(key, need) else {
                        continue;
                    };
                    requests.fetch_add(1, Ordering::Relaxed);
                    // Every call reserved `need`; half use less, which
                    // comes back, and half use it all.
                    let used = if i % 2 == 0 { need / 2 } else { need };
                    tokens.fetch_add(used, Ordering::Relaxed);
                    let mut settlement = settlement;
                    settlement.settle(used);
                }
            });
        }
    });
    let (requests, tokens) = (requests.into_inner(), tokens.into_inner());
    assert!(requests <= 500, "{requests} requests admitted");
    assert!(tokens <= 100_000, "{tokens} tokens used");
    // 1,600 calls asked for 500 requests' worth: the pool and the lock
    // together let every one of them through, no request was lost.
    assert_eq!(requests, 500);
}

/// One step of a sequence run against the limiter.
#[derive(Debug, Clone)]
enum Step {
    /// A call needing this many tokens arrives.
    Call(u64),
    /// The `n`-th call still out (modulo how many are) answers, having
    /// used this share (in thousandths) of its estimate (`None`: it
    /// failed, keeping its reservation).
    Answer(usize, Option<u64>),
    /// The clock moves on this many milliseconds.
    Wait(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u64..700).prop_map(Step::Call),
        3 => (any::<usize>(), proptest::option::weighted(0.8, 0u64..=1_000))
            .prop_map(|(n, used)| Step::Answer(n, used)),
        2 => (0u64..3_000).prop_map(Step::Wait),
    ]
}

/// A call admitted: when, and what it is charged in the end (its estimate
/// until it answers).
struct Admitted {
    at: u64,
    charged: u64,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever the order of calls, answers and waits, and whichever of
    /// the lock-free pool, the posting slots or the lock admits and
    /// settles each call, the calls admitted, each charged what it used
    /// at the moment it was admitted (what exact estimates would have
    /// reserved), fit the limits.
    #[test]
    fn the_pool_never_admits_beyond_what_exact_estimates_would(
        steps in proptest::collection::vec(step(), 1..150)
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let admitted = rt.block_on(async {
            // 20 requests and 2,000 tokens per 10 s.
            let limiter = Limiter::new(Config {
                default: Limits::new()
                    .requests(20, Duration::from_secs(10))
                    .tokens(2_000, Duration::from_secs(10)),
                ..Config::default()
            });
            let start = Instant::now();
            let key = limiter.key("k");
            let mut admitted: Vec<Admitted> = Vec::new();
            // Calls out: their settlement, estimate and index in `admitted`.
            let mut out: Vec<(Settlement, u64, usize)> = Vec::new();
            for step in steps {
                match step {
                    Step::Call(need) => {
                        let Some(settlement) = admit_now(&key, need) else {
                            continue;
                        };
                        let at = u64::try_from(start.elapsed().as_nanos()).unwrap();
                        out.push((settlement, need, admitted.len()));
                        admitted.push(Admitted { at, charged: need });
                    }
                    Step::Answer(_, _) if out.is_empty() => {}
                    Step::Answer(n, share) => {
                        let (mut settlement, estimate, index) = out.swap_remove(n % out.len());
                        if let Some(share) = share {
                            let used = estimate * share / 1_000;
                            settlement.settle(used);
                            admitted[index].charged = used;
                        }
                    }
                    Step::Wait(ms) => tokio::time::advance(Duration::from_millis(ms)).await,
                }
            }
            admitted
        });
        let mut requests = Bucket::new(Rate::new(20, Duration::from_secs(10)), 0);
        let mut tokens = Bucket::new(Rate::new(2_000, Duration::from_secs(10)), 0);
        for (i, call) in admitted.iter().enumerate() {
            requests.refill(call.at);
            tokens.refill(call.at);
            prop_assert!(requests.holds(1), "call {i}: a request beyond the limit");
            prop_assert!(tokens.holds(call.charged), "call {i}: {} tokens beyond the limit", call.charged);
            requests.take(1);
            tokens.take(call.charged);
        }
    }
}
