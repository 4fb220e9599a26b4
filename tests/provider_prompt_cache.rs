//! Provider prompt caching against recorded answers
//! (tests/fixtures/{anthropic,openai}/cached_*.json) served by a local test
//! server, in full agent runs: where the Anthropic breakpoints go on each
//! turn, OpenAI's `prompt_cache_key`, and the cached tokens in the run's
//! usage.
#![cfg(feature = "openai")]

mod support;

use serde_json::{json, Value};
use tower::ServiceExt;
use tower_agent::service::anthropic::AnthropicMessages;
use tower_agent::service::openai::OpenAiChat;
use tower_agent::types::Usage;
use tower_agent::{tool_sync, Agent, BoxError, RunContext, RunRequest, ToolRouter};

use support::{fixture, Reply, TestServer};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct City {
    city: String,
}

fn tools() -> ToolRouter {
    ToolRouter::new()
        .tool(tool_sync("time", "The local time in a city", |c: City| {
            Ok::<_, BoxError>(format!("{}: 10:00", c.city))
        }))
        .tool(tool_sync("weather", "The weather in a city", |c: City| {
            Ok::<_, BoxError>(format!("{}: light rain, 12C", c.city))
        }))
}

/// Where the breakpoints of a request body are, as JSON pointers.
fn breakpoints(value: &Value, at: &str, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if map.contains_key("cache_control") {
                assert_eq!(map["cache_control"], json!({"type": "ephemeral"}));
                found.push(at.to_owned());
            }
            for (key, value) in map {
                breakpoints(value, &format!("{at}/{key}"), found);
            }
        }
        Value::Array(list) => {
            for (i, value) in list.iter().enumerate() {
                breakpoints(value, &format!("{at}/{i}"), found);
            }
        }
        _ => {}
    }
}

fn breakpoints_of(body: &Value) -> Vec<String> {
    let mut found = Vec::new();
    breakpoints(body, "", &mut found);
    found.sort();
    found
}

#[tokio::test]
async fn anthropic_breakpoints_follow_the_stable_prefix_turn_by_turn() {
    let server = TestServer::start(vec![
        Reply::json(200, fixture("anthropic/cached_tool_use.json")),
        Reply::json(200, fixture("anthropic/cached_final.json")),
    ])
    .await;
    let claude = AnthropicMessages::builder(&server.url)
        .api_key("sk-ant-test")
        .model("claude-sonnet-4-5")
        // Prompt caching is on by default.
        .build()
        .unwrap();
    let agent = Agent::builder("weather")
        .instructions("You report the weather.")
        .model(claude)
        .tools(tools())
        .build()
        .unwrap();
    let run = agent
        .oneshot(RunRequest::new("Weather in Lyon?"))
        .await
        .unwrap();
    assert_eq!(run.output, "Lyon: light rain, 12C.");

    let sent = server.received();
    assert_eq!(sent.len(), 2);
    let (first, second) = (sent[0].json(), sent[1].json());
    // Turn 1: the last tool, the system prompt, the only message.
    assert_eq!(
        breakpoints_of(&first),
        ["/messages/0/content/0", "/system/0", "/tools/1"]
    );
    assert_eq!(
        first["system"],
        json!([{"type": "text", "text": "You report the weather.", "cache_control": {"type": "ephemeral"}}])
    );
    // Turn 2: the same prefix marks, and the last two messages (the tool call
    // and its result): four, the API's limit.
    assert_eq!(
        breakpoints_of(&second),
        [
            "/messages/1/content/0",
            "/messages/2/content/0",
            "/system/0",
            "/tools/1"
        ]
    );
    assert_eq!(second["messages"][2]["content"][0]["type"], "tool_result");
    // The prefix turn 2 reads is byte-identical to what turn 1 wrote.
    assert_eq!(first["tools"], second["tools"]);
    assert_eq!(first["system"], second["system"]);
    assert_eq!(
        first["messages"][0]["content"][0]["text"],
        second["messages"][0]["content"][0]["text"]
    );

    // Cache writes count as input, cache reads as input and as cached.
    assert_eq!(
        run.usage,
        Usage {
            input_tokens: (24 + 1830) + (9 + 75 + 1830),
            output_tokens: 41 + 12,
            cached_input_tokens: 1830,
            reasoning_tokens: 0,
        }
    );
}

#[tokio::test]
async fn anthropic_without_prompt_caching_sends_no_breakpoint() {
    let server = TestServer::start(vec![Reply::json(
        200,
        fixture("anthropic/cached_final.json"),
    )])
    .await;
    let claude = AnthropicMessages::builder(&server.url)
        .api_key("sk-ant-test")
        .model("claude-sonnet-4-5")
        .prompt_caching(false)
        .build()
        .unwrap();
    let agent = Agent::builder("weather")
        .instructions("You report the weather.")
        .model(claude)
        .build()
        .unwrap();
    agent.oneshot(RunRequest::new("Weather?")).await.unwrap();
    let body = server.received()[0].json();
    assert!(breakpoints_of(&body).is_empty());
    assert_eq!(body["system"], "You report the weather.");
}

#[tokio::test]
async fn openai_sends_the_thread_as_prompt_cache_key_and_counts_cached_tokens() {
    let server = TestServer::start(vec![
        Reply::json(200, fixture("openai/cached_tool_call.json")),
        Reply::json(200, fixture("openai/cached_final.json")),
        Reply::json(200, fixture("openai/cached_final.json")),
    ])
    .await;
    let chat = OpenAiChat::builder(format!("{}/v1", server.url))
        .api_key("sk-test")
        .model("gpt-4.1-mini")
        .prompt_cache_key_per_thread()
        .build()
        .unwrap();
    let agent = Agent::builder("weather")
        .instructions("You report the weather.")
        .model(chat)
        .tools(tools())
        .build()
        .unwrap();
    let ctx = RunContext::builder().thread_id("customer-7").build();
    let run = agent
        .clone()
        .oneshot(RunRequest::new("Weather in Lyon?").context(ctx))
        .await
        .unwrap();
    assert_eq!(
        run.usage,
        Usage {
            input_tokens: 1412 + 1449,
            output_tokens: 17 + 11,
            cached_input_tokens: 1408,
            reasoning_tokens: 0,
        }
    );
    // A run without a thread sends no key.
    agent.oneshot(RunRequest::new("Weather?")).await.unwrap();
    let sent = server.received();
    assert_eq!(sent[0].json()["prompt_cache_key"], "customer-7");
    assert_eq!(sent[1].json()["prompt_cache_key"], "customer-7");
    assert_eq!(sent[2].json().get("prompt_cache_key"), None);
}

#[tokio::test]
async fn openai_sends_a_fixed_prompt_cache_key_only_when_configured() {
    let server = TestServer::start(vec![
        Reply::json(200, fixture("openai/cached_final.json")),
        Reply::json(200, fixture("openai/cached_final.json")),
    ])
    .await;
    let keyed = OpenAiChat::builder(&server.url)
        .model("gpt-4.1-mini")
        .prompt_cache_key("weather-agent-v1")
        .build()
        .unwrap();
    let plain = OpenAiChat::builder(&server.url)
        .model("gpt-4.1-mini")
        .build()
        .unwrap();
    for model in [keyed, plain] {
        Agent::builder("weather")
            .model(model)
            .build()
            .unwrap()
            .oneshot(RunRequest::new("Weather?"))
            .await
            .unwrap();
    }
    let sent = server.received();
    assert_eq!(sent[0].json()["prompt_cache_key"], "weather-agent-v1");
    assert_eq!(sent[1].json().get("prompt_cache_key"), None);
}
