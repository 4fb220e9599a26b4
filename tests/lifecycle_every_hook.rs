//! Every hook point, overridden without any declaration, runs and changes
//! what it may change. CI runs this file in release builds too, where a
//! hook skipped by mistake would fail open.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::future::{ready, Ready};
use serde_json::json;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_agent::hooks::{
    after_compaction, before_compaction, before_model_switch, Compaction, Notification, RunOutcome,
    RunStart, ToolCallResult, ToolVerdict,
};
use tower_agent::lifecycle::{
    from_fn, Hook, LifecycleLayer, Middleware, MiddlewareStack, ModelNext, ToolNext, Wrapped,
};
use tower_agent::types::{
    ApprovalDecision, History, Message, ModelDelta, ModelResponse, Role, ToolCall, ToolSpec,
};
use tower_agent::{
    Agent, AgentError, BoxError, DeltaSink, ModelCall, RunContext, RunRequest, ScriptedModel,
    ScriptedTurn, ToolDef, ToolInvocation, ToolOutput, ToolRouter,
};

/// What the hooks saw, in order.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<String>>>);

impl Seen {
    fn push(&self, entry: impl Into<String>) {
        self.0.lock().unwrap().push(entry.into());
    }

    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn has(&self, prefix: &str) -> bool {
        self.all().iter().any(|e| e.starts_with(prefix))
    }
}

/// Overrides every hook point, and declares nothing.
struct Everything {
    seen: Seen,
}

impl Middleware for Everything {
    fn name(&self) -> &str {
        "everything"
    }

    fn before_agent<'a>(&'a self, _: &'a RunContext, start: RunStart) -> Hook<'a, Option<String>> {
        self.seen
            .push(format!("before_agent resumed={}", start.resumed));
        Hook::ok(Some("from before_agent".into()))
    }

    fn before_run<'a>(
        &'a self,
        _: &'a RunContext,
        input: &'a mut Message,
        _: &'a History,
    ) -> Hook<'a, Option<String>> {
        self.seen.push("before_run");
        input.set_text(format!("{} [checked]", input.text()));
        Hook::ok(None)
    }

    fn before_model<'a>(&'a self, ctx: &'a RunContext, messages: &'a mut History) -> Hook<'a, ()> {
        self.seen.push("before_model");
        if ctx.iteration() == 1 {
            messages.push(Message::system("from before_model"));
        }
        // An async hook: boxed, awaited.
        Hook::new(async { Ok(()) })
    }

    fn wrap_model<'a>(&'a self, mut call: ModelCall, next: ModelNext) -> Wrapped<'a, ModelCall> {
        self.seen.push("wrap_model");
        call.request.settings_mut().temperature = Some(0.25);
        Wrapped::new(next.run(call))
    }

    fn on_model_delta(&self, _: &RunContext, delta: &mut ModelDelta) -> Result<(), BoxError> {
        if let ModelDelta::Text { text } = delta {
            *text = text.to_uppercase();
        }
        self.seen.push("on_model_delta");
        Ok(())
    }

    fn after_model<'a>(&'a self, _: &'a RunContext, r: &'a mut ModelResponse) -> Hook<'a, ()> {
        self.seen.push("after_model");
        if r.message.tool_calls.is_empty() && r.message.text() == "final" {
            r.message.set_text("final, after_model");
        }
        Hook::ok(())
    }

    fn before_tool<'a>(
        &'a self,
        _: &'a RunContext,
        call: &'a ToolCall,
        resumed: bool,
    ) -> Hook<'a, ToolVerdict> {
        self.seen
            .push(format!("before_tool {} resumed={resumed}", call.name));
        Hook::ok(match call.name.as_str() {
            "forbidden" => ToolVerdict::deny("not here"),
            "later" => ToolVerdict::decision(tower_agent::hooks::ToolDecision::Defer),
            _ => ToolVerdict::proceed(),
        })
    }

    fn decide_approval<'a>(
        &'a self,
        _: &'a RunContext,
        call: &'a ToolCall,
    ) -> Hook<'a, Option<ApprovalDecision>> {
        self.seen.push(format!("decide_approval {}", call.name));
        Hook::ok(Some(ApprovalDecision::approve(call)))
    }

    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> Wrapped<'a, ToolInvocation> {
        self.seen
            .push(format!("wrap_tool {}", invocation.call.name));
        Wrapped::new(async move {
            let mut output = next.run(invocation).await?;
            output.content.push_str(" (wrapped)");
            Ok(output)
        })
    }

    fn on_tool_delta(
        &self,
        _: &RunContext,
        call: &ToolCall,
        delta: &mut ModelDelta,
    ) -> Result<(), BoxError> {
        if let ModelDelta::Text { text } = delta {
            self.seen
                .push(format!("on_tool_delta {} {text}", call.name));
        }
        Ok(())
    }

    fn after_tool<'a>(
        &'a self,
        _: &'a RunContext,
        call: &'a ToolCall,
        output: &'a mut ToolOutput,
    ) -> Hook<'a, ()> {
        self.seen.push(format!("after_tool {}", call.name));
        output.content.push_str(" (after_tool)");
        Hook::ok(())
    }

    fn after_tool_batch<'a>(
        &'a self,
        ctx: &'a RunContext,
        results: &'a [ToolCallResult<'a>],
    ) -> Hook<'a, ()> {
        self.seen
            .push(format!("after_tool_batch {}", results.len()));
        ctx.add_context("from after_tool_batch");
        Hook::ok(())
    }

    fn before_stop<'a>(
        &'a self,
        _: &'a RunContext,
        output: &'a Message,
        continuations: u32,
    ) -> Hook<'a, Option<String>> {
        self.seen.push(format!("before_stop {continuations}"));
        Hook::ok((continuations == 0 && output.text() == "almost").then(|| "keep going".into()))
    }

    fn before_compaction<'a>(&'a self, _: &'a RunContext, m: &'a History) -> Hook<'a, bool> {
        self.seen.push(format!("before_compaction {}", m.len()));
        Hook::ok(false)
    }

    fn after_compaction<'a>(&'a self, _: &'a RunContext, c: &'a Compaction) -> Hook<'a, ()> {
        self.seen.push(format!("after_compaction {}", c.by));
        Hook::ok(())
    }

    fn before_model_switch<'a>(
        &'a self,
        _: &'a RunContext,
        from: &'a str,
        to: &'a str,
    ) -> Hook<'a, bool> {
        self.seen.push(format!("before_model_switch {from}->{to}"));
        Hook::ok(to != "blocked")
    }

    fn on_notification<'a>(&'a self, _: &'a RunContext, n: &'a Notification) -> Hook<'a, ()> {
        if let Notification::Paused { pending } = n {
            self.seen
                .push(format!("on_notification paused {}", pending.len()));
        }
        Hook::ok(())
    }

    fn on_error<'a>(&'a self, _: &'a RunContext, error: &'a AgentError) -> Hook<'a, ()> {
        self.seen.push(format!("on_error {}", error.code()));
        Hook::ok(())
    }

    fn after_agent<'a>(&'a self, _: &'a RunContext, outcome: RunOutcome<'a>) -> Hook<'a, ()> {
        self.seen.push(format!("after_agent {}", outcome.status()));
        Hook::ok(())
    }
}

/// Sends one progress delta, then answers.
#[derive(Clone)]
struct Progress;

impl Service<ToolInvocation> for Progress {
    type Response = ToolOutput;
    type Error = BoxError;
    type Future = Ready<Result<ToolOutput, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, invocation: ToolInvocation) -> Self::Future {
        if let Some(stream) = &invocation.stream {
            stream.send(&ModelDelta::text("half"));
        }
        ready(Ok(ToolOutput::text("progress done")))
    }
}

fn tools() -> ToolRouter {
    let spec = |name: &str| ToolSpec::new(name, name, json!({"type": "object"}));
    ToolRouter::new()
        .tool(ToolDef::new(spec("progress"), Progress))
        .tool(ToolDef::new(spec("guarded"), Progress).requires_approval())
        .tool(ToolDef::new(spec("forbidden"), Progress))
        .tool(ToolDef::new(spec("later"), Progress))
}

/// Turn 1 calls three tools, turn 2 says "almost" (before_stop keeps it
/// going), turn 3 answers "final". The model stack asks the compaction and
/// model-switch hooks, as a compaction or fallback layer would.
fn agent(model: ScriptedModel) -> Agent {
    let asking = ServiceBuilder::new()
        .layer(from_fn(|call: ModelCall, next: ModelNext| async move {
            let ctx = call.context.clone();
            if ctx.iteration() == 1 {
                assert!(!before_compaction(&ctx, &call.request.messages).await?);
                let compaction = Compaction {
                    by: "compactor".into(),
                    messages_before: 2,
                    messages_after: 2,
                    summary: None,
                };
                after_compaction(&ctx, &compaction).await?;
                assert!(before_model_switch(&ctx, "main", "spare").await?);
                assert!(!before_model_switch(&ctx, "main", "blocked").await?);
            }
            next.run(call).await
        }))
        .service(model);
    Agent::builder("every-hook")
        .instructions("Be brief.")
        .model(asking)
        .tools(tools())
        .build()
        .unwrap()
}

fn script() -> ScriptedModel {
    ScriptedModel::new([
        ScriptedTurn::tool_calls([
            ToolCall::new("c1", "progress", "{}"),
            ToolCall::new("c2", "guarded", "{}"),
            ToolCall::new("c3", "forbidden", "{}"),
        ]),
        ScriptedTurn::text("almost"),
        ScriptedTurn::text("final"),
    ])
}

#[tokio::test]
async fn every_hook_point_runs_without_a_declaration() {
    let seen = Seen::default();
    let model = script();
    let layered =
        LifecycleLayer::new(MiddlewareStack::new().push(Everything { seen: seen.clone() }))
            .layer(agent(model.clone()));
    let (sink, mut deltas) = DeltaSink::channel();
    let run = layered
        .oneshot(RunRequest::new("hello").stream(sink))
        .await
        .unwrap();

    // after_model changed the final answer; before_stop made the third turn.
    assert_eq!(run.output, "final, after_model");
    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    let first = &requests[0];
    // before_agent: after the system prompt, this run only.
    assert_eq!(first.messages[1].text(), "from before_agent");
    // before_run: changed the input.
    assert!(first.messages.iter().any(|m| m.text() == "hello [checked]"));
    // before_model: added a message.
    assert!(first
        .messages
        .iter()
        .any(|m| m.text() == "from before_model"));
    // wrap_model: every call at temperature 0.25.
    assert!(requests
        .iter()
        .all(|r| r.settings.temperature == Some(0.25)));
    // wrap_tool, after_tool, before_tool (deny), decide_approval (the
    // guarded tool ran), on_tool_delta (saw the progress).
    let tool_text = |id: &str| {
        requests[1]
            .messages
            .iter()
            .find(|m| m.role == Role::Tool && m.tool_call_id.as_deref() == Some(id))
            .map(|m| m.text().into_owned())
            .unwrap()
    };
    assert_eq!(tool_text("c1"), "progress done (wrapped) (after_tool)");
    assert_eq!(tool_text("c2"), "progress done (wrapped) (after_tool)");
    assert!(
        tool_text("c3").contains("denied: not here"),
        "{}",
        tool_text("c3")
    );
    assert!(seen.has("decide_approval guarded"));
    assert!(seen.has("on_tool_delta progress half"));
    // after_tool_batch: its context reached the second request.
    assert!(requests[1]
        .messages
        .iter()
        .any(|m| m.text() == "from after_tool_batch"));
    // before_stop: kept the run going with a user message.
    assert!(requests[2]
        .messages
        .iter()
        .any(|m| m.text() == "keep going"));
    // The compaction and model-switch hooks answered the layer that asked.
    assert!(seen.has("before_compaction"));
    assert!(seen.has("after_compaction compactor"));
    assert!(seen.has("before_model_switch main->spare"));
    assert!(seen.has("before_model_switch main->blocked"));
    // on_model_delta: the streamed text reached the caller upper-cased.
    let mut streamed = String::new();
    while let Ok(delta) = deltas.try_recv() {
        if let ModelDelta::Text { text } = delta {
            streamed.push_str(&text);
        }
    }
    assert!(streamed.contains("FINAL"), "{streamed}");
    assert!(!streamed.contains("final"), "{streamed}");
    assert!(seen.has("on_model_delta"));
    // after_agent closed the run once.
    assert_eq!(
        seen.all()
            .iter()
            .filter(|e| e.starts_with("after_agent"))
            .count(),
        1
    );
    assert!(seen.has("after_agent completed"));
    assert!(seen.has("before_agent resumed=false"));
}

#[tokio::test]
async fn a_pause_notifies_and_a_failure_reaches_on_error() {
    let seen = Seen::default();
    let stack = MiddlewareStack::new().push(Everything { seen: seen.clone() });

    // before_tool defers: the run pauses and on_notification hears it.
    let model = ScriptedModel::new([ScriptedTurn::tool_call("later", "{}")]);
    let paused = LifecycleLayer::new(stack.clone())
        .layer(agent(model))
        .oneshot(RunRequest::new("hi"))
        .await
        .unwrap();
    assert_eq!(paused.status.as_str(), "paused");
    assert!(seen.has("on_notification paused 1"));
    assert!(seen.has("after_agent paused"));

    // The model fails: on_error sees it, after_agent closes the run.
    let failing = ScriptedModel::new([ScriptedTurn::error(
        tower_agent::ErrorKind::InvalidRequest,
        "no",
    )]);
    let err = LifecycleLayer::new(stack)
        .layer(agent(failing))
        .oneshot(RunRequest::new("hi"))
        .await
        .unwrap_err();
    assert!(seen.has(&format!("on_error {}", err.code())));
    assert!(seen.has("after_agent failed"));
}

#[tokio::test]
async fn the_closures_run_too() {
    let seen = Seen::default();
    let (a, b, c, d, e, f) = (
        seen.clone(),
        seen.clone(),
        seen.clone(),
        seen.clone(),
        seen.clone(),
        seen.clone(),
    );
    let stack = MiddlewareStack::new()
        .before_run("guard", move |_, input| {
            a.push(format!("before_run {}", input.text()));
            Ok::<_, BoxError>(())
        })
        .before_model("reminder", move |_, messages| {
            b.push("before_model");
            messages.push(Message::system("reminder"));
            Ok::<_, BoxError>(())
        })
        .after_model("shout", move |_, response| {
            c.push("after_model");
            let text = response.message.text().to_uppercase();
            response.message.set_text(text);
            Ok::<_, BoxError>(())
        })
        .before_tool_async("deny-forbidden", move |_ctx, call| {
            let d = d.clone();
            async move {
                d.push(format!("before_tool {}", call.name));
                Ok::<_, BoxError>(if call.name == "forbidden" {
                    ToolVerdict::deny("no")
                } else {
                    ToolVerdict::proceed()
                })
            }
        })
        .after_tool("tag", move |_, call, output| {
            e.push(format!("after_tool {}", call.name));
            output.content.push_str(" [tagged]");
            Ok::<_, BoxError>(())
        })
        .after_agent("audit", move |_, outcome| {
            f.push(format!("after_agent {}", outcome.status()));
            Ok::<_, BoxError>(())
        });
    let model = ScriptedModel::new([
        ScriptedTurn::tool_calls([
            ToolCall::new("c1", "progress", "{}"),
            ToolCall::new("c2", "forbidden", "{}"),
        ]),
        ScriptedTurn::text("done"),
    ]);
    let agent = Agent::builder("closures")
        .model(model.clone())
        .tools(tools())
        .middleware(stack)
        .build()
        .unwrap();
    let run = agent.run("go").await.unwrap();
    assert_eq!(run.output, "DONE");
    let second = &model.requests()[1];
    assert!(second
        .messages
        .iter()
        .any(|m| m.text() == "progress done [tagged]"));
    assert!(second.messages.iter().any(|m| m.text() == "reminder"));
    assert!(seen.has("before_run go"));
    assert!(seen.has("before_tool forbidden"));
    assert!(seen.has("after_agent completed"));
}

#[tokio::test]
async fn the_async_closures_run_too() {
    let seen = Seen::default();
    let (a, b, c, d, e, f, g) = (
        seen.clone(),
        seen.clone(),
        seen.clone(),
        seen.clone(),
        seen.clone(),
        seen.clone(),
        seen.clone(),
    );
    let stack = MiddlewareStack::new()
        .before_run_async("guard", move |_, input| {
            a.push(format!("before_run {}", input.text()));
            async move { Ok::<_, BoxError>(Message::user(format!("{} now", input.text()))) }
        })
        .before_model_async("reminder", move |_, messages| {
            b.push("before_model");
            async move {
                let mut messages = messages;
                messages.push(Message::system("reminder"));
                Ok::<_, BoxError>(messages)
            }
        })
        .after_model_async("shout", move |_, response| {
            c.push("after_model");
            async move {
                let mut response = response;
                let text = response.message.text().to_uppercase();
                response.message.set_text(text);
                Ok::<_, BoxError>(response)
            }
        })
        .before_tool_async("deny-forbidden", move |_, call| {
            d.push(format!("before_tool {}", call.name));
            async move {
                Ok::<_, BoxError>(if call.name == "forbidden" {
                    ToolVerdict::deny("no")
                } else {
                    ToolVerdict::proceed()
                })
            }
        })
        .after_tool_async("tag", move |_, call, output| {
            e.push(format!("after_tool {}", call.name));
            async move {
                let mut output = output;
                output.content.push_str(" [tagged]");
                Ok::<_, BoxError>(output)
            }
        })
        .after_agent_async("audit", move |_, outcome| {
            let (f, status) = (f.clone(), outcome.status());
            async move {
                f.push(format!("after_agent {status}"));
                Ok::<_, BoxError>(())
            }
        })
        .on_error_async("pager", move |_, err| {
            let (g, code) = (g.clone(), err.code());
            async move {
                g.push(format!("on_error {code}"));
                Ok::<_, BoxError>(())
            }
        });
    let model = ScriptedModel::new([
        ScriptedTurn::tool_calls([
            ToolCall::new("c1", "progress", "{}"),
            ToolCall::new("c2", "forbidden", "{}"),
        ]),
        ScriptedTurn::text("done"),
    ]);
    let agent = Agent::builder("async-closures")
        .model(model.clone())
        .tools(tools())
        .middleware(stack.clone())
        .build()
        .unwrap();
    let run = agent.run("go").await.unwrap();
    assert_eq!(run.output, "DONE");
    let first = &model.requests()[0];
    assert!(first.messages.iter().any(|m| m.text() == "go now"));
    let second = &model.requests()[1];
    assert!(second
        .messages
        .iter()
        .any(|m| m.text() == "progress done [tagged]"));
    assert!(second.messages.iter().any(|m| m.text() == "reminder"));
    assert!(seen.has("before_run go"));
    assert!(seen.has("before_tool forbidden"));
    assert!(seen.has("after_tool progress"));
    assert!(seen.has("after_agent completed"));
    assert!(!seen.has("on_error"));

    // A failing run reaches the async on_error, then the async after_agent.
    let failing = ScriptedModel::new([ScriptedTurn::error(
        tower_agent::ErrorKind::InvalidRequest,
        "no",
    )]);
    let err = Agent::builder("async-closures")
        .model(failing)
        .middleware(stack)
        .build()
        .unwrap()
        .run("go")
        .await
        .unwrap_err();
    assert!(seen.has(&format!("on_error {}", err.code())));
    assert!(seen.has("after_agent failed"));
}
