//! A tool that is not ready at once, or fails to get ready, reads the same
//! to the model on every way a call goes down: no hooks, and a wrap hook
//! that hands the call on (the call then made in place below it). The tool
//! may be one the router picks, or a tool layer around the router; either
//! is driven to readiness before it is called, and a failure to get ready
//! is the model's error result. Events balance on every path.

mod lifecycle_support;

use std::future::{ready, Ready};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use lifecycle_support::{observed, HandOn};
use tower::{Layer, Service, ServiceExt};
use tower_agent::event::AgentEvent;
use tower_agent::lifecycle::{LifecycleLayer, MiddlewareStack};
use tower_agent::types::{Role, ToolSpec};
use tower_agent::{
    Agent, BoxError, RunRequest, ScriptedModel, ScriptedTurn, ToolDef, ToolInvocation, ToolOutput,
    ToolRouter,
};

/// How a service gets ready: after one `Pending` or at once, then ready or
/// failing.
#[derive(Clone, Copy, Debug)]
struct Readiness {
    pending_first: bool,
    fails: bool,
}

const EVERY_READINESS: [Readiness; 4] = [
    Readiness {
        pending_first: false,
        fails: false,
    },
    Readiness {
        pending_first: true,
        fails: false,
    },
    Readiness {
        pending_first: false,
        fails: true,
    },
    Readiness {
        pending_first: true,
        fails: true,
    },
];

/// Gets ready as `readiness` says, counting the polls of its clones.
#[derive(Clone)]
struct Gate {
    readiness: Readiness,
    polls: Arc<AtomicUsize>,
}

impl Gate {
    fn new(readiness: Readiness) -> Self {
        Self {
            readiness,
            polls: Arc::default(),
        }
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        let polls = self.polls.fetch_add(1, Ordering::SeqCst);
        if self.readiness.pending_first && polls == 0 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if self.readiness.fails {
            return Poll::Ready(Err("no capacity left".into()));
        }
        Poll::Ready(Ok(()))
    }
}

/// A tool the router picks, gated.
#[derive(Clone)]
struct GatedTool(Gate);

impl Service<ToolInvocation> for GatedTool {
    type Response = ToolOutput;
    type Error = BoxError;
    type Future = Ready<Result<ToolOutput, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, invocation: ToolInvocation) -> Self::Future {
        ready(Ok(ToolOutput::text(format!(
            "found {}",
            invocation.args["id"]
        ))))
    }
}

/// A tool layer around the router, gated.
#[derive(Clone)]
struct GatedStack<S> {
    gate: Gate,
    inner: S,
}

impl<S> Service<ToolInvocation> for GatedStack<S>
where
    S: Service<ToolInvocation, Error = BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self.gate.poll_ready(cx) {
            Poll::Ready(Ok(())) => self.inner.poll_ready(cx),
            other => other,
        }
    }

    fn call(&mut self, invocation: ToolInvocation) -> S::Future {
        self.inner.call(invocation)
    }
}

/// Where the gate stands.
#[derive(Clone, Copy, Debug)]
enum Gated {
    /// On the tool the router picks.
    Tool,
    /// On a tool layer around the router.
    Stack,
}

fn router(tool: Option<GatedTool>) -> ToolRouter {
    let spec = ToolSpec::new(
        "lookup",
        "Looks an id up",
        serde_json::json!({
            "type": "object",
            "properties": {"id": {"type": "string"}},
            "required": ["id"],
        }),
    );
    match tool {
        Some(tool) => ToolRouter::new().tool(ToolDef::new(spec, tool)),
        None => ToolRouter::new().tool(ToolDef::new(
            spec,
            tower::service_fn(|invocation: ToolInvocation| async move {
                Ok::<_, BoxError>(ToolOutput::text(format!("found {}", invocation.args["id"])))
            }),
        )),
    }
}

/// One run calling `lookup` once, the gate where `gated` says, under a
/// stack that hands every tool call on (`hooked`) or under none: the text
/// the model read of the tool's result, and whether it was an error.
async fn run(gated: Gated, readiness: Readiness, hooked: bool) -> (String, usize) {
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("lookup", r#"{"id":"A-1"}"#),
        ScriptedTurn::text("done"),
    ]);
    let gate = Gate::new(readiness);
    let polls = gate.polls.clone();
    let builder = Agent::builder("gated").model(model.clone());
    let builder = match gated {
        Gated::Tool => builder.tools(router(Some(GatedTool(gate.clone())))),
        Gated::Stack => builder
            .tools(router(None))
            .tool_layer(tower::layer::layer_fn(move |inner| GatedStack {
                gate: gate.clone(),
                inner,
            })),
    };
    let agent = builder.build().unwrap();
    let (ctx, sink) = observed();
    let request = RunRequest::new("go").context(ctx);
    let done = if hooked {
        let stack = MiddlewareStack::new().push(HandOn);
        LifecycleLayer::new(stack)
            .layer(agent)
            .oneshot(request)
            .await
            .unwrap()
    } else {
        agent.oneshot(request).await.unwrap()
    };
    assert_eq!(
        done.output, "done",
        "{gated:?} {readiness:?} hooked: {hooked}"
    );
    let events = sink.events();
    let count = |f: fn(&AgentEvent) -> bool| events.iter().filter(|e| f(e)).count();
    let started = count(|e| matches!(e, AgentEvent::ToolCallStarted { .. }));
    let completed = count(|e| matches!(e, AgentEvent::ToolCallCompleted { .. }));
    assert_eq!((started, completed), (1, 1), "{gated:?} {readiness:?}");
    let requests = model.requests();
    let result = requests
        .last()
        .expect("the model was called")
        .messages
        .iter()
        .find(|m| m.role == Role::Tool)
        .expect("the tool's result")
        .text()
        .into_owned();
    (result, polls.load(Ordering::SeqCst))
}

#[tokio::test]
async fn a_tool_not_ready_at_once_is_called_once_it_is_on_every_path() {
    for readiness in EVERY_READINESS.into_iter().filter(|r| !r.fails) {
        for gated in [Gated::Tool, Gated::Stack] {
            for hooked in [false, true] {
                let (result, polls) = run(gated, readiness, hooked).await;
                assert_eq!(result, r#"found "A-1""#, "{gated:?} {readiness:?} {hooked}");
                // Asked once more after the `Pending`, and no more.
                let expected = 1 + usize::from(readiness.pending_first);
                assert_eq!(polls, expected, "{gated:?} {readiness:?} hooked: {hooked}");
            }
        }
    }
}

#[tokio::test]
async fn a_tool_that_fails_to_get_ready_is_the_models_error_result_on_every_path() {
    for readiness in EVERY_READINESS.into_iter().filter(|r| r.fails) {
        for gated in [Gated::Tool, Gated::Stack] {
            let bare = run(gated, readiness, false).await;
            assert!(
                bare.0.contains("no capacity left"),
                "the model reads why: {}",
                bare.0
            );
            let hooked = run(gated, readiness, true).await;
            assert_eq!(hooked, bare, "{gated:?} {readiness:?}");
        }
    }
}
