//! `OpenAiChat` against a real llama.cpp server (llama.cpp's own HTTP server
//! from the PyPI wheel `xllamacpp`, with SmolLM2-135M, started by
//! `scripts/peers/start.sh` with the chat template
//! `tests/fixtures/llama/chatml-tools.jinja`). The tests assert the
//! protocol's shape, never the wording of a 135M-parameter model.
//!
//! The agent run goes through the crate's production stack, as the README
//! builds it with `ServiceBuilderExt`: retry ▸ timeout ▸ fallback ▸ response
//! cache ▸ model rate limit ▸ PII masking ▸ llama.cpp, with the agent's
//! `MiddlewareStack` (`before_model`, `after_model` and `before_tool`
//! closures, a `wrap_tool` middleware) hooking every call. It requires a
//! real tool call: the model calls the tool, the tool answers, and the
//! model writes a final answer with the result in its request. It checks
//! what the hooks saw (each model call once, each tool call by name), that
//! the run's usage is the sum of its ledger entries, that the
//! `MiddlewareStarted`/`MiddlewareCompleted` events balance, and that a
//! healthy server needs no retry, no fallback and no cache hit.
//!
//! They are `#[ignore]`d: `scripts/peers/run-tests.sh` starts the peers and
//! runs them with `--ignored`. Without `LLAMA_URL` (in the environment or
//! in `.peers/env`) each of them fails.
#![cfg(feature = "openai")]

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{json, Value};
use tower::{ServiceBuilder, ServiceExt};
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::hooks::ToolVerdict;
use tower_agent::layers::cache::CacheLayer;
use tower_agent::layers::pii::MaskPiiLayer;
use tower_agent::layers::rate_limit::ModelRateLimitLayer;
use tower_agent::layers::retry::{Backoff, RetryPolicy};
use tower_agent::layers::ServiceBuilderExt;
use tower_agent::lifecycle::ToolNext;
use tower_agent::service::openai::OpenAiChat;
use tower_agent::types::{
    FinishReason, Message, ModelDelta, ModelRequest, ModelResponse, ResponseFormat, Role, Usage,
};
use tower_agent::{
    tool_sync, Agent, BoxError, DeltaSink, MiddlewareStack, ModelCall, RunContext, RunRequest,
    ToolInvocation, ToolMiddleware, ToolOutput, ToolRouter,
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

/// What the agent's middleware saw of the run.
#[derive(Default)]
struct Seen {
    /// One entry a `before_model`: whether the turn's messages held a tool
    /// result.
    before_model: Mutex<Vec<bool>>,
    /// The usage of each answer `after_model` saw.
    after_model: Mutex<Vec<Usage>>,
    /// The tools `before_tool` decided on.
    before_tool: Mutex<Vec<String>>,
    /// The tool calls `wrap_tool` wrapped, with what they came back with.
    wrap_tool: Mutex<Vec<(String, ToolOutput)>>,
}

/// The `wrap_tool` middleware: hands each call on and records it.
struct RecordTools(Arc<Seen>);

impl ToolMiddleware for RecordTools {
    fn name(&self) -> &str {
        "record-tools"
    }

    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> BoxFuture<'a, Result<ToolOutput, BoxError>> {
        Box::pin(async move {
            let name = invocation.call.name.clone();
            let output = next.run(invocation).await?;
            self.0
                .wrap_tool
                .lock()
                .unwrap()
                .push((name, output.clone()));
            Ok(output)
        })
    }
}

/// The agent's middleware: `before_model`, `after_model` and `before_tool`
/// closures and a `wrap_tool` middleware, each recording into `seen`.
fn recording_middleware(seen: &Arc<Seen>) -> MiddlewareStack {
    let (before_model, after_model, before_tool) = (seen.clone(), seen.clone(), seen.clone());
    MiddlewareStack::new()
        .before_model("turns", move |_ctx, messages| {
            let has_result = messages.iter().any(|m| m.role == Role::Tool);
            before_model.before_model.lock().unwrap().push(has_result);
            Ok(())
        })
        .after_model("answers", move |_ctx, response| {
            after_model.after_model.lock().unwrap().push(response.usage);
            Ok(())
        })
        .before_tool("weather-only", move |_ctx, call| {
            before_tool
                .before_tool
                .lock()
                .unwrap()
                .push(call.name.clone());
            Ok(if call.name == "weather" {
                ToolVerdict::proceed()
            } else {
                ToolVerdict::deny("only the weather tool")
            })
        })
        .push_tool(RecordTools(seen.clone()))
}

fn total(usages: impl Iterator<Item = Usage>) -> Usage {
    usages.fold(Usage::default(), |sum, usage| sum + usage)
}

fn sorted<T: Ord>(mut items: Vec<T>) -> Vec<T> {
    items.sort();
    items
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn llama_agent_run_through_the_production_stack() {
    let chat = llama();
    // The production stack of the README: retry ▸ timeout ▸ fallback ▸
    // cache ▸ rate limit ▸ PII masking ▸ llama-server. The fallback asks the
    // same server for its model again under its alias; the limits are ample.
    // Beneath the PII masking a probe keeps each request as llama.cpp gets it.
    let wire: Arc<Mutex<Vec<ModelRequest>>> = Arc::default();
    let probe = wire.clone();
    let limits = ModelRateLimitLayer::new()
        .requests(60, Duration::from_secs(60))
        .tokens(1_000_000, Duration::from_secs(60));
    let model = ServiceBuilder::new()
        .llm_retry(RetryPolicy::new().max_attempts(3).backoff(Backoff::new(
            Duration::from_millis(200),
            Duration::from_secs(1),
        )))
        .call_timeout(Duration::from_secs(120))
        .fallback_models(["smollm2"])
        .response_cache(CacheLayer::new())
        .model_rate_limit(limits)
        .mask_pii(MaskPiiLayer::default())
        .map_request(move |call: ModelCall| {
            probe.lock().unwrap().push(call.request.clone());
            call
        })
        .service(chat);
    let seen = Arc::new(Seen::default());
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
        .middleware(recording_middleware(&seen))
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

    // model → weather → model: the model called the tool through the stack,
    // with arguments the tool parsed, and then answered.
    let calls: Vec<_> = run
        .messages
        .iter()
        .flat_map(|m| m.tool_calls.iter())
        .collect();
    assert!(!calls.is_empty(), "no tool call: {:?}", run.messages);
    assert!(calls.iter().all(|c| c.name == "weather"), "{calls:?}");
    assert_eq!(run.counters.tool_calls as usize, calls.len());
    assert!(run.counters.model_calls >= 2, "{:?}", run.counters);
    let model_calls = run.counters.model_calls as usize;
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
    let mut ids = Vec::new();
    for message in &run.messages {
        ids.extend(message.tool_calls.iter().map(|c| c.id.clone()));
        if message.role == Role::Tool {
            assert!(ids.contains(message.tool_call_id.as_ref().unwrap()));
        }
    }
    let last = run.messages.last().unwrap();
    assert_eq!(last.role, Role::Assistant);
    assert!(last.tool_calls.is_empty());
    assert!(!run.output.trim().is_empty());
    assert_eq!(run.output, last.text());
    let mut streamed = 0;
    while rx.try_recv().is_ok() {
        streamed += 1;
    }
    assert!(streamed > 0);

    // The tool's results reached the model: every model call went through
    // the whole stack to llama.cpp, and the last one carried each result,
    // answering its call.
    let wire = wire.lock().unwrap().clone();
    assert_eq!(wire.len(), model_calls, "requests that reached llama.cpp");
    let final_request = wire.last().unwrap();
    for result in &results {
        assert!(
            final_request.messages.iter().any(|m| m.role == Role::Tool
                && m.tool_call_id == result.tool_call_id
                && m.text() == result.text()),
            "{:?} is not in the last request: {:?}",
            result.text(),
            final_request.messages
        );
    }

    // The hooks saw the run: one `before_model` and one `after_model` a
    // model call, the last turn's messages holding the tool's result, and
    // `before_tool` and `wrap_tool` each tool call, by name.
    let call_names = sorted(calls.iter().map(|c| c.name.clone()).collect());
    let before_model = seen.before_model.lock().unwrap().clone();
    let after_model = seen.after_model.lock().unwrap().clone();
    let before_tool = seen.before_tool.lock().unwrap().clone();
    let wrap_tool = seen.wrap_tool.lock().unwrap().clone();
    assert_eq!(before_model.len(), model_calls, "{before_model:?}");
    assert_eq!(after_model.len(), model_calls, "{after_model:?}");
    assert!(!before_model[0], "the first turn has no tool result yet");
    assert!(*before_model.last().unwrap(), "{before_model:?}");
    assert_eq!(sorted(before_tool.clone()), call_names);
    assert_eq!(
        sorted(wrap_tool.iter().map(|(name, _)| name.clone()).collect()),
        call_names
    );
    assert!(wrap_tool.iter().all(|(_, output)| !output.is_error));
    assert_eq!(
        sorted(wrap_tool.iter().map(|(_, o)| o.content.clone()).collect()),
        sorted(results.iter().map(|m| m.text()).collect())
    );

    // The usage: non-zero, one ledger entry a model call, and the run's is
    // their sum, as `after_model` saw it too.
    assert!(run.usage.input_tokens > 0 && run.usage.output_tokens > 0);
    let ledger = ctx.usage_entries();
    assert_eq!(ledger.len(), model_calls);
    assert!(ledger.iter().all(|e| e.usage.input_tokens > 0));
    assert_eq!(total(ledger.iter().map(|e| e.usage)), run.usage);
    assert_eq!(total(after_model.iter().copied()), run.usage);
    assert_eq!(ctx.usage(), run.usage);

    // A healthy local server needs neither a retry nor the fallback, and no
    // request of one run repeats another, so the cache never answers.
    let events = events.events();
    let unexpected: Vec<&AgentEvent> = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                AgentEvent::RetryAttempt { .. }
                    | AgentEvent::FallbackUsed { .. }
                    | AgentEvent::CacheHit { .. }
            )
        })
        .collect();
    assert!(unexpected.is_empty(), "{unexpected:?}");

    // Every hook invocation is bracketed: each `MiddlewareCompleted` closes
    // an open `MiddlewareStarted` of its middleware and hook, all end `ok`,
    // and none is left open.
    let mut open: BTreeMap<(String, &str), u32> = BTreeMap::new();
    let mut started: BTreeMap<(String, &str), u32> = BTreeMap::new();
    for event in &events {
        match event {
            AgentEvent::MiddlewareStarted {
                middleware, hook, ..
            } => {
                *open.entry((middleware.to_string(), *hook)).or_default() += 1;
                *started.entry((middleware.to_string(), *hook)).or_default() += 1;
            }
            AgentEvent::MiddlewareCompleted {
                middleware,
                hook,
                outcome,
                ..
            } => {
                assert_eq!(*outcome, "ok", "{middleware} {hook}");
                let count = open
                    .get_mut(&(middleware.to_string(), *hook))
                    .filter(|n| **n > 0)
                    .unwrap_or_else(|| panic!("{middleware} {hook} completed, never started"));
                *count -= 1;
            }
            _ => {}
        }
    }
    assert!(open.values().all(|n| *n == 0), "left open: {open:?}");
    let hook_runs = |middleware: &str, hook: &'static str| {
        started
            .get(&(middleware.to_owned(), hook))
            .copied()
            .unwrap_or(0) as usize
    };
    assert_eq!(
        hook_runs("turns", "before_model"),
        model_calls,
        "{started:?}"
    );
    assert_eq!(
        hook_runs("answers", "after_model"),
        model_calls,
        "{started:?}"
    );
    assert_eq!(
        hook_runs("weather-only", "before_tool"),
        calls.len(),
        "{started:?}"
    );
    assert_eq!(
        hook_runs("record-tools", "wrap_tool"),
        calls.len(),
        "{started:?}"
    );

    support::shout(&format!(
        "llama production stack: {} tool call(s) {:?}, {} model calls, usage {:?}, {} middleware events",
        calls.len(),
        calls.iter().map(|c| &c.arguments).collect::<Vec<_>>(),
        model_calls,
        run.usage,
        events
            .iter()
            .filter(|e| matches!(e, AgentEvent::MiddlewareStarted { .. }))
            .count()
            * 2,
    ));
}
