//! `OpenAiChat` against a real llama.cpp server (llama.cpp's own HTTP server
//! from the PyPI wheel `xllamacpp`, with SmolLM2-135M, started by
//! `scripts/peers/start.sh` with the chat template
//! `tests/fixtures/llama/chatml-tools.jinja`). The tests assert the
//! protocol's shape, never the wording of a 135M-parameter model.
//!
//! The agent run goes through the crate's own model stack, retry ▸ timeout ▸
//! fallback ▸ tower's concurrency limit ▸ llama.cpp
//! (`layers::retry::RetryLayer`, `layers::timeout::TimeoutLayer`,
//! `layers::fallback::FallbackLayer`, via `ServiceBuilderExt`), and requires
//! a real tool call: the model calls the tool, the tool answers, and the
//! model writes a final answer. It checks what the layers report: no
//! `RetryAttempt` or `FallbackUsed` event against a healthy server, and one
//! usage-ledger entry per model call.
//!
//! They are `#[ignore]`d: `scripts/peers/run-tests.sh` starts the peers and
//! runs them with `--ignored`. Without `LLAMA_URL` (in the environment or
//! in `.peers/env`) each of them fails.
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
    tool_sync, Agent, BoxError, DeltaSink, ModelCall, RunContext, RunRequest, ToolRouter,
};

/// The llama.cpp service at `LLAMA_URL`; fails the test when it is not set.
fn llama() -> OpenAiChat {
    OpenAiChat::builder(support::require_peer("LLAMA_URL"))
        .model("smollm2")
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

fn request(text: &str, max_tokens: u32) -> ModelRequest {
    let mut request = ModelRequest::new(
        "smollm2",
        vec![
            Message::system("You are a helpful assistant. Answer briefly."),
            Message::user(text),
        ],
    );
    request.settings_mut().temperature = Some(0.0);
    request.settings_mut().max_tokens = Some(max_tokens);
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
    let chat = llama();
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
    let chat = llama();
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
    let chat = llama();
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
    request.settings_mut().response_format = Some(ResponseFormat::json_schema("place", schema));
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
    let chat = llama();
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
    // Worded like the worked exchange of the chat template, which is what a
    // 135M model needs to open a tool call.
    let run = agent
        .oneshot(
            RunRequest::new("Use the weather tool for Paris.")
                .context(ctx.clone())
                .stream(sink),
        )
        .await
        .unwrap_or_else(|e| panic!("the run failed: {e}"));
    assert!(run.is_completed(), "{:?}", run.status);

    // model → weather → model: the model called the tool through the layer
    // stack, with arguments the tool parsed, and then answered.
    let calls: Vec<_> = run
        .messages
        .iter()
        .flat_map(|m| m.tool_calls.iter())
        .collect();
    assert!(!calls.is_empty(), "no tool call: {:?}", run.messages);
    assert!(calls.iter().all(|c| c.name == "weather"), "{calls:?}");
    assert!(run.counters.tool_calls >= 1, "{:?}", run.counters);
    assert!(run.counters.model_calls >= 2, "{:?}", run.counters);
    let results: Vec<&Message> = run
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .collect();
    assert_eq!(results.len(), calls.len());
    for result in &results {
        // The tool ran (its text ends so), it did not report bad arguments.
        assert!(
            result.text().ends_with(": sunny, 21C"),
            "{:?}",
            result.text()
        );
    }
    // Every tool message answers a call of an earlier assistant message.
    let mut seen = Vec::new();
    for message in &run.messages {
        seen.extend(message.tool_calls.iter().map(|c| c.id.clone()));
        if message.role == Role::Tool {
            assert!(seen.contains(message.tool_call_id.as_ref().unwrap()));
        }
    }
    let last = run.messages.last().unwrap();
    assert_eq!(last.role, Role::Assistant);
    assert!(last.tool_calls.is_empty());
    assert!(!run.output.trim().is_empty());
    assert_eq!(run.output, last.text());
    assert!(run.usage.input_tokens > 0 && run.usage.output_tokens > 0);
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
