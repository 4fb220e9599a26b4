//! Exact usage across layers: every attempt that reached a backend counts
//! once, a cache hit counts nothing, a fallback counts every model it tried.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::layers::cache::CacheLayer;
use tower_agent::layers::fallback::FallbackLayer;
use tower_agent::layers::retry::{Backoff, LlmRetryLayer};
use tower_agent::types::{Message, ModelResponse, Usage};
use tower_agent::{
    Agent, AgentTool, BoxError, ModelCall, ProviderError, RunContext, RunRequest, ScriptedModel,
    ScriptedTurn, ToolRouter,
};

/// A provider that bills the prompt of the calls it fails (as a stream cut
/// off mid-way is billed), then answers on the third call.
fn flaky_provider(
    calls: Arc<AtomicUsize>,
) -> impl tower::Service<ModelCall, Response = ModelResponse, Error = BoxError, Future = impl Send>
       + Clone
       + Send
       + Sync {
    service_fn(move |call: ModelCall| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let model = call.request.model.clone();
            match n {
                1 => {
                    call.context.record_usage(&model, Usage::new(5, 0));
                    Err(ProviderError::unavailable("primary cut off").into())
                }
                2 => {
                    call.context.record_usage(&model, Usage::new(7, 0));
                    Err(ProviderError::unavailable("backup down").into())
                }
                _ => {
                    let usage = Usage::new(100, 10);
                    call.context.record_usage(&model, usage);
                    let mut response =
                        ModelResponse::new(model, Message::assistant("hello")).usage(usage);
                    response.usage_recorded = true;
                    Ok(response)
                }
            }
        }
    })
}

#[tokio::test(start_paused = true)]
async fn retry_fallback_and_cache_count_exactly() {
    let calls = Arc::new(AtomicUsize::new(0));
    let model = ServiceBuilder::new()
        .layer(LlmRetryLayer::new().max_attempts(3).backoff(Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(100),
        )))
        .layer(FallbackLayer::new().models(["backup"]))
        .layer(CacheLayer::new())
        .service(flaky_provider(calls.clone()));
    let agent = Agent::builder("exact")
        .model(model)
        .model_name("primary")
        .build()
        .unwrap();

    // Run 1: primary fails (billed 5), backup fails (billed 7), the retry's
    // primary answers (100 + 10).
    let sink = CollectingSink::new();
    let ctx = RunContext::builder().events(sink.clone()).build();
    let first = agent
        .clone()
        .oneshot(RunRequest::new("hi").context(ctx.clone()))
        .await
        .unwrap();
    assert_eq!(first.output, "hello");
    assert_eq!(first.usage, Usage::new(112, 10));
    assert_eq!(first.usage_total, Usage::new(112, 10));
    let entries: Vec<(String, Usage)> = ctx
        .usage_entries()
        .into_iter()
        .map(|e| (e.model.to_string(), e.usage))
        .collect();
    assert_eq!(
        entries,
        [
            ("primary".to_owned(), Usage::new(5, 0)),
            ("backup".to_owned(), Usage::new(7, 0)),
            ("primary".to_owned(), Usage::new(100, 10)),
        ]
    );
    assert!(sink
        .events()
        .iter()
        .any(|e| matches!(e, AgentEvent::RetryAttempt { attempt: 1, .. })));
    assert!(sink
        .events()
        .iter()
        .any(|e| matches!(e, AgentEvent::FallbackUsed { to, .. } if to == "backup")));

    // Run 2, the same question: answered from the cache, costing nothing.
    let ctx = RunContext::new();
    let second = agent
        .oneshot(RunRequest::new("hi").context(ctx.clone()))
        .await
        .unwrap();
    assert_eq!(second.output, "hello");
    assert_eq!(second.usage, Usage::default());
    assert!(ctx.usage_entries().is_empty());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "the second run never reached the provider"
    );
}

#[tokio::test(start_paused = true)]
async fn a_nested_run_through_a_cache_and_retry_rolls_up_once() {
    // The child's first attempt is rate limited (not billed), its retry
    // answers; the parent's own two turns answer at once.
    let child_model =
        ServiceBuilder::new()
            .layer(LlmRetryLayer::new())
            .service(ScriptedModel::new([
                ScriptedTurn::rate_limited(Duration::from_secs(1)),
                ScriptedTurn::text("child answer").usage(Usage::new(40, 4)),
            ]));
    let child = Agent::builder("child").model(child_model).build().unwrap();
    let parent = Agent::builder("parent")
        .model(
            ServiceBuilder::new()
                .layer(CacheLayer::new())
                .service(ScriptedModel::new([
                    ScriptedTurn::tool_call("child", r#"{"input": "go"}"#).usage(Usage::new(10, 1)),
                    ScriptedTurn::text("parent answer").usage(Usage::new(20, 2)),
                ])),
        )
        .tools(ToolRouter::new().tool(AgentTool::new("child", "A child", child)))
        .build()
        .unwrap();
    let run = parent.run("start").await.unwrap();
    assert_eq!(run.usage, Usage::new(30, 3));
    assert_eq!(run.usage_total, Usage::new(70, 7));
}
