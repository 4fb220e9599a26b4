//! Tripwires: named after the middleware and the hook, from any hook or wrap
//! middleware, and from nested agents, where they stop the root run.

mod lifecycle_support;

use lifecycle_support::{lookup_tools, run_with, Act, Log, Lookup, Recorder};
use serde_json::json;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_agent::lifecycle::{
    from_fn, Hook, HookPoint, LifecycleLayer, Middleware, MiddlewareStack, ModelNext,
};
use tower_agent::types::{History, Role};
use tower_agent::{
    tool_sync, tripwire, tripwire_with, Agent, AgentError, AgentTool, BoxError, DeltaSink,
    ModelCall, RunContext, RunRequest, ScriptedModel, ScriptedTurn, ToolRouter,
};

fn one_tool_agent() -> Agent {
    Agent::builder("a")
        .model(ScriptedModel::from_fn(|request| {
            if request
                .messages
                .last()
                .is_some_and(|m| m.role == Role::Tool)
            {
                ScriptedTurn::text("done")
            } else {
                ScriptedTurn::tool_call("lookup", r#"{"id": "7"}"#)
            }
        }))
        .tools(lookup_tools())
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_tripwire_from_any_hook_names_the_middleware_and_the_hook() {
    for hook in HookPoint::ALL {
        if matches!(
            hook,
            HookPoint::OnError
                | HookPoint::AfterAgent
                | HookPoint::DecideApproval
                | HookPoint::OnNotification
                | HookPoint::OnToolDelta
                | HookPoint::BeforeCompaction
                | HookPoint::AfterCompaction
                | HookPoint::BeforeModelSwitch
        ) {
            continue; // not reached in this run; see lifecycle_events
        }
        for pending in [false, true] {
            let log = Log::default();
            let mut guard = Recorder::new("guard", &log).at(hook, Act::Trip);
            if pending {
                guard = guard.pending();
            }
            let request = RunRequest::new("go").stream(DeltaSink::new(|_| {}));
            let err = run_with(one_tool_agent(), guard.stack(), request)
                .await
                .unwrap_err();
            let AgentError::Tripwire {
                middleware,
                hook: h,
                reason,
                ..
            } = &err
            else {
                panic!("{hook}: expected a tripwire, got {err:?}");
            };
            assert_eq!((middleware.as_str(), h.as_str()), ("guard", hook.as_str()));
            assert_eq!(reason, &format!("guard tripped in {hook}"));
            assert_eq!(err.code(), "GUARDRAIL_TRIPPED");
            assert_eq!(err.kind().http_status(), 400);
        }
    }
}

#[tokio::test]
async fn a_tripwire_stops_the_run_where_it_is_and_keeps_its_info() {
    struct Budget;
    impl Middleware for Budget {
        fn name(&self) -> &str {
            "budget"
        }
        fn before_model<'a>(&'a self, ctx: &'a RunContext, _: &'a mut History) -> Hook<'a, ()> {
            if ctx.iteration() == 2 {
                return Hook::err(tripwire_with("over budget", json!({"limit": 1})));
            }
            Hook::ok(())
        }
    }
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("lookup", r#"{"id": "7"}"#),
        ScriptedTurn::text("never"),
    ]);
    let agent = Agent::builder("a")
        .model(model.clone())
        .tools(lookup_tools())
        .build()
        .unwrap();
    let err = run_with(
        agent,
        MiddlewareStack::new().push(Budget),
        RunRequest::new("go"),
    )
    .await
    .unwrap_err();
    assert!(matches!(&err, AgentError::Tripwire { middleware, info, .. }
        if middleware == "budget" && info == &Some(json!({"limit": 1}))));
    assert_eq!(model.requests().len(), 1, "no second model call");
}

/// Trips in `before_model` of any run nested `depth` levels below the root.
struct DepthGuard(usize);

impl Middleware for DepthGuard {
    fn name(&self) -> &str {
        "depth-guard"
    }
    fn before_model<'a>(&'a self, ctx: &'a RunContext, _: &'a mut History) -> Hook<'a, ()> {
        if ctx.depth() == self.0 {
            return Hook::err(tripwire("too deep"));
        }
        Hook::ok(())
    }
}

/// root → (tool `mid`) → mid agent → (tool `leaf`) → leaf agent.
fn three_levels(leaf_stack: MiddlewareStack) -> (Agent, ScriptedModel) {
    let leaf = Agent::builder("leaf")
        .model(ScriptedModel::new([ScriptedTurn::text("leaf answer")]))
        .build()
        .unwrap();
    let leaf = LifecycleLayer::new(leaf_stack).layer(leaf);
    let mid = Agent::builder("mid")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call("leaf", r#"{"input": "dig"}"#),
            ScriptedTurn::text("mid answer"),
        ]))
        .tools(ToolRouter::new().tool(AgentTool::new("leaf", "The leaf", leaf)))
        .build()
        .unwrap();
    let root_model = ScriptedModel::new([
        ScriptedTurn::tool_call("mid", r#"{"input": "ask"}"#),
        ScriptedTurn::text("root answer"),
    ]);
    let root = Agent::builder("root")
        .model(root_model.clone())
        .tools(ToolRouter::new().tool(AgentTool::new("mid", "The mid", mid)))
        .build()
        .unwrap();
    (root, root_model)
}

#[tokio::test]
async fn a_tripwire_two_levels_down_stops_the_root_and_names_its_middleware() {
    let (root, root_model) = three_levels(MiddlewareStack::new().push(DepthGuard(2)));
    let err = run_with(root, MiddlewareStack::new(), RunRequest::new("go"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::Tripwire { middleware, hook, reason, .. }
            if middleware == "depth-guard" && hook == "before_model" && reason == "too deep"),
        "{err:?}"
    );
    assert_eq!(root_model.requests().len(), 1, "the root did not go on");
}

#[tokio::test]
async fn a_root_middleware_trips_inside_a_grandchild_run() {
    let (root, root_model) = three_levels(MiddlewareStack::new());
    let err = run_with(
        root,
        MiddlewareStack::new().push(DepthGuard(2)),
        RunRequest::new("go"),
    )
    .await
    .unwrap_err();
    assert!(matches!(&err, AgentError::Tripwire { middleware, .. } if middleware == "depth-guard"));
    assert_eq!(root_model.requests().len(), 1);
}

#[tokio::test]
async fn other_nested_failures_are_read_by_the_model() {
    let leaf = Agent::builder("leaf")
        .model(ScriptedModel::new([ScriptedTurn::error(
            tower_agent::ErrorKind::Unavailable,
            "leaf model down",
        )]))
        .build()
        .unwrap();
    let root = Agent::builder("root")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call("leaf", r#"{"input": "x"}"#),
            ScriptedTurn::text("worked around it"),
        ]))
        .tools(ToolRouter::new().tool(AgentTool::new("leaf", "l", leaf)))
        .build()
        .unwrap();
    let run = run_with(root, MiddlewareStack::new(), RunRequest::new("go"))
        .await
        .unwrap();
    assert_eq!(run.output, "worked around it");
    let result = run.messages.iter().find(|m| m.role == Role::Tool).unwrap();
    assert!(
        result.text().contains("leaf model down"),
        "{}",
        result.text()
    );
}

#[tokio::test]
async fn a_tool_that_trips_is_named_after_the_tool() {
    let agent = Agent::builder("a")
        .model(ScriptedModel::from_fn(|_| {
            ScriptedTurn::tool_call("vault", r#"{"id": "7"}"#)
        }))
        .tools(ToolRouter::new().tool(tool_sync("vault", "v", |_: Lookup| {
            Err::<String, BoxError>(tripwire("vault is sealed").into())
        })))
        .build()
        .unwrap();
    for stack in [
        MiddlewareStack::new(),
        Recorder::new("wrap", &Log::default()).stack(),
    ] {
        let err = run_with(agent.clone(), stack, RunRequest::new("go"))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, AgentError::Tripwire { middleware, .. } if middleware == "tool:vault"),
            "{err:?}"
        );
    }
    // Without any lifecycle layer too.
    let err = agent.oneshot(RunRequest::new("go")).await.unwrap_err();
    assert!(matches!(&err, AgentError::Tripwire { middleware, hook, .. }
        if middleware == "tool:vault" && hook == "call_tool"));
}

#[tokio::test]
async fn a_from_fn_layer_tripwire_carries_its_name() {
    let model = ServiceBuilder::new()
        .layer(
            from_fn(|call: ModelCall, next: ModelNext| async move {
                if call
                    .request
                    .messages
                    .iter()
                    .any(|m| m.text().contains("password"))
                {
                    return Err(tripwire("no passwords").into());
                }
                next.run(call).await
            })
            .name("password-guard"),
        )
        .service(ScriptedModel::new([ScriptedTurn::text("ok")]));
    let agent = Agent::builder("a").model(model).build().unwrap();
    let err = agent
        .oneshot(RunRequest::new("my password is hunter2"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::Tripwire { middleware, hook, .. }
        if middleware == "password-guard" && hook == "wrap_model"),
        "{err:?}"
    );
}
