//! The budget layer on single calls: reserve, refuse, settle, release.

use std::time::Duration;

use tower::{Layer, Service, ServiceExt};

use super::*;
use crate::error::{AgentError, BudgetExceeded, ErrorKind};
use crate::stores::budget::Reservation;
use crate::types::{Amount, Decimal, Message, Price, Usage};
use crate::{ScriptedModel, ScriptedTurn};

fn cost(s: &str) -> Cost {
    s.parse().unwrap()
}

/// 1 per million input tokens, 2 per million output tokens.
fn prices() -> PriceTable {
    PriceTable::new().price("m", Price::new(Decimal::ONE, Decimal::TWO))
}

/// A call of model `model` with 400 bytes of input (100 estimated tokens)
/// and `max_tokens` of 50.
fn call(ctx: &RunContext, model: &str) -> ModelCall {
    let mut request = ModelRequest::new(model, vec![Message::user("x".repeat(400))]);
    request.settings_mut().max_tokens = Some(50);
    ModelCall::new(request, ctx.clone())
}

fn answering(usage: Usage) -> ScriptedModel {
    ScriptedModel::from_fn(move |_| ScriptedTurn::text("ok").usage(usage))
}

fn exceeded(err: BoxError) -> BudgetExceeded {
    match AgentError::classify(err) {
        AgentError::BudgetExceeded(e) => e,
        other => panic!("expected BUDGET_EXCEEDED, got {other:?}"),
    }
}

#[test]
fn the_estimate_is_four_bytes_a_token_rounded_up() {
    let request = ModelRequest::new("m", vec![Message::user("abcde")]);
    assert_eq!(estimate(&request), 2);
    assert_eq!(estimate(&ModelRequest::new("m", Vec::new())), 0);
}

#[tokio::test(start_paused = true)]
async fn a_call_that_would_pass_the_limit_is_refused_before_it_goes_out() {
    let model = answering(Usage::new(100, 50));
    // The estimate is 100 + 50 = 150 tokens; the run may spend 149.
    let layer = BudgetLayer::new(prices()).per_run(Budget::new("run").max_tokens(149));
    let ctx = RunContext::new();
    let err = layer
        .layer(model.clone())
        .oneshot(call(&ctx, "m"))
        .await
        .unwrap_err();
    assert!(model.requests().is_empty(), "the model was not called");
    let e = exceeded(err);
    assert_eq!(e.budget, "run");
    assert_eq!(e.key, format!("run:{}", ctx.run_id()));
    assert_eq!(e.limit, Amount::Tokens(149));
    assert_eq!(e.spent, Amount::Tokens(0));
    assert_eq!(e.requested, Amount::Tokens(150));
    let err = AgentError::BudgetExceeded(e);
    assert_eq!(err.code(), "BUDGET_EXCEEDED");
    assert_eq!(err.kind(), ErrorKind::Tripwire);
}

#[tokio::test(start_paused = true)]
async fn settles_with_the_real_usage_and_prices_the_ledger() {
    let store = MemoryBudgetStore::new();
    let tenant = Budget::new("tenant").max_cost(cost("1"));
    let layer = BudgetLayer::new(prices())
        .store(store.clone())
        .per_tenant(tenant.clone());
    let ctx = RunContext::builder().state(Tenant::new("acme")).build();
    let usage = Usage::new(30, 20); // 30 × 1 + 20 × 2 per million
    layer
        .layer(answering(usage))
        .oneshot(call(&ctx, "m"))
        .await
        .unwrap();
    let line = store.state_now(&tenant.line("tenant:acme"));
    assert_eq!(line.spent, Spend::new(cost("0.00007"), 50));
    assert_eq!(line.reserved, Spend::ZERO);
    assert_eq!(ctx.cost(), Some(cost("0.00007")));
    assert_eq!(ctx.usage_entries()[0].cost, Some(cost("0.00007")));
}

#[tokio::test(start_paused = true)]
async fn a_call_in_flight_holds_its_estimate() {
    let store = MemoryBudgetStore::new();
    let tenant = Budget::new("tenant").max_tokens(1_000);
    let layer = BudgetLayer::new(prices())
        .store(store.clone())
        .per_tenant(tenant.clone());
    let slow = ScriptedModel::from_fn(|_| {
        ScriptedTurn::text("ok")
            .usage(Usage::new(10, 10))
            .delay(Duration::from_secs(1))
    });
    let ctx = RunContext::builder().state(Tenant::new("acme")).build();
    let mut svc = layer.layer(slow);
    let pending = tokio::spawn(svc.ready().await.unwrap().call(call(&ctx, "m")));
    tokio::task::yield_now().await;
    let line = tenant.line("tenant:acme");
    assert_eq!(
        store.state_now(&line).reserved,
        Spend::new(cost("0.0002"), 150)
    );
    pending.await.unwrap().unwrap();
    assert_eq!(
        store.state_now(&line),
        crate::stores::budget::LineState {
            spent: Spend::new(cost("0.00003"), 20),
            reserved: Spend::ZERO,
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_dropped_call_gives_its_hold_back() {
    let store = MemoryBudgetStore::new();
    let tenant = Budget::new("tenant").max_tokens(1_000);
    let layer = BudgetLayer::new(prices())
        .store(store.clone())
        .per_tenant(tenant.clone());
    let hanging =
        ScriptedModel::from_fn(|_| ScriptedTurn::text("late").delay(Duration::from_secs(3600)));
    let ctx = RunContext::builder().state(Tenant::new("acme")).build();
    let mut svc = layer.layer(hanging);
    let fut = svc.ready().await.unwrap().call(call(&ctx, "m"));
    let result = tokio::time::timeout(Duration::from_secs(1), fut).await;
    assert!(result.is_err());
    assert_eq!(
        store.state_now(&tenant.line("tenant:acme")).reserved,
        Spend::ZERO
    );
}

#[tokio::test(start_paused = true)]
async fn unknown_models_are_refused_or_counted_in_tokens() {
    let ctx = RunContext::new();
    let model = answering(Usage::new(10, 10));
    let err = BudgetLayer::new(prices())
        .layer(model.clone())
        .oneshot(call(&ctx, "other"))
        .await
        .unwrap_err();
    assert_eq!(AgentError::classify(err).code(), "INVALID_CONFIG");
    assert!(model.requests().is_empty());

    let layer = BudgetLayer::new(prices())
        .unknown_models(UnknownModel::CountTokens)
        .per_run(Budget::new("run").max_tokens(170));
    let mut svc = layer.layer(model);
    svc.ready()
        .await
        .unwrap()
        .call(call(&ctx, "other"))
        .await
        .unwrap();
    // 20 spent + 150 estimated = 170 fits; the third call would not.
    svc.ready()
        .await
        .unwrap()
        .call(call(&ctx, "other"))
        .await
        .unwrap();
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(call(&ctx, "other"))
        .await
        .unwrap_err();
    assert_eq!(exceeded(err).spent, Amount::Tokens(40));
    assert_eq!(ctx.cost(), None, "no price, no cost");
}

#[tokio::test(start_paused = true)]
async fn a_nested_run_draws_on_its_parents_lines_and_tenant() {
    let store = MemoryBudgetStore::new();
    let layer = BudgetLayer::new(prices())
        .store(store.clone())
        .per_run(Budget::new("run").max_tokens(300))
        .per_thread(Budget::new("thread").max_tokens(10_000))
        .per_tenant(Budget::new("tenant").max_tokens(10_000));
    let model = answering(Usage::new(100, 50));
    let root = RunContext::builder()
        .thread_id("t-1")
        .state(Tenant::new("acme"))
        .build();
    let child = root.child();
    let mut svc = layer.layer(model);
    svc.ready()
        .await
        .unwrap()
        .call(call(&root, "m"))
        .await
        .unwrap();
    svc.ready()
        .await
        .unwrap()
        .call(call(&child, "m"))
        .await
        .unwrap();
    // The child's own run line has room; the root's has 0 left.
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(call(&child, "m"))
        .await
        .unwrap_err();
    let e = exceeded(err);
    assert_eq!(e.key, format!("run:{}", root.run_id()));
    assert_eq!(e.spent, Amount::Tokens(300));
    // Thread and tenant lines were charged once per call, not once per run.
    for key in ["thread:t-1", "tenant:acme"] {
        let name = key.split(':').next().unwrap();
        let line = Budget::new(name).max_tokens(10_000).line(key);
        assert_eq!(store.state_now(&line).spent.tokens, 300, "{key}");
    }
}

#[derive(Debug)]
struct Broken;

impl BudgetStore for Broken {
    fn reserve<'a>(
        &'a self,
        _: &'a [BudgetLine],
        _: Spend,
    ) -> futures::future::BoxFuture<'a, Result<Reservation, BoxError>> {
        Box::pin(async { Err("the store is down".into()) })
    }

    fn settle(
        &self,
        _: Reservation,
        _: Spend,
    ) -> futures::future::BoxFuture<'_, Result<(), BoxError>> {
        Box::pin(async { Ok(()) })
    }

    fn state<'a>(
        &'a self,
        _: &'a BudgetLine,
    ) -> futures::future::BoxFuture<'a, Result<crate::stores::budget::LineState, BoxError>> {
        Box::pin(async { Ok(Default::default()) })
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_store_fails_the_call_unless_fail_open() {
    let ctx = RunContext::builder().state(Tenant::new("acme")).build();
    let layer = BudgetLayer::new(prices())
        .store(Broken)
        .per_tenant(Budget::new("tenant").max_tokens(10));
    let err = layer
        .clone()
        .layer(answering(Usage::new(1, 1)))
        .oneshot(call(&ctx, "m"))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "the store is down");
    layer
        .fail_open(true)
        .layer(answering(Usage::new(1, 1)))
        .oneshot(call(&ctx, "m"))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_failing_store_is_reported_in_the_events() {
    for fail_open in [false, true] {
        let sink = crate::event::CollectingSink::new();
        let ctx = RunContext::builder()
            .state(Tenant::new("acme"))
            .events(sink.clone())
            .build();
        let result = BudgetLayer::new(prices())
            .store(Broken)
            .per_tenant(Budget::new("tenant").max_tokens(10))
            .fail_open(fail_open)
            .layer(answering(Usage::new(1, 1)))
            .oneshot(call(&ctx, "m"))
            .await;
        assert_eq!(result.is_ok(), fail_open);
        let failures: Vec<_> = sink
            .events()
            .into_iter()
            .filter_map(|e| match e {
                crate::event::AgentEvent::StoreFailed {
                    store,
                    operation,
                    error,
                    failed_open,
                    ..
                } => Some((store, operation, error, failed_open)),
                _ => None,
            })
            .collect();
        assert_eq!(
            failures,
            [(
                "budget",
                "reserve",
                "the store is down".to_owned(),
                fail_open
            )]
        );
    }
}
