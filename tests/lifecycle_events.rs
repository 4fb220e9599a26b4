//! Events bracket every hook, balanced under errors and panics; what an error
//! does; the run is bracketed exactly once whatever fails.

mod lifecycle_support;

use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::{ready, Ready};
use lifecycle_support::{observed, outcomes, run_with, unbalanced, Act, Log, Lookup, Recorder};
use serde_json::json;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_agent::event::AgentEvent;
use tower_agent::hooks::Compaction;
use tower_agent::lifecycle::{
    from_fn, Hook, HookPoint, LifecycleLayer, LoggingMiddleware, Middleware, MiddlewareStack,
    ModelNext,
};
use tower_agent::types::{ApprovalDecision, ModelDelta, ModelResponse, Role, ToolSpec};
use tower_agent::{
    tool_sync, Agent, AgentError, BoxError, DeltaSink, ModelCall, RunContext, RunRequest,
    ScriptedModel, ScriptedTurn, ToolDef, ToolInvocation, ToolOutput, ToolRouter,
};

/// A tool that streams one progress delta, then answers.
#[derive(Clone)]
struct StreamingTool;

impl Service<ToolInvocation> for StreamingTool {
    type Response = ToolOutput;
    type Error = BoxError;
    type Future = Ready<Result<ToolOutput, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, invocation: ToolInvocation) -> Self::Future {
        if let Some(stream) = &invocation.stream {
            stream.send(&ModelDelta::text("50%"));
        }
        ready(Ok(ToolOutput::text("found")))
    }
}

/// An agent whose run reaches every hook point: it streams, a tool streams
/// progress, a tool asks for approval (the approver grants it), and the
/// model stack asks the compaction and model-switch hooks, as a compaction
/// or fallback layer would.
fn everything_agent() -> Agent {
    let scripted = ScriptedModel::from_fn(|request| {
        if request
            .messages
            .last()
            .is_some_and(|m| m.role == Role::Tool)
        {
            ScriptedTurn::text("done")
        } else {
            ScriptedTurn::tool_calls([
                tower_agent::types::ToolCall::new("", "stream", r#"{"id": "1"}"#),
                tower_agent::types::ToolCall::new("", "guarded", r#"{"id": "2"}"#),
            ])
        }
    });
    let model = ServiceBuilder::new()
        .layer(from_fn(|call: ModelCall, next: ModelNext| async move {
            {
                let ctx = &call.context;
                if tower_agent::hooks::before_compaction(ctx, &call.request.messages).await? {
                    let compaction = Compaction {
                        by: "compactor".into(),
                        messages_before: 3,
                        messages_after: 3,
                        summary: None,
                    };
                    tower_agent::hooks::after_compaction(ctx, &compaction).await?;
                }
                tower_agent::hooks::before_model_switch(ctx, "small", "large").await?;
            }
            next.run(call).await
        }))
        .service(scripted);
    let tools = ToolRouter::new()
        .tool(ToolDef::new(
            ToolSpec::new("stream", "Streams", json!({"type": "object"})),
            StreamingTool,
        ))
        .tool(
            tool_sync("guarded", "Needs approval", |l: Lookup| {
                Ok::<_, BoxError>(format!("ok {}", l.id))
            })
            .requires_approval(),
        );
    Agent::builder("everything")
        .model(model)
        .tools(tools)
        .approver(|call, _ctx| async move { Some(ApprovalDecision::approve(&call)) })
        .build()
        .unwrap()
}

fn streamed(ctx: RunContext) -> RunRequest {
    RunRequest::new("go")
        .context(ctx)
        .stream(DeltaSink::new(|_| {}))
}

#[tokio::test]
async fn the_scenario_reaches_every_hook_point() {
    let log = Log::default();
    let (ctx, sink) = observed();
    let run = run_with(
        everything_agent(),
        Recorder::new("r", &log).stack(),
        streamed(ctx),
    )
    .await
    .unwrap();
    assert_eq!(run.output, "done");
    let entries = log.entries();
    for hook in HookPoint::ALL {
        if hook == HookPoint::OnError {
            continue; // only a failing run reaches it: see below
        }
        assert!(
            entries.iter().any(|e| e.starts_with(&format!("r:{hook}"))),
            "{hook} was not reached: {entries:?}"
        );
    }
    assert!(unbalanced(&sink.events()).is_empty());
}

/// At every hook point, an `Err` and a panic, from a synchronous hook and
/// from inside its future: events stay balanced, the run fails with a typed
/// error naming the middleware and the hook, the process goes on.
#[tokio::test]
async fn events_stay_balanced_under_errors_and_panics_at_every_hook() {
    for hook in HookPoint::ALL {
        for act in [Act::Fail, Act::Panic] {
            for pending in [false, true] {
                let label = format!("{hook} {act:?} pending={pending}");
                let log = Log::default();
                let mut target = Recorder::new("target", &log).at(hook, act);
                if pending {
                    target = target.pending();
                }
                let mut stack = MiddlewareStack::new()
                    .push(LoggingMiddleware::named("observer"))
                    .extend(target.stack());
                if hook == HookPoint::OnError {
                    // Something must fail first for on_error to run.
                    stack = Recorder::new("trigger", &log)
                        .at(HookPoint::BeforeModel, Act::Fail)
                        .stack()
                        .extend(stack);
                }
                let (ctx, sink) = observed();
                let result = run_with(everything_agent(), stack, streamed(ctx)).await;
                let events = sink.events();
                assert_eq!(unbalanced(&events), [], "{label}");

                match hook {
                    HookPoint::AfterAgent => {
                        assert!(result.is_ok(), "{label}: the caller keeps the result");
                    }
                    HookPoint::OnError => {
                        let err = result.unwrap_err();
                        assert!(
                            matches!(&err, AgentError::Middleware { middleware, .. } if middleware == "trigger"),
                            "{label}: the original error is returned, got {err}"
                        );
                    }
                    HookPoint::WrapModel if act == Act::Fail => {
                        // A model wrap middleware's error passes on as it is.
                        let err = result.unwrap_err();
                        assert!(
                            err.to_string().contains("target failed in wrap_model"),
                            "{label}: {err}"
                        );
                    }
                    _ => {
                        let err = result.unwrap_err();
                        let AgentError::Middleware {
                            middleware,
                            hook: h,
                            source,
                        } = &err
                        else {
                            panic!("{label}: expected a middleware error, got {err:?}");
                        };
                        assert_eq!(
                            (middleware.as_str(), h.as_str()),
                            ("target", hook.as_str()),
                            "{label}"
                        );
                        assert_eq!(err.code(), "MIDDLEWARE_FAILED");
                        if act == Act::Panic {
                            assert!(
                                source.to_string().starts_with("panicked: target panicked"),
                                "{label}: {source}"
                            );
                        }
                    }
                }

                let expected = if act == Act::Fail { "error" } else { "panic" };
                if matches!(hook, HookPoint::OnModelDelta | HookPoint::OnToolDelta) {
                    assert!(
                        outcomes(&events, hook.as_str()).is_empty(),
                        "{label}: delta hooks emit no events"
                    );
                } else {
                    assert!(
                        outcomes(&events, hook.as_str()).contains(&expected),
                        "{label}: {:?}",
                        outcomes(&events, hook.as_str())
                    );
                }
                // Every middleware was told the run ended.
                assert!(
                    log.entries()
                        .iter()
                        .any(|e| e.starts_with("target:after_agent:")),
                    "{label}"
                );
            }
        }
    }
}

#[tokio::test]
async fn on_model_delta_runs_per_delta_without_events() {
    let logging = LoggingMiddleware::new();
    let (ctx, sink) = observed();
    let agent = Agent::builder("a")
        .model(ScriptedModel::new([ScriptedTurn::text(
            "a long enough answer",
        )
        .chunk_chars(4)]))
        .build()
        .unwrap();
    run_with(
        agent,
        MiddlewareStack::new().push(logging.clone()),
        streamed(ctx),
    )
    .await
    .unwrap();
    assert_eq!(logging.counts().get(HookPoint::OnModelDelta), 5);
    assert!(outcomes(&sink.events(), "on_model_delta").is_empty());
    assert_eq!(outcomes(&sink.events(), "before_model"), ["ok"]);
}

/// The first error short-circuits: on_error runs on every middleware (their
/// own errors ignored), then after_agent, and the original error comes back.
#[tokio::test]
async fn on_error_reaches_every_middleware_and_cannot_mask_the_error() {
    let log = Log::default();
    let stack = MiddlewareStack::new()
        .push(Recorder::new("a", &log).at(HookPoint::OnError, Act::Fail))
        .push(Recorder::new("b", &log).at(HookPoint::BeforeModel, Act::Fail))
        .push(Recorder::new("c", &log).at(HookPoint::OnError, Act::Panic));
    let (ctx, sink) = observed();
    let agent = Agent::builder("a")
        .model(ScriptedModel::new([ScriptedTurn::text("never")]))
        .build()
        .unwrap();
    let err = run_with(agent, stack, RunRequest::new("go").context(ctx))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::Middleware { middleware, hook, .. }
        if middleware == "b" && hook == "before_model")
    );
    let entries = log.entries();
    // c never saw before_model: b short-circuited.
    assert!(!entries.contains(&"c:before_model".to_owned()));
    let closing: Vec<&str> = entries
        .iter()
        .filter(|e| e.contains("on_error") || e.contains("after_agent"))
        .map(String::as_str)
        .collect();
    assert_eq!(
        closing,
        [
            "c:on_error",
            "b:on_error",
            "a:on_error",
            "c:after_agent:failed",
            "b:after_agent:failed",
            "a:after_agent:failed"
        ]
    );
    let ignored: Vec<String> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::MiddlewareFailedOpen {
                middleware, hook, ..
            } => Some(format!("{middleware}:{hook}")),
            _ => None,
        })
        .collect();
    assert_eq!(ignored, ["c:on_error", "a:on_error"]);
}

#[tokio::test]
async fn an_after_agent_error_is_logged_and_the_next_still_runs() {
    let log = Log::default();
    let stack = MiddlewareStack::new()
        .push(Recorder::new("a", &log))
        .push(Recorder::new("b", &log).at(HookPoint::AfterAgent, Act::Panic))
        .push(Recorder::new("c", &log).at(HookPoint::AfterAgent, Act::Fail));
    let (ctx, sink) = observed();
    let agent = Agent::builder("a")
        .model(ScriptedModel::new([ScriptedTurn::text("kept")]))
        .build()
        .unwrap();
    let run = run_with(agent, stack, RunRequest::new("go").context(ctx))
        .await
        .unwrap();
    assert_eq!(run.output, "kept");
    let after: Vec<String> = log
        .entries()
        .into_iter()
        .filter(|e| e.contains("after_agent"))
        .collect();
    assert_eq!(
        after,
        [
            "c:after_agent:completed",
            "b:after_agent:completed",
            "a:after_agent:completed"
        ]
    );
    let failed_open = sink
        .events()
        .iter()
        .filter(|e| {
            matches!(
                e,
                AgentEvent::MiddlewareFailedOpen {
                    hook: "after_agent",
                    ..
                }
            )
        })
        .count();
    assert_eq!(failed_open, 2);
    assert!(unbalanced(&sink.events()).is_empty());
}

#[tokio::test]
async fn a_fail_open_middleware_never_fails_the_run_but_its_tripwire_does() {
    let log = Log::default();
    let (ctx, sink) = observed();
    let agent = || {
        Agent::builder("a")
            .model(ScriptedModel::new([ScriptedTurn::text("fine")]))
            .build()
            .unwrap()
    };
    let observer = Recorder::new("observer", &log)
        .fail_open()
        .at(HookPoint::BeforeModel, Act::Panic)
        .at(HookPoint::AfterModel, Act::Fail);
    let run = run_with(
        agent(),
        MiddlewareStack::new().push(observer),
        RunRequest::new("go").context(ctx),
    )
    .await
    .unwrap();
    assert_eq!(run.output, "fine");
    let logged: Vec<&'static str> = sink
        .events()
        .iter()
        .filter_map(|e| match e {
            AgentEvent::MiddlewareFailedOpen { hook, .. } => Some(*hook),
            _ => None,
        })
        .collect();
    assert_eq!(logged, ["before_model", "after_model"]);

    let guard = Recorder::new("open-guard", &log)
        .fail_open()
        .at(HookPoint::BeforeModel, Act::Trip);
    let err = run_with(
        agent(),
        MiddlewareStack::new().push(guard),
        RunRequest::new("go"),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "GUARDRAIL_TRIPPED");
}

/// A run service that fails without ever running the loop.
#[derive(Clone)]
struct Broken;

impl Service<RunRequest> for Broken {
    type Response = tower_agent::AgentRun;
    type Error = BoxError;
    type Future = Ready<Result<tower_agent::AgentRun, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: RunRequest) -> Self::Future {
        ready(Err("the backend is down".into()))
    }
}

fn bracket_counts(log: &Log) -> (usize, usize, usize) {
    let entries = log.entries();
    let count = |p: &str| entries.iter().filter(|e| e.starts_with(p)).count();
    (
        count("m:before_agent"),
        count("m:on_error"),
        count("m:after_agent:failed"),
    )
}

#[tokio::test]
async fn the_bracket_closes_once_when_the_inner_service_fails() {
    let log = Log::default();
    let service =
        LifecycleLayer::new(MiddlewareStack::new().push(Recorder::new("m", &log))).layer(Broken);
    let err = service.oneshot(RunRequest::new("go")).await.unwrap_err();
    assert_eq!(err.to_string(), "the backend is down");
    assert_eq!(bracket_counts(&log), (1, 1, 1));
}

#[tokio::test]
async fn the_bracket_closes_once_when_a_layer_between_refuses() {
    let log = Log::default();
    let agent = Agent::builder("a")
        .model(ScriptedModel::new([ScriptedTurn::text("never")]))
        .build()
        .unwrap();
    let service = ServiceBuilder::new()
        .layer(LifecycleLayer::new(
            MiddlewareStack::new().push(Recorder::new("m", &log)),
        ))
        .filter(|_: RunRequest| -> Result<RunRequest, BoxError> { Err("refused".into()) })
        .service(agent);
    let err = service.oneshot(RunRequest::new("go")).await.unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    assert_eq!(bracket_counts(&log), (1, 1, 1));
    assert!(!log.entries().contains(&"m:before_model".to_owned()));
}

#[tokio::test(start_paused = true)]
async fn the_bracket_closes_once_when_a_timeout_between_drops_the_run() {
    let log = Log::default();
    let agent = Agent::builder("a")
        .model(ScriptedModel::new([
            ScriptedTurn::text("too late").delay(Duration::from_secs(60))
        ]))
        .build()
        .unwrap();
    let (ctx, sink) = observed();
    let service = ServiceBuilder::new()
        .layer(LifecycleLayer::new(
            MiddlewareStack::new().push(Recorder::new("m", &log)),
        ))
        .timeout(Duration::from_secs(1))
        .service(agent);
    let err = service
        .oneshot(RunRequest::new("go").context(ctx))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "TIMEOUT");
    assert_eq!(bracket_counts(&log), (1, 1, 1));
    assert!(unbalanced(&sink.events()).is_empty());
}

/// Overrides `before_model` and `after_model`, and declares nothing.
struct Undeclared;

impl Middleware for Undeclared {
    fn name(&self) -> &str {
        "undeclared"
    }

    fn before_model<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a mut tower_agent::types::History,
    ) -> Hook<'a, ()> {
        Hook::ok(())
    }

    fn after_model<'a>(&'a self, _: &'a RunContext, r: &'a mut ModelResponse) -> Hook<'a, ()> {
        r.message.set_text("changed");
        Hook::ok(())
    }
}

/// No declaration can leave an override out: every overridden hook runs,
/// in debug and release builds alike, and the defaults cost no event.
#[tokio::test]
async fn every_override_runs_without_a_declaration() {
    let agent = Agent::builder("a")
        .model(ScriptedModel::new([ScriptedTurn::text("hi")]))
        .build()
        .unwrap();
    let sink = tower_agent::event::CollectingSink::new();
    let ctx = tower_agent::RunContext::builder()
        .events(sink.clone())
        .build();
    let run = run_with(
        agent,
        MiddlewareStack::new().push(Undeclared),
        RunRequest::new("go").context(ctx),
    )
    .await
    .unwrap();
    assert_eq!(run.output, "changed");
    let hooks: Vec<&str> = sink
        .events()
        .iter()
        .filter_map(|e| match e {
            tower_agent::event::AgentEvent::MiddlewareStarted { hook, .. } => Some(*hook),
            _ => None,
        })
        .collect();
    assert_eq!(hooks, ["before_model", "after_model"]);
}
