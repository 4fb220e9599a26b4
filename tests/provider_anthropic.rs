//! `AnthropicMessages` over real HTTP, against recorded Messages API
//! answers (tests/fixtures/anthropic/) served by a local test server, in
//! full agent runs, streamed and not. The `aimock_*` test also runs it
//! against aimock's `/v1/messages` (needs `scripts/peers/start.sh`).
#![cfg(feature = "openai")]

mod support;

use std::time::Duration;

use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent::error::{find, kind_of, retry_after};
use tower_agent::service::anthropic::AnthropicMessages;
use tower_agent::service::openai::BrokenResponse;
use tower_agent::types::{Message, ModelDelta, ModelRequest, Role, Usage};
use tower_agent::{
    tool_sync, Agent, AgentError, BoxError, DeltaSink, ErrorKind, ModelCall, RunContext,
    RunRequest, ToolRouter,
};

use support::{fixture, Reply, TestServer};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct City {
    city: String,
}

fn agent(claude: AnthropicMessages) -> Agent {
    let model = ServiceBuilder::new()
        .timeout(Duration::from_secs(30))
        .service(claude);
    Agent::builder("weather")
        .instructions("You report the weather.")
        .model(model)
        .tools(
            ToolRouter::new().tool(tool_sync("weather", "The weather in a city", |c: City| {
                Ok::<_, BoxError>(format!("{}: sunny, 21C", c.city))
            })),
        )
        .build()
        .unwrap()
}

fn claude(url: &str) -> AnthropicMessages {
    // The wire translation, without prompt-cache breakpoints (on by
    // default; tests/provider_prompt_cache.rs checks them).
    AnthropicMessages::builder(url)
        .api_key("sk-ant-test")
        .model("claude-sonnet-4-5")
        .max_tokens(512)
        .prompt_caching(false)
        .build()
        .unwrap()
}

/// What both runs must show, streamed or not.
fn check_run(run: &tower_agent::AgentRun, server: &TestServer, streamed: bool) {
    assert_eq!(run.output, "It is sunny and 21°C in Paris.");
    assert_eq!((run.counters.turns, run.counters.tool_calls), (2, 1));
    // 472 + (120 + 512 cached) in, 89 + 15 out.
    assert_eq!(
        run.usage,
        Usage {
            input_tokens: 1104,
            output_tokens: 104,
            cached_input_tokens: 512,
            reasoning_tokens: 0
        }
    );
    let call = &run.messages[2].tool_calls[0];
    assert_eq!(call.id, "toolu_01T1x1fJ34qAmk2tNTrN7Up6");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&call.arguments).unwrap(),
        json!({"city": "Paris"})
    );
    assert_eq!(run.messages[3].role, Role::Tool);

    let sent = server.received();
    assert_eq!(sent.len(), 2);
    for request in &sent {
        assert_eq!(
            (request.method.as_str(), request.path.as_str()),
            ("POST", "/v1/messages")
        );
        assert_eq!(request.header("x-api-key"), Some("sk-ant-test"));
        assert_eq!(request.header("anthropic-version"), Some("2023-06-01"));
    }
    let first = sent[0].json();
    assert_eq!(first["model"], "claude-sonnet-4-5");
    assert_eq!(first["max_tokens"], 512);
    assert_eq!(first["system"], "You report the weather.");
    assert_eq!(first["tools"][0]["name"], "weather");
    assert_eq!(
        first["tools"][0]["input_schema"]["required"],
        json!(["city"])
    );
    assert_eq!(first["stream"].as_bool().unwrap_or(false), streamed);
    assert_eq!(
        first["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}])
    );
    let second = sent[1].json();
    assert_eq!(
        second["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me check the weather."},
                {"type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "weather", "input": {"city": "Paris"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "content": "Paris: sunny, 21C"}
            ]}
        ])
    );
}

#[tokio::test]
async fn a_streamed_agent_run_with_a_tool() {
    let server = TestServer::start(vec![
        Reply::sse(
            fixture("anthropic/tool_use.sse")
                .chunks(53)
                .map(<[u8]>::to_vec)
                .collect(),
        ),
        Reply::sse(
            fixture("anthropic/final.sse")
                .chunks(7)
                .map(<[u8]>::to_vec)
                .collect(),
        ),
    ])
    .await;
    let (sink, mut rx) = DeltaSink::channel();
    let run = agent(claude(&server.url))
        .oneshot(RunRequest::new("Weather in Paris?").stream(sink))
        .await
        .unwrap();
    check_run(&run, &server, true);

    let mut text = String::new();
    let mut tool_args = String::new();
    while let Ok(delta) = rx.try_recv() {
        match delta {
            ModelDelta::Text { text: t } => text.push_str(&t),
            ModelDelta::ToolCall {
                index, arguments, ..
            } => {
                assert_eq!(index, 0);
                tool_args.push_str(&arguments);
            }
            ModelDelta::Reasoning { .. } => panic!("no thinking in these recordings"),
            ModelDelta::UserMessage { .. } => panic!("no queued messages in these runs"),
        }
    }
    assert_eq!(
        text,
        "Let me check the weather.It is sunny and 21°C in Paris."
    );
    assert_eq!(tool_args, r#"{"city": "Paris"}"#);
}

#[tokio::test]
async fn an_agent_run_with_a_tool_not_streamed() {
    let server = TestServer::start(vec![
        Reply::json(200, fixture("anthropic/tool_use.json")),
        Reply::json(200, fixture("anthropic/final.json")),
    ])
    .await;
    let run = agent(claude(&format!("{}/v1", server.url)))
        .run("Weather in Paris?")
        .await
        .unwrap();
    check_run(&run, &server, false);
}

fn call() -> ModelCall {
    ModelCall::new(
        ModelRequest::new("claude-x", vec![Message::user("hi")]),
        RunContext::new(),
    )
}

#[tokio::test]
async fn maps_error_answers_like_the_openai_provider() {
    let script = vec![
        Reply::json(429, fixture("anthropic/rate_limit.json")).header("retry-after", "5"),
        Reply::json(529, fixture("anthropic/overloaded.json")),
        Reply::json(401, fixture("anthropic/authentication.json")),
        Reply::json(403, fixture("anthropic/permission.json")),
        Reply::json(400, fixture("anthropic/prompt_too_long.json")),
        Reply::json(400, fixture("anthropic/invalid_request.json")),
    ];
    let expected = [
        (ErrorKind::RateLimited, Some(Duration::from_secs(5))),
        (ErrorKind::Unavailable, None),
        (ErrorKind::Auth, None),
        (ErrorKind::Auth, None),
        (ErrorKind::ContextLength, None),
        (ErrorKind::InvalidRequest, None),
    ];
    let server = TestServer::start(script).await;
    let claude = claude(&server.url);
    for (kind, after) in expected {
        let err = claude.clone().oneshot(call()).await.unwrap_err();
        assert_eq!(kind_of(err.as_ref()), kind, "{err}");
        assert_eq!(retry_after(err.as_ref()), after);
    }
}

#[tokio::test]
async fn an_error_event_or_a_cut_stream_fails_the_call() {
    let server = TestServer::start(vec![
        Reply::sse(vec![fixture("anthropic/error_mid_stream.sse")]),
        Reply::sse(vec![fixture("anthropic/truncated.sse")]),
    ])
    .await;
    let claude = claude(&server.url);
    for message in ["Overloaded", "unreadable response"] {
        let (sink, mut rx) = DeltaSink::channel();
        let mut call = call();
        call.stream = Some(sink);
        let ctx = call.context.clone();
        let err = claude.clone().oneshot(call).await.unwrap_err();
        assert_eq!(kind_of(err.as_ref()), ErrorKind::Unavailable);
        assert!(err.to_string().contains(message), "{err}");
        let broken = find::<BrokenResponse>(err.as_ref()).expect("a BrokenResponse source");
        let mut sent = 0;
        while rx.try_recv().is_ok() {
            sent += 1;
        }
        assert!(sent > 0);
        assert_eq!(broken.deltas_sent(), sent);
        // What message_start reported was billed, so it is recorded.
        assert!(ctx.usage().input_tokens > 0);
        let agent_err = AgentError::classify(err);
        assert_eq!(agent_err.code(), "PROVIDER_UNAVAILABLE");
    }
}

#[test]
fn from_env_reads_the_anthropic_variables() {
    // The only test of this binary that touches ANTHROPIC_*.
    std::env::remove_var("ANTHROPIC_BASE_URL");
    std::env::remove_var("ANTHROPIC_API_KEY");
    assert!(AnthropicMessages::from_env().is_none());
    std::env::set_var("ANTHROPIC_API_KEY", "sk-ant-x");
    std::env::set_var("ANTHROPIC_MODEL", "claude-env");
    let claude = AnthropicMessages::from_env().unwrap().unwrap();
    assert_eq!(claude.url(), "https://api.anthropic.com/v1/messages");
    assert_eq!(claude.default_model(), "claude-env");
    std::env::set_var("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/v1/");
    let claude = AnthropicMessages::from_env().unwrap().unwrap();
    assert_eq!(claude.url(), "http://127.0.0.1:9/v1/messages");
    for name in ["ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_MODEL"] {
        std::env::remove_var(name);
    }
}

#[tokio::test]
#[ignore = "needs the peers of scripts/peers/start.sh"]
async fn aimock_serves_a_multi_turn_run_over_the_messages_api() {
    for streamed in [false, true] {
        let claude = AnthropicMessages::builder(support::require_peer("AIMOCK_URL"))
            .api_key("sk-aimock-test")
            .model("claude-test")
            .header("x-test-id", support::unique("claude"))
            .build()
            .unwrap();
        let tools = ToolRouter::new()
            .tool(tool_sync("weather", "The weather", |c: City| {
                Ok::<_, BoxError>(format!("{}: sunny, 21C", c.city))
            }))
            .tool(tool_sync(
                "book_hotel",
                "Books a hotel",
                |b: serde_json::Value| Ok::<_, BoxError>(format!("booked {}", b)),
            ));
        let agent = Agent::builder("planner")
            .model(claude)
            .tools(tools)
            .build()
            .unwrap();
        let (sink, mut rx) = DeltaSink::channel();
        let mut request = RunRequest::new("Plan a night in Paris");
        if streamed {
            request = request.stream(sink);
        }
        let run = agent.oneshot(request).await.unwrap();
        assert_eq!(
            run.output,
            "Booked one night in Paris; it will be sunny and 21C."
        );
        assert_eq!((run.counters.turns, run.counters.tool_calls), (3, 2));
        let ids: Vec<_> = run
            .messages
            .iter()
            .filter_map(|m| m.tool_call_id.clone())
            .collect();
        assert_eq!(ids, ["call_weather", "call_hotel"]);
        assert_eq!(run.usage, Usage::new(180, 36), "streamed={streamed}");
        let mut deltas = 0;
        while rx.try_recv().is_ok() {
            deltas += 1;
        }
        assert_eq!(deltas > 0, streamed);
    }
}
