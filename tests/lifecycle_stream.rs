//! Streaming through the hooks, and wrap middleware as tower layers.

mod lifecycle_support;

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use lifecycle_support::run_with;
use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent::hooks::Compaction;
use tower_agent::lifecycle::{
    from_fn, Hook, Middleware, MiddlewareStack, ModelMiddleware, ModelNext, ToolNext,
    WrapModelLayer,
};
use tower_agent::types::{
    History, Message, ModelDelta, ModelRequest, ModelResponse, Role, ToolSpec,
};
use tower_agent::{
    Agent, AgentError, BoxError, DeltaSink, ModelCall, RunContext, RunRequest, ScriptedModel,
    ScriptedTurn, ToolDef, ToolInvocation, ToolOutput, ToolRouter,
};

/// Collects the text deltas the run streams.
fn collector() -> (DeltaSink, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink_seen = seen.clone();
    let sink = DeltaSink::new(move |delta| {
        if let ModelDelta::Text { text } = delta {
            sink_seen.lock().unwrap().push(text.clone());
        }
    });
    (sink, seen)
}

fn agent(turns: impl IntoIterator<Item = ScriptedTurn>) -> Agent {
    Agent::builder("a")
        .model(ScriptedModel::new(turns))
        .build()
        .unwrap()
}

struct Redact {
    hold: bool,
}

impl Middleware for Redact {
    fn name(&self) -> &str {
        "redact"
    }
    fn holds_stream(&self) -> bool {
        self.hold
    }
    fn after_model<'a>(&'a self, _: &'a RunContext, r: &'a mut ModelResponse) -> Hook<'a, ()> {
        let text = r.message.text().replace("bob@example.com", "[email]");
        r.message.set_text(text);
        Hook::ok(())
    }
}

const ANSWER: &str = "Write to bob@example.com today";

#[tokio::test]
async fn without_a_holding_middleware_deltas_stream_as_they_arrive() {
    let (sink, seen) = collector();
    let run = run_with(
        agent([ScriptedTurn::text(ANSWER).chunk_chars(8)]),
        MiddlewareStack::new().push(Redact { hold: false }),
        RunRequest::new("q").stream(sink),
    )
    .await
    .unwrap();
    assert_eq!(run.output, "Write to [email] today");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4);
    assert_eq!(
        seen.concat(),
        ANSWER,
        "text already sent cannot be taken back"
    );
}

#[tokio::test]
async fn a_holding_middleware_gets_the_final_text_sent_in_one_piece() {
    let (sink, seen) = collector();
    let run = run_with(
        agent([ScriptedTurn::text(ANSWER).chunk_chars(8)]),
        MiddlewareStack::new().push(Redact { hold: true }),
        RunRequest::new("q").stream(sink),
    )
    .await
    .unwrap();
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        std::slice::from_ref(&run.output)
    );
    assert_eq!(run.output, "Write to [email] today");
}

/// Asks the model twice and keeps the longer answer.
struct BestOfTwo {
    hold: bool,
}

impl ModelMiddleware for BestOfTwo {
    fn name(&self) -> &str {
        "best-of-two"
    }
    fn holds_stream(&self) -> bool {
        self.hold
    }
    fn wrap_model<'a>(
        &'a self,
        call: ModelCall,
        next: ModelNext,
    ) -> BoxFuture<'a, Result<ModelResponse, BoxError>> {
        Box::pin(async move {
            let first = next.clone().run(call.clone()).await?;
            let second = next.run(call).await?;
            Ok(
                if second.message.text().len() > first.message.text().len() {
                    second
                } else {
                    first
                },
            )
        })
    }
}

#[tokio::test]
async fn a_wrap_middleware_that_calls_twice_streams_both_unless_it_holds() {
    for hold in [false, true] {
        let (sink, seen) = collector();
        let run = run_with(
            agent([
                ScriptedTurn::text("short"),
                ScriptedTurn::text("the longer one"),
            ]),
            MiddlewareStack::new().push_model(BestOfTwo { hold }),
            RunRequest::new("q").stream(sink),
        )
        .await
        .unwrap();
        assert_eq!(run.output, "the longer one");
        let streamed = seen.lock().unwrap().concat();
        if hold {
            assert_eq!(streamed, "the longer one");
        } else {
            assert_eq!(streamed, "shortthe longer one");
        }
        // Both calls reached the model: both count.
        assert_eq!(run.usage.output_tokens, 2 + 4);
    }
}

/// Shouts the stream, and cuts it at a secret.
struct StreamGuard;

impl Middleware for StreamGuard {
    fn name(&self) -> &str {
        "stream-guard"
    }
    fn on_model_delta(&self, _: &RunContext, delta: &mut ModelDelta) -> Result<(), BoxError> {
        if let ModelDelta::Text { text } = delta {
            if text.contains("secret") {
                return Err(tower_agent::tripwire("a secret in the stream").into());
            }
            *text = text.to_uppercase();
        }
        Ok(())
    }
}

#[tokio::test]
async fn on_model_delta_changes_the_stream_and_cuts_it_on_error() {
    let (sink, seen) = collector();
    run_with(
        agent([ScriptedTurn::text("quiet words").chunk_chars(5)]),
        MiddlewareStack::new().push(StreamGuard),
        RunRequest::new("q").stream(sink),
    )
    .await
    .unwrap();
    assert_eq!(seen.lock().unwrap().concat(), "QUIET WORDS");

    let (sink, seen) = collector();
    let err = run_with(
        agent([ScriptedTurn::text("one two secret three").chunk_chars(8)]),
        MiddlewareStack::new().push(StreamGuard),
        RunRequest::new("q").stream(sink),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, AgentError::Tripwire { middleware, hook, .. }
        if middleware == "stream-guard" && hook == "on_model_delta"),
        "{err:?}"
    );
    // The delta before the secret went out; the stream stopped at it.
    assert_eq!(*seen.lock().unwrap(), ["ONE TWO "]);
}

/// A tool that streams its progress.
fn progress_tool() -> ToolDef {
    let service = tower::service_fn(|invocation: ToolInvocation| async move {
        if let Some(stream) = &invocation.stream {
            for step in ["25%", "50%", "100%"] {
                stream.send(&ModelDelta::text(step));
            }
        }
        Ok::<_, BoxError>(ToolOutput::text("exported"))
    });
    ToolDef::new(
        ToolSpec::new("export", "Exports", json!({"type": "object"})),
        service,
    )
}

struct Progress(Arc<Mutex<Vec<String>>>);

impl Middleware for Progress {
    fn name(&self) -> &str {
        "progress"
    }
    fn on_tool_delta(
        &self,
        _: &RunContext,
        call: &tower_agent::types::ToolCall,
        delta: &mut ModelDelta,
    ) -> Result<(), BoxError> {
        if let ModelDelta::Text { text } = delta {
            self.0.lock().unwrap().push(format!("{}:{text}", call.name));
        }
        Ok(())
    }
}

#[tokio::test]
async fn on_tool_delta_sees_a_tool_progress() {
    let seen = Arc::default();
    let agent = Agent::builder("a")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call("export", "{}"),
            ScriptedTurn::text("done"),
        ]))
        .tools(ToolRouter::new().tool(progress_tool()))
        .build()
        .unwrap();
    run_with(
        agent,
        MiddlewareStack::new().push(Progress(Arc::clone(&seen))),
        RunRequest::new("q"),
    )
    .await
    .unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        ["export:25%", "export:50%", "export:100%"]
    );
}

/// A tool that says whether it was handed a sink for its progress.
fn sink_probe() -> ToolDef {
    let service = tower::service_fn(|invocation: ToolInvocation| async move {
        Ok::<_, BoxError>(ToolOutput::text(match invocation.stream {
            Some(_) => "sink",
            None => "no sink",
        }))
    });
    ToolDef::new(
        ToolSpec::new("probe", "Probes", json!({"type": "object"})),
        service,
    )
}

/// The tool results of a run of `tools` called in turn, under a stack
/// with a delta hook.
async fn results_with_delta_hook(router: ToolRouter, calls: &[&str]) -> Vec<String> {
    let mut turns: Vec<ScriptedTurn> = calls
        .iter()
        .map(|name| ScriptedTurn::tool_call(*name, "{}"))
        .collect();
    turns.push(ScriptedTurn::text("done"));
    let agent = Agent::builder("a")
        .model(ScriptedModel::new(turns))
        .tools(router)
        .build()
        .unwrap();
    let run = run_with(
        agent,
        MiddlewareStack::new().push(Progress(Arc::default())),
        RunRequest::new("q"),
    )
    .await
    .unwrap();
    run.messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.text().into_owned())
        .collect()
}

#[tokio::test]
async fn a_tool_that_may_stream_gets_the_delta_hooks_sink_and_one_that_cannot_does_not() {
    // Any tool service may stream: it gets the sink even in a run nobody
    // streams, and a `tool_fn` beside it changes nothing.
    let quiet = tower_agent::tool_sync("quiet", "Says nothing", |_: serde_json::Value| {
        Ok::<_, BoxError>("ok")
    });
    let both = ToolRouter::new().tool(sink_probe()).tool(quiet.clone());
    assert_eq!(
        results_with_delta_hook(both, &["probe", "quiet"]).await,
        ["sink", "ok"]
    );
    // A service that declares it sends no progress is handed none to send on.
    let declared = ToolRouter::new()
        .tool(sink_probe().streams(false))
        .tool(quiet);
    assert_eq!(
        results_with_delta_hook(declared, &["probe", "quiet"]).await,
        ["no sink", "ok"]
    );
    // Decided per tool: one that may stream beside it does not change that.
    let silent = ToolDef::new(
        ToolSpec::new("silent", "Probes", json!({"type": "object"})),
        tower::service_fn(|invocation: ToolInvocation| async move {
            Ok::<_, BoxError>(ToolOutput::text(match invocation.stream {
                Some(_) => "sink",
                None => "no sink",
            }))
        }),
    )
    .streams(false);
    let mixed = ToolRouter::new().tool(sink_probe()).tool(silent);
    assert_eq!(
        results_with_delta_hook(mixed, &["probe", "silent", "probe"]).await,
        ["sink", "no sink", "sink"]
    );
}

/// `Next` drives `poll_ready` on what it calls: `ConcurrencyLimit` panics
/// when called without it. A cloned `Next` retries.
#[tokio::test]
async fn from_fn_next_is_clone_and_drives_readiness() {
    let model = ScriptedModel::new([
        ScriptedTurn::error(tower_agent::ErrorKind::Unavailable, "blip"),
        ScriptedTurn::text("second try"),
    ]);
    let retrying = ServiceBuilder::new()
        .layer(from_fn(|call: ModelCall, next: ModelNext| async move {
            match next.clone().run(call.clone()).await {
                Ok(response) => Ok(response),
                Err(_) => next.run(call).await,
            }
        }))
        .concurrency_limit(1)
        .service(model.clone());
    let agent = Agent::builder("a").model(retrying).build().unwrap();
    let run = agent.oneshot(RunRequest::new("q")).await.unwrap();
    assert_eq!(run.output, "second try");
    assert_eq!(model.requests().len(), 2);
}

#[tokio::test]
async fn from_fn_wraps_tools_and_can_answer_for_them() {
    let agent = Agent::builder("a")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call("export", "{}"),
            ScriptedTurn::text("done"),
        ]))
        .tools(ToolRouter::new().tool(progress_tool()))
        .tool_layer(from_fn(
            |invocation: ToolInvocation, next: ToolNext| async move {
                if invocation.call.name == "export" {
                    return Ok::<_, BoxError>(ToolOutput::text("exports are paused"));
                }
                next.run(invocation).await
            },
        ))
        .build()
        .unwrap();
    let run = agent.oneshot(RunRequest::new("q")).await.unwrap();
    let result = run.messages.iter().find(|m| m.role == Role::Tool).unwrap();
    assert_eq!(result.text(), "exports are paused");
}

#[tokio::test]
async fn a_model_middleware_is_a_tower_layer() {
    let model = ServiceBuilder::new()
        .layer(WrapModelLayer::new(BestOfTwo { hold: false }))
        .service(ScriptedModel::new([
            ScriptedTurn::text("a"),
            ScriptedTurn::text("bbb"),
        ]));
    let call = ModelCall::new(
        ModelRequest::new("m", vec![Message::user("q")]),
        RunContext::new(),
    );
    let response = model.oneshot(call).await.unwrap();
    assert_eq!(response.message.text(), "bbb");
}

/// Keeps the run on its model and a full history.
struct Pin;

impl Middleware for Pin {
    fn name(&self) -> &str {
        "pin"
    }
    fn before_model_switch<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a str,
        to: &'a str,
    ) -> Hook<'a, bool> {
        Hook::ok(to != "expensive")
    }
    fn before_compaction<'a>(&'a self, _: &'a RunContext, messages: &'a History) -> Hook<'a, bool> {
        Hook::ok(messages.len() > 3)
    }
    fn after_compaction<'a>(&'a self, ctx: &'a RunContext, c: &'a Compaction) -> Hook<'a, ()> {
        ctx.log_event("compacted", json!({"by": c.by, "after": c.messages_after}));
        Hook::ok(())
    }
}

/// A model stack that asks the hooks as a fallback or compaction layer
/// would, and answers with what they said.
#[tokio::test]
async fn model_switch_and_compaction_hooks_answer_whoever_asks() {
    let model = ServiceBuilder::new()
        .layer(from_fn(|call: ModelCall, next: ModelNext| async move {
            let ctx = call.context.clone();
            use tower_agent::hooks::{before_compaction, before_model_switch};
            let cheap = before_model_switch(&ctx, "main", "cheap").await?;
            let expensive = before_model_switch(&ctx, "main", "expensive").await?;
            let compact = before_compaction(&ctx, &call.request.messages).await?;
            let mut response = next.run(call).await?;
            response.message.set_text(format!(
                "cheap={cheap} expensive={expensive} compact={compact}"
            ));
            Ok::<_, BoxError>(response)
        }))
        .service(ScriptedModel::new([ScriptedTurn::text("")]));
    let agent = Agent::builder("a").model(model).build().unwrap();
    let run = run_with(
        agent,
        MiddlewareStack::new().push(Pin),
        RunRequest::new("q"),
    )
    .await
    .unwrap();
    assert_eq!(run.output, "cheap=true expensive=false compact=false");
}
