//! `OpenAiChat` against a real llama.cpp server (`llama-server` with
//! SmolLM2-135M, started by `scripts/peers/start.sh`). The tests assert the
//! protocol's shape, never the wording of a 135M-parameter model.
//!
//! The agent run goes through the crate's own model stack, retry ▸ timeout ▸
//! fallback ▸ tower's concurrency limit ▸ llama-server
//! (`layers::retry::RetryLayer`, `layers::timeout::TimeoutLayer`,
//! `layers::fallback::FallbackLayer`, via `ServiceBuilderExt`), and checks
//! what they report: no `RetryAttempt` or `FallbackUsed` event against a
//! healthy server, and one usage-ledger entry per model call.
//!
//! They are `#[ignore]`d: run them with `cargo test -- --ignored` after
//! starting the peers. Where the machine cannot run that llama-server build
//! (it needs AVX-512 and AMX), the script sets `LLAMA_SKIP_REASON` instead of
//! `LLAMA_URL`, and each test prints `SKIPPED: <test>: <reason>` to stderr
//! (past the harness's capture) and returns.
#![cfg(feature = "openai")]

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use tower::{ServiceBuilder, ServiceExt};
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::layers::retry::{Backoff, RetryPolicy};
use tower_agent::layers::ServiceBuilderExt;
use tower_agent::service::openai::OpenAiChat;
use tower_agent::types::{
    FinishReason, Message, ModelDelta, ModelRequest, ModelResponse, ResponseFormat, Role, Usage,
};
use tower_agent::{
    tool_sync, Agent, AgentError, BoxError, DeltaSink, ModelCall, RunContext, RunRequest,
    ToolRouter,
};

/// The llama.cpp service, or `None` (having said SKIPPED loudly) where the
/// peer knowingly did not start. Fails the test when the peers were not
/// started at all.
fn llama(test: &str) -> Option<OpenAiChat> {
    if let Some(url) = support::peer_var("LLAMA_URL") {
        let chat = OpenAiChat::builder(url)
            .model("smollm2")
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        return Some(chat);
    }
    if let Some(reason) = support::peer_var("LLAMA_SKIP_REASON") {
        support::shout(&format!("SKIPPED: provider_llama::{test}: {reason}"));
        return None;
    }
    panic!("neither LLAMA_URL nor LLAMA_SKIP_REASON is set: start the peers with `bash scripts/peers/start.sh`");
}

fn request(text: &str, max_tokens: u32) -> ModelRequest {
    let mut request = ModelRequest::new(
        "smollm2",
        vec![
            Message::system("You are a helpful assistant. Answer briefly."),
            Message::user(text),
        ],
    );
    request.settings.temperature = Some(0.0);
    request.settings.max_tokens = Some(max_tokens);
    request
}

fn check_shape(response: &ModelResponse) {
    assert_eq!(response.message.role, Role::Assistant);
    assert!(!response.model.is_empty());
    assert!(
        matches!(
            response.finish_reason,
            FinishReason::Stop | FinishReason::Length | FinishReason::ToolCalls
        ),
        "{:?}",
        response.finish_reason
    );
    assert!(response.usage.input_tokens > 0, "{:?}", response.usage);
    assert!(response.usage.output_tokens > 0, "{:?}", response.usage);
    assert!(response.usage_recorded);
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn llama_plain_chat() {
    let Some(chat) = llama("llama_plain_chat") else {
        return;
    };
    let ctx = RunContext::new();
    let call = ModelCall::new(request("What is the capital of France?", 32), ctx.clone());
    let response = chat.oneshot(call).await.unwrap();
    check_shape(&response);
    assert!(response.message.tool_calls.is_empty());
    assert!(!response.message.text().trim().is_empty());
    assert_eq!(ctx.usage(), response.usage);
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn llama_streamed_chat_with_its_usage_chunk() {
    let Some(chat) = llama("llama_streamed_chat_with_its_usage_chunk") else {
        return;
    };
    let ctx = RunContext::new();
    let (sink, mut rx) = DeltaSink::channel();
    let mut call = ModelCall::new(request("Count from one to five.", 48), ctx.clone());
    call.stream = Some(sink);
    let response = chat.oneshot(call).await.unwrap();
    check_shape(&response);

    let mut pieces = 0;
    let mut text = String::new();
    while let Ok(delta) = rx.try_recv() {
        if let ModelDelta::Text { text: piece } = delta {
            pieces += 1;
            text.push_str(&piece);
        }
    }
    assert!(pieces > 1, "the answer came in {pieces} pieces");
    assert_eq!(text, response.message.text());
    // The usage came from the `include_usage` chunk: it is the only place a
    // stream carries it.
    assert_eq!(ctx.usage(), response.usage);
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn llama_json_schema_response() {
    let Some(chat) = llama("llama_json_schema_response") else {
        return;
    };
    let schema = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "country": {"type": "string", "maxLength": 24}
        },
        "required": ["city", "country"],
        "additionalProperties": false
    });
    let mut request = request("Name a city in France and its country.", 96);
    request.settings.response_format = Some(ResponseFormat::json_schema("place", schema));
    let call = ModelCall::new(request, RunContext::new());
    let response = chat.oneshot(call).await.unwrap();
    check_shape(&response);
    assert_eq!(response.finish_reason, FinishReason::Stop);
    let value: Value = serde_json::from_str(&response.message.text())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", response.message.text()));
    let object = value.as_object().expect("a JSON object");
    assert!(object["city"].is_string() && object["country"].is_string());
    assert_eq!(object.len(), 2);
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct City {
    city: String,
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn llama_agent_run_through_the_layer_stack() {
    let Some(chat) = llama("llama_agent_run_through_the_layer_stack") else {
        return;
    };
    // retry ▸ timeout ▸ fallback ▸ concurrency limit ▸ llama-server. The
    // fallback asks the same server for its model again under its alias.
    let model = ServiceBuilder::new()
        .llm_retry(RetryPolicy::new().max_attempts(3).backoff(Backoff::new(
            Duration::from_millis(200),
            Duration::from_secs(1),
        )))
        .call_timeout(Duration::from_secs(120))
        .fallback_models(["smollm2"])
        .concurrency_limit(1)
        .service(chat);
    let agent = Agent::builder("weather")
        .instructions(
            "You answer questions about the weather. Use the weather tool when asked about a city.",
        )
        .model(model)
        .tools(ToolRouter::new().tool(tool_sync(
            "weather",
            "The current weather in a city",
            |c: City| Ok::<_, BoxError>(format!("{}: sunny, 21C", c.city)),
        )))
        .settings(tower_agent::types::ModelSettings {
            temperature: Some(0.0),
            max_tokens: Some(64),
            ..Default::default()
        })
        .max_turns(4)
        .build()
        .unwrap();
    let events = CollectingSink::new();
    let ctx = RunContext::builder().events(events.clone()).build();
    let (sink, mut rx) = DeltaSink::channel();
    let result = agent
        .oneshot(
            RunRequest::new("What is the weather in Paris?")
                .context(ctx.clone())
                .stream(sink),
        )
        .await;
    // A 135M model may answer, or call the tool until the turns run out:
    // either way the run has the protocol's shape.
    let run = match result {
        Ok(run) => {
            assert!(run.is_completed());
            run
        }
        Err(AgentError::MaxTurns { partial, .. }) => *partial,
        Err(other) => panic!("the run failed: {other}"),
    };
    assert!(run.counters.model_calls >= 1);
    assert!(run.usage.input_tokens > 0 && run.usage.output_tokens > 0);
    // Every tool message answers a call of an earlier assistant message.
    let mut calls = Vec::new();
    for message in &run.messages {
        calls.extend(message.tool_calls.iter().map(|c| c.id.clone()));
        if message.role == Role::Tool {
            assert!(calls.contains(message.tool_call_id.as_ref().unwrap()));
        }
    }
    let mut streamed = 0;
    while rx.try_recv().is_ok() {
        streamed += 1;
    }
    assert!(streamed > 0);
    // A healthy local server needs neither a retry nor the fallback, and
    // every call that reached it is in the ledger, once.
    let events = events.events();
    let layered: Vec<&AgentEvent> = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                AgentEvent::RetryAttempt { .. } | AgentEvent::FallbackUsed { .. }
            )
        })
        .collect();
    assert!(layered.is_empty(), "{layered:?}");
    let ledger = ctx.usage_entries();
    assert_eq!(ledger.len() as u32, run.counters.model_calls);
    assert_eq!(
        ledger.iter().fold(Usage::default(), |sum, e| sum + e.usage),
        run.usage
    );
}
