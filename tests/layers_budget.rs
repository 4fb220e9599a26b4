//! Budgets in full agent runs: the exact cost under retry and fallback, 100
//! concurrent runs against one tenant budget, and a nested run stopped by
//! what its parent has left.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::layers::budget::{Budget, BudgetLayer, Tenant};
use tower_agent::layers::fallback::FallbackLayer;
use tower_agent::layers::retry::{Backoff, LlmRetryLayer, RetryPolicy};
use tower_agent::stores::budget::{MemoryBudgetStore, Spend};
use tower_agent::types::{Amount, Cost, Decimal, Message, ModelResponse, Price, PriceTable, Usage};
use tower_agent::{
    Agent, AgentError, AgentTool, BoxError, ModelCall, ProviderError, RunContext, RunRequest,
    ScriptedModel, ScriptedTurn, ToolRouter,
};

fn cost(s: &str) -> Cost {
    s.parse().unwrap()
}

fn dec(s: &str) -> Decimal {
    Decimal::from_str_exact(s).unwrap()
}

/// What the scripted provider does on one attempt.
enum Step {
    /// Records `usage` (a stream that broke off), then fails as unavailable.
    FailAfter(Usage),
    /// Fails as unavailable, having recorded nothing.
    Fail,
    /// Answers `message` with `usage`, recorded.
    Answer(Message, Usage),
}

#[tokio::test(start_paused = true)]
async fn the_cost_is_exact_under_retry_and_fallback() {
    let steps = Arc::new(Mutex::new(VecDeque::from([
        // Turn 1, first try: big breaks off after 110 tokens, small is down.
        Step::FailAfter(Usage::new(100, 10)),
        Step::Fail,
        // The retry: big answers with a tool call.
        Step::Answer(
            Message::assistant_tool_calls(vec![tower_agent::types::ToolCall::new(
                "c1", "echo", "{}",
            )]),
            Usage::new(300, 30),
        ),
        // Turn 2: big is down, small answers.
        Step::Fail,
        Step::Answer(Message::assistant("done"), Usage::new(50, 5)),
    ])));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let provider = {
        let (steps, seen) = (steps.clone(), seen.clone());
        service_fn(move |call: ModelCall| {
            let step = steps.lock().unwrap().pop_front().expect("a scripted step");
            seen.lock().unwrap().push(call.request.model.to_string());
            async move {
                let model = call.request.model.to_string();
                match step {
                    Step::FailAfter(usage) => {
                        call.context.record_usage(&model, usage);
                        Err::<ModelResponse, BoxError>(ProviderError::unavailable("cut off").into())
                    }
                    Step::Fail => Err(ProviderError::unavailable("down").into()),
                    Step::Answer(message, usage) => {
                        call.context.record_usage(&model, usage);
                        let mut response = ModelResponse::new(model, message).usage(usage);
                        response.usage_recorded = true;
                        Ok(response)
                    }
                }
            }
        })
    };
    let prices = PriceTable::new()
        .price("big", Price::new(dec("2"), dec("8")))
        .price("small", Price::new(dec("1"), dec("2")));
    let store = MemoryBudgetStore::new();
    let tenant = Budget::new("tenant").max_cost(cost("1")).daily();
    let model = ServiceBuilder::new()
        .layer(LlmRetryLayer::from(
            RetryPolicy::new().max_attempts(3).backoff(Backoff::new(
                Duration::from_millis(100),
                Duration::from_secs(1),
            )),
        ))
        .layer(FallbackLayer::new().models(["small"]))
        .layer(
            BudgetLayer::new(prices)
                .store(store.clone())
                .per_tenant(tenant.clone())
                .per_run(Budget::new("run").max_tokens(100_000)),
        )
        .service(provider);
    let echo = tower_agent::tool_sync("echo", "Echoes", |_: serde_json::Value| {
        Ok::<_, BoxError>("echoed")
    });
    let agent = Agent::builder("assistant")
        .model(model)
        .model_name("big")
        .tools(ToolRouter::new().tool(echo))
        .build()
        .unwrap();

    let sink = CollectingSink::new();
    let ctx = RunContext::builder()
        .events(sink.clone())
        .state(Tenant::new("acme"))
        .build();
    let run = agent
        .oneshot(RunRequest::new("Hi").context(ctx.clone()))
        .await
        .unwrap();
    assert_eq!(run.output, "done");
    assert_eq!(
        *seen.lock().unwrap(),
        ["big", "small", "big", "big", "small"]
    );

    // big: 100 × 2 + 10 × 8 + 300 × 2 + 30 × 8; small: 50 × 1 + 5 × 2 (per million)
    let expected = cost("0.00118");
    assert_eq!(run.cost, Some(expected));
    let entries = ctx.usage_entries();
    assert_eq!(
        entries.len(),
        3,
        "every attempt that spent is in the ledger"
    );
    assert_eq!(
        entries.iter().map(|e| e.cost.unwrap()).sum::<Cost>(),
        expected
    );
    let events: Cost = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::CostRecorded { cost, .. } => Some(cost),
            _ => None,
        })
        .sum();
    assert_eq!(events, expected);
    // The tenant's line was charged exactly that, and holds nothing now.
    let line = store.state_now(&tenant.line("tenant:acme"));
    assert_eq!(line.spent, Spend::new(expected, 495));
    assert_eq!(line.reserved, Spend::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_hundred_concurrent_runs_never_overspend_one_tenant_budget() {
    let prices = PriceTable::new().price("m", Price::new(dec("1"), dec("2")));
    let store = MemoryBudgetStore::new();
    let limit = cost("0.005");
    let tenant = Budget::new("tenant").max_cost(limit);
    let layer = BudgetLayer::new(prices.clone())
        .store(store.clone())
        .per_tenant(tenant.clone())
        .default_output_tokens(100);
    let usage = Usage::new(10, 50);
    let model = ServiceBuilder::new().layer(layer).service(
        ScriptedModel::from_fn(move |_| ScriptedTurn::text("ok").usage(usage))
            .latency(Duration::from_millis(100)),
    );
    let agent = Agent::builder("a")
        .model(model)
        .model_name("m")
        .build()
        .unwrap();

    let runs: Vec<_> = (0..100u64)
        .map(|i| {
            let agent = agent.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i * 7)).await;
                let ctx = RunContext::builder().state(Tenant::new("acme")).build();
                agent
                    .oneshot(RunRequest::new(format!("Hi {i}")).context(ctx))
                    .await
            })
        })
        .collect();
    let (mut completed, mut refused) = (0u32, 0u32);
    for run in runs {
        match run.await.unwrap() {
            Ok(_) => completed += 1,
            Err(AgentError::BudgetExceeded(e)) => {
                assert_eq!(e.key, "tenant:acme");
                refused += 1;
            }
            Err(other) => panic!("unexpected error {other}"),
        }
    }
    let line = store.state_now(&tenant.line("tenant:acme"));
    // One reservation: "Hi NN" is 2 input tokens, plus 100 output, priced
    // at their rates.
    let reservation = prices.get("m").unwrap().ceiling(2, 100);
    let spent = line.spent.cost;
    let overspend = spent.saturating_sub(limit);
    println!(
        "100 concurrent runs: {completed} completed, {refused} refused; spent {spent} of {limit}; \
         overspend {overspend}; one reservation {reservation}"
    );
    assert_eq!(completed + refused, 100);
    assert!(completed > 0 && refused > 0, "the budget was the bound");
    assert!(spent <= limit + reservation);
    assert_eq!(overspend, Cost::ZERO);
    assert_eq!(line.reserved, Spend::ZERO);
    // Exactly what the completed runs used.
    let per_run = prices.cost("m", &usage).unwrap();
    assert_eq!(
        spent,
        std::iter::repeat_n(per_run, completed as usize).sum::<Cost>()
    );
}

#[tokio::test(start_paused = true)]
async fn a_nested_run_is_held_to_what_its_parent_has_left() {
    let prices = PriceTable::new().price("m", Price::new(dec("1"), dec("1")));
    let budgets = BudgetLayer::new(prices)
        .per_run(Budget::new("run").max_tokens(1_000))
        .default_output_tokens(100);

    let child_model =
        ScriptedModel::new([ScriptedTurn::text("found it").usage(Usage::new(50, 50))]);
    let child = Agent::builder("researcher")
        .model(
            ServiceBuilder::new()
                .layer(budgets.clone())
                .service(child_model.clone()),
        )
        .model_name("m")
        .build()
        .unwrap();
    // The parent's first call spends 900 of its 1000 tokens; the child's
    // first call needs about 102, more than the 100 left.
    let parent_model = ScriptedModel::new([
        ScriptedTurn::tool_call("research", r#"{"input": "find it"}"#).usage(Usage::new(800, 100)),
        ScriptedTurn::text("unreachable"),
    ]);
    let parent = Agent::builder("lead")
        .model(ServiceBuilder::new().layer(budgets).service(parent_model))
        .model_name("m")
        .tools(ToolRouter::new().tool(AgentTool::new("research", "Researches", child)))
        .build()
        .unwrap();

    let ctx = RunContext::builder().run_id("run_lead").build();
    let err = parent
        .oneshot(RunRequest::new("Go").context(ctx.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "BUDGET_EXCEEDED");
    let AgentError::BudgetExceeded(e) = err else {
        unreachable!()
    };
    assert_eq!(e.key, "run:run_lead", "the parent's line stopped the child");
    assert_eq!(e.limit, Amount::Tokens(1_000));
    assert_eq!(e.spent, Amount::Tokens(900));
    assert!(
        child_model.requests().is_empty(),
        "the child never called its model"
    );
    assert_eq!(ctx.total_usage(), Usage::new(800, 100));
}

#[tokio::test(start_paused = true)]
async fn a_nested_runs_spend_rolls_up_into_its_parents_cost() {
    let prices = PriceTable::new().price("m", Price::new(dec("1"), dec("1")));
    let budgets = BudgetLayer::new(prices).per_run(Budget::new("run").max_tokens(10_000));
    let child = Agent::builder("researcher")
        .model(
            ServiceBuilder::new()
                .layer(budgets.clone())
                .service(ScriptedModel::new([
                    ScriptedTurn::text("found it").usage(Usage::new(50, 50))
                ])),
        )
        .model_name("m")
        .build()
        .unwrap();
    let parent = Agent::builder("lead")
        .model(
            ServiceBuilder::new()
                .layer(budgets)
                .service(ScriptedModel::new([
                    ScriptedTurn::tool_call("research", r#"{"input": "find it"}"#)
                        .usage(Usage::new(100, 100)),
                    ScriptedTurn::text("done").usage(Usage::new(200, 100)),
                ])),
        )
        .model_name("m")
        .tools(ToolRouter::new().tool(AgentTool::new("research", "Researches", child)))
        .build()
        .unwrap();
    let run = parent.run("Go").await.unwrap();
    // 100 + 100 + 200 + 100 of the parent, 50 + 50 of the child, at 1 per million.
    assert_eq!(run.cost, Some(cost("0.0006")));
}
