//! Every `*Started` event of a run, a model call and a tool call has its
//! `*Completed`, on every way a run ends: an answer, cancellation, the
//! deadline, an error, a panic, `max_turns`, a stop, a pause, a failing
//! hook, a sibling call's tripwire, the run's future dropped.

mod lifecycle_support;

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use lifecycle_support::HandOn;
use schemars::JsonSchema;
use serde::Deserialize;
use tower::{Layer, ServiceExt};
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::hooks::{ToolDecision, ToolVerdict};
use tower_agent::lifecycle::{
    Hook, LifecycleLayer, Middleware, MiddlewareStack, ToolNext, Wrapped,
};
use tower_agent::types::{ModelResponse, RunStatus, ToolCall};
use tower_agent::{
    tool_fn, tool_fn_ctx, tripwire, Agent, AgentBuilder, AgentError, AgentTool, BoxError,
    ErrorKind, ModelCall, RunContext, RunRequest, ScriptedModel, ScriptedTurn, ToolInvocation,
    ToolOutput, ToolRouter,
};

#[derive(Deserialize, JsonSchema)]
struct Wait {
    ms: u64,
}

fn tools() -> ToolRouter {
    ToolRouter::new()
        .tool(tool_fn("wait", "Waits", |w: Wait| async move {
            tokio::time::sleep(Duration::from_millis(w.ms)).await;
            Ok::<_, BoxError>("waited")
        }))
        .tool(tool_fn("trip", "Trips", |_: Wait| async {
            Err::<String, _>(tripwire("no"))
        }))
        .tool(tool_fn("boom", "Panics", |_: Wait| async {
            if true {
                panic!("boom");
            }
            Ok::<String, BoxError>(String::new())
        }))
        .tool(tool_fn_ctx(
            "halt",
            "Stops the run",
            |_: Wait, ctx| async move {
                ctx.stop("enough");
                Ok::<_, BoxError>("stopping")
            },
        ))
}

fn agent(turns: impl IntoIterator<Item = ScriptedTurn>) -> AgentBuilder {
    Agent::builder("balance")
        .model(ScriptedModel::new(turns))
        .tools(tools())
}

fn wait(ms: u64) -> ScriptedTurn {
    ScriptedTurn::tool_call("wait", format!(r#"{{"ms": {ms}}}"#))
}

/// Checks every pair balances, each `*Completed` after its `*Started`;
/// returns the `error` codes of the completed tool calls, by call id.
fn balanced(events: &[AgentEvent]) -> HashMap<String, Option<&'static str>> {
    let mut open: HashMap<String, i32> = HashMap::new();
    let mut tool_errors = HashMap::new();
    for event in events {
        let (key, step) = match event {
            AgentEvent::RunStarted { run_id, .. } => (format!("run {run_id}"), 1),
            AgentEvent::RunCompleted { run_id, .. } => (format!("run {run_id}"), -1),
            AgentEvent::ModelCallStarted {
                run_id, iteration, ..
            } => (format!("model {run_id} {iteration}"), 1),
            AgentEvent::ModelCallCompleted {
                run_id, iteration, ..
            } => (format!("model {run_id} {iteration}"), -1),
            AgentEvent::ToolCallStarted {
                run_id, call_id, ..
            } => (format!("tool {run_id} {call_id}"), 1),
            AgentEvent::ToolCallCompleted {
                run_id,
                call_id,
                error,
                ..
            } => {
                tool_errors.insert(call_id.clone(), *error);
                (format!("tool {run_id} {call_id}"), -1)
            }
            AgentEvent::MiddlewareStarted {
                run_id,
                middleware,
                hook,
            } => (format!("hook {run_id} {middleware} {hook}"), 1),
            AgentEvent::MiddlewareCompleted {
                run_id,
                middleware,
                hook,
                ..
            } => (format!("hook {run_id} {middleware} {hook}"), -1),
            _ => continue,
        };
        let count = open.entry(key.clone()).or_default();
        *count += step;
        assert!(
            *count >= 0,
            "{key} completed before it started: {events:#?}"
        );
    }
    let unbalanced: Vec<_> = open.iter().filter(|(_, n)| **n != 0).collect();
    assert!(
        unbalanced.is_empty(),
        "unbalanced {unbalanced:?} in {events:#?}"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, AgentEvent::RunCompleted { .. })),
        "the run ended: {events:#?}"
    );
    tool_errors
}

fn run_status(events: &[AgentEvent]) -> (&'static str, Option<&'static str>) {
    events
        .iter()
        .rev()
        .find_map(|e| match e {
            AgentEvent::RunCompleted { status, error, .. } => Some((*status, *error)),
            _ => None,
        })
        .unwrap()
}

async fn run_with_events<S>(
    service: S,
    request: RunRequest,
) -> (Result<tower_agent::AgentRun, AgentError>, Vec<AgentEvent>)
where
    S: tower::Service<RunRequest, Response = tower_agent::AgentRun, Error = AgentError>,
{
    let sink = CollectingSink::new();
    let ctx = RunContext::builder().events(sink.clone()).build();
    let result = service.oneshot(request.context(ctx)).await;
    (result, sink.events())
}

#[tokio::test(start_paused = true)]
async fn cancelled_while_a_tool_runs() {
    let sink = CollectingSink::new();
    let ctx = RunContext::builder().events(sink.clone()).build();
    let canceller = ctx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        canceller.cancel();
    });
    let agent = agent([wait(10_000), ScriptedTurn::text("unreached")])
        .build()
        .unwrap();
    let err = agent
        .oneshot(RunRequest::new("go").context(ctx))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    let events = sink.events();
    let tool_errors = balanced(&events);
    assert_eq!(tool_errors["call_1"], Some("CANCELLED"));
    assert_eq!(run_status(&events), ("failed", Some("CANCELLED")));
}

#[tokio::test(start_paused = true)]
async fn the_deadline_passes_while_a_tool_runs() {
    let sink = CollectingSink::new();
    let ctx = RunContext::builder()
        .events(sink.clone())
        .timeout(Duration::from_secs(1))
        .build();
    let agent = agent([wait(10_000), ScriptedTurn::text("unreached")])
        .build()
        .unwrap();
    let err = agent
        .oneshot(RunRequest::new("go").context(ctx))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    let events = sink.events();
    assert_eq!(balanced(&events)["call_1"], Some("TIMEOUT"));
    assert_eq!(run_status(&events), ("failed", Some("TIMEOUT")));
}

#[tokio::test(start_paused = true)]
async fn the_model_fails() {
    let agent = agent([ScriptedTurn::error(ErrorKind::Unavailable, "down")])
        .build()
        .unwrap();
    let (result, events) = run_with_events(agent, RunRequest::new("go")).await;
    assert_eq!(result.unwrap_err().kind(), ErrorKind::Unavailable);
    balanced(&events);
    assert!(events.iter().any(|e| matches!(
        e,
        AgentEvent::ModelCallCompleted {
            error: Some("PROVIDER_UNAVAILABLE"),
            ..
        }
    )));
    assert_eq!(
        run_status(&events),
        ("failed", Some("PROVIDER_UNAVAILABLE"))
    );
}

#[tokio::test(start_paused = true)]
async fn a_tripwire_ends_a_sibling_call_that_still_runs() {
    let agent = agent([
        ScriptedTurn::tool_calls([
            ToolCall::new("slow", "wait", r#"{"ms": 5000}"#),
            ToolCall::new("guard", "trip", r#"{"ms": 0}"#),
        ]),
        ScriptedTurn::text("unreached"),
    ])
    .build()
    .unwrap();
    let (result, events) = run_with_events(agent, RunRequest::new("go")).await;
    assert_eq!(result.unwrap_err().kind(), ErrorKind::Tripwire);
    let tool_errors = balanced(&events);
    assert_eq!(tool_errors["guard"], Some("GUARDRAIL_TRIPPED"));
    assert_eq!(tool_errors["slow"], Some("CANCELLED"));
}

#[tokio::test(start_paused = true)]
async fn a_tool_panics() {
    let agent = agent([
        ScriptedTurn::tool_call("boom", r#"{"ms": 0}"#),
        ScriptedTurn::text("sorted"),
    ])
    .build()
    .unwrap();
    let (result, events) = run_with_events(agent, RunRequest::new("go")).await;
    assert_eq!(result.unwrap().output, "sorted");
    assert_eq!(balanced(&events)["call_1"], None);
    let panic = events.iter().find_map(|e| match e {
        AgentEvent::ToolCallCompleted {
            panic, is_error, ..
        } => Some((panic.clone(), *is_error)),
        _ => None,
    });
    assert_eq!(panic, Some((Some("boom".to_owned()), true)));
}

/// A model service that panics.
#[derive(Clone)]
struct PanickingModel;

impl tower::Service<ModelCall> for PanickingModel {
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = std::future::Ready<Result<ModelResponse, BoxError>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _call: ModelCall) -> Self::Future {
        panic!("the model broke")
    }
}

#[tokio::test(start_paused = true)]
async fn the_model_panics() {
    let agent = Agent::builder("balance")
        .model(PanickingModel)
        .build()
        .unwrap();
    let sink = CollectingSink::new();
    let ctx = RunContext::builder().events(sink.clone()).build();
    let panicked = AssertUnwindSafe(agent.oneshot(RunRequest::new("go").context(ctx)))
        .catch_unwind()
        .await;
    assert!(panicked.is_err(), "the panic goes on to the caller");
    let events = sink.events();
    balanced(&events);
    assert!(events.iter().any(|e| matches!(
        e,
        AgentEvent::ModelCallCompleted {
            error: Some("INTERNAL"),
            ..
        }
    )));
    assert_eq!(run_status(&events), ("failed", Some("INTERNAL")));
}

#[tokio::test(start_paused = true)]
async fn max_turns_is_reached() {
    let agent = agent([wait(1), wait(1), wait(1)])
        .max_turns(2)
        .build()
        .unwrap();
    let (result, events) = run_with_events(agent, RunRequest::new("go")).await;
    assert_eq!(result.unwrap_err().kind(), ErrorKind::MaxTurns);
    balanced(&events);
    assert_eq!(run_status(&events), ("failed", Some("MAX_TURNS")));
}

#[tokio::test(start_paused = true)]
async fn a_tool_stops_the_run() {
    let agent = agent([
        ScriptedTurn::tool_call("halt", r#"{"ms": 0}"#),
        ScriptedTurn::text("unreached"),
    ])
    .build()
    .unwrap();
    let (result, events) = run_with_events(agent, RunRequest::new("go")).await;
    assert!(matches!(result.unwrap().status, RunStatus::Stopped(_)));
    assert_eq!(balanced(&events)["call_1"], None);
    assert_eq!(run_status(&events), ("stopped", None));
}

/// What the test middleware does.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Defer,
    FailAfterTool,
    FailAfterModel,
}

/// Defers every tool call, or fails every `after_tool` or `after_model`.
struct Hooks(Mode);

impl Middleware for Hooks {
    fn name(&self) -> &str {
        "hooks"
    }

    fn before_tool<'a>(
        &'a self,
        _ctx: &'a RunContext,
        _call: &'a ToolCall,
        _resumed: bool,
    ) -> Hook<'a, ToolVerdict> {
        if self.0 == Mode::Defer {
            return Hook::ok(ToolVerdict::decision(ToolDecision::Defer));
        }
        Hook::ok(ToolVerdict::proceed())
    }

    fn after_tool<'a>(
        &'a self,
        _ctx: &'a RunContext,
        _call: &'a ToolCall,
        _output: &'a mut ToolOutput,
    ) -> Hook<'a, ()> {
        if self.0 == Mode::FailAfterTool {
            return Hook::err("after_tool failed");
        }
        Hook::ok(())
    }

    fn after_model<'a>(
        &'a self,
        _ctx: &'a RunContext,
        _response: &'a mut ModelResponse,
    ) -> Hook<'a, ()> {
        if self.0 == Mode::FailAfterModel {
            return Hook::err("after_model failed");
        }
        Hook::ok(())
    }
}

fn with_hooks(agent: Agent, mode: Mode) -> tower_agent::lifecycle::Lifecycle<Agent> {
    LifecycleLayer::new(MiddlewareStack::new().push(Hooks(mode))).layer(agent)
}

#[tokio::test(start_paused = true)]
async fn the_run_pauses() {
    let agent = agent([wait(1), ScriptedTurn::text("unreached")])
        .build()
        .unwrap();
    let (result, events) =
        run_with_events(with_hooks(agent, Mode::Defer), RunRequest::new("go")).await;
    assert!(matches!(result.unwrap().status, RunStatus::Paused(_)));
    balanced(&events);
    assert_eq!(run_status(&events), ("paused", None));
}

#[tokio::test(start_paused = true)]
async fn an_after_tool_hook_fails() {
    let agent = agent([wait(1), ScriptedTurn::text("unreached")])
        .build()
        .unwrap();
    let (result, events) = run_with_events(
        with_hooks(agent, Mode::FailAfterTool),
        RunRequest::new("go"),
    )
    .await;
    assert_eq!(result.unwrap_err().kind(), ErrorKind::Middleware);
    assert_eq!(balanced(&events)["call_1"], Some("MIDDLEWARE_FAILED"));
}

#[tokio::test(start_paused = true)]
async fn an_after_model_hook_fails() {
    let agent = agent([ScriptedTurn::text("unread")]).build().unwrap();
    let (result, events) = run_with_events(
        with_hooks(agent, Mode::FailAfterModel),
        RunRequest::new("go"),
    )
    .await;
    assert_eq!(result.unwrap_err().kind(), ErrorKind::Middleware);
    balanced(&events);
    assert!(events.iter().any(|e| matches!(
        e,
        AgentEvent::ModelCallCompleted {
            error: Some("MIDDLEWARE_FAILED"),
            ..
        }
    )));
}

/// Polls `fut` until the paused clock reaches `at`, then drops it.
async fn drop_at<F: Future>(fut: F, at: Duration) {
    assert!(
        tokio::time::timeout(at, fut).await.is_err(),
        "still running"
    );
}

#[tokio::test(start_paused = true)]
async fn the_run_is_dropped_while_a_tool_runs() {
    let agent = agent([wait(10_000), ScriptedTurn::text("unreached")])
        .build()
        .unwrap();
    let sink = CollectingSink::new();
    let ctx = RunContext::builder().events(sink.clone()).build();
    drop_at(
        agent.oneshot(RunRequest::new("go").context(ctx)),
        Duration::from_secs(1),
    )
    .await;
    let events = sink.events();
    assert_eq!(balanced(&events)["call_1"], Some("CANCELLED"));
    assert_eq!(run_status(&events), ("failed", Some("CANCELLED")));
}

/// What the middleware around a hanging tool does.
#[derive(Clone, Copy, Debug)]
enum Around {
    /// `before_tool` and `after_tool`.
    BeforeAndAfter,
    /// `wrap_tool` handing the call on with `Wrapped::next`.
    HandOn,
    /// `wrap_tool` with a future of its own awaiting `next.run`.
    OwnFuture,
}

const AROUND: [Around; 3] = [Around::BeforeAndAfter, Around::HandOn, Around::OwnFuture];

impl Around {
    fn stack(self) -> MiddlewareStack {
        match self {
            Around::BeforeAndAfter => MiddlewareStack::new().push(BeforeAndAfter),
            Around::HandOn => MiddlewareStack::new().push(HandOn),
            Around::OwnFuture => MiddlewareStack::new().push(OwnFuture),
        }
    }
}

/// Overrides `before_tool` and `after_tool`.
struct BeforeAndAfter;

impl Middleware for BeforeAndAfter {
    fn name(&self) -> &str {
        "before-and-after"
    }

    fn before_tool<'a>(
        &'a self,
        _ctx: &'a RunContext,
        _call: &'a ToolCall,
        _resumed: bool,
    ) -> Hook<'a, ToolVerdict> {
        Hook::ok(ToolVerdict::proceed())
    }

    fn after_tool<'a>(
        &'a self,
        _ctx: &'a RunContext,
        _call: &'a ToolCall,
        _output: &'a mut ToolOutput,
    ) -> Hook<'a, ()> {
        Hook::ok(())
    }
}

/// Calls every tool in a future of its own, awaiting `next.run`.
struct OwnFuture;

impl Middleware for OwnFuture {
    fn name(&self) -> &str {
        "own-future"
    }

    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> Wrapped<'a, ToolInvocation> {
        Wrapped::new(async move { next.run(invocation).await })
    }
}

/// A tool that never answers.
fn hanging() -> ToolRouter {
    ToolRouter::new().tool(tool_fn("hang", "Never answers", |_: Wait| async {
        std::future::pending::<Result<String, BoxError>>().await
    }))
}

fn hang() -> ScriptedTurn {
    ScriptedTurn::tool_call("hang", r#"{"ms": 0}"#)
}

/// Where the middleware goes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Placement {
    /// On the agent calling `hang`.
    Alone,
    /// On the sub-agent calling `hang`, called by another agent.
    Inner,
    /// On the agent calling a sub-agent that calls `hang`: the sub-agent's
    /// run sees it too.
    Outer,
}

/// An agent calling `hang`, or (unless `Alone`) one calling a sub-agent
/// that does, with `around` placed at `placement`.
fn hanging_agent(around: Option<Around>, placement: Placement) -> Agent {
    let mut inner = Agent::builder("inner")
        .model(ScriptedModel::new([
            hang(),
            ScriptedTurn::text("unreached"),
        ]))
        .tools(hanging());
    if let (Some(around), Placement::Alone | Placement::Inner) = (around, placement) {
        inner = inner.middleware(around.stack());
    }
    let inner = inner.build().unwrap();
    if placement == Placement::Alone {
        return inner;
    }
    let mut outer = Agent::builder("outer")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call("inner", r#"{"input": "go"}"#),
            ScriptedTurn::text("unreached"),
        ]))
        .tools(ToolRouter::new().tool(AgentTool::new("inner", "Hangs", inner)));
    if let (Some(around), Placement::Outer) = (around, placement) {
        outer = outer.middleware(around.stack());
    }
    outer.build().unwrap()
}

/// Every middleware around the hanging tool at every placement, and a
/// sub-agent without middleware; each with whether a `wrap_tool` hook of
/// its own future must have run.
fn hanging_agents() -> Vec<(String, Agent, bool)> {
    let mut agents = vec![(
        "nested, no middleware".to_owned(),
        hanging_agent(None, Placement::Inner),
        false,
    )];
    for around in AROUND {
        for placement in [Placement::Alone, Placement::Inner, Placement::Outer] {
            let name = format!("{around:?} {placement:?}");
            let wraps = matches!(around, Around::OwnFuture);
            agents.push((name, hanging_agent(Some(around), placement), wraps));
        }
    }
    agents
}

/// The `error` codes of every completed call `call_id`, in every run (a
/// parent's and a sub-agent's calls may share an id).
fn codes_of(events: &[AgentEvent], call_id: &str) -> Vec<Option<&'static str>> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ToolCallCompleted {
                call_id: id, error, ..
            } if id == call_id => Some(*error),
            _ => None,
        })
        .collect()
}

/// Checks that the run of agent `name` (whose middleware wrap the tool
/// call when `wraps`) failed with `code`, its events balance, and every
/// call `call_1` (the parent's and, nested, the sub-agent's) ended with
/// `code` too.
fn stopped_as(events: &[AgentEvent], wraps: bool, code: &'static str, name: &str) {
    assert_eq!(wrapped(events), wraps, "{name}");
    balanced(events);
    let codes = codes_of(events, "call_1");
    assert!(
        !codes.is_empty() && codes.iter().all(|c| *c == Some(code)),
        "{name}: {codes:?}"
    );
    assert_eq!(run_status(events), ("failed", Some(code)), "{name}");
}

/// Whether a `wrap_tool` hook started.
fn wrapped(events: &[AgentEvent]) -> bool {
    events
        .iter()
        .any(|e| matches!(e, AgentEvent::MiddlewareStarted { hook, .. } if *hook == "wrap_tool"))
}

#[tokio::test(start_paused = true)]
async fn cancelled_while_a_tool_runs_inside_middleware() {
    for (name, agent, wraps) in hanging_agents() {
        let sink = CollectingSink::new();
        let ctx = RunContext::builder().events(sink.clone()).build();
        let canceller = ctx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            canceller.cancel();
        });
        let err = agent
            .oneshot(RunRequest::new("go").context(ctx))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cancelled, "{name}");
        stopped_as(&sink.events(), wraps, "CANCELLED", &name);
    }
}

#[tokio::test(start_paused = true)]
async fn the_deadline_passes_while_a_tool_runs_inside_middleware() {
    for (name, agent, wraps) in hanging_agents() {
        let sink = CollectingSink::new();
        let ctx = RunContext::builder()
            .events(sink.clone())
            .timeout(Duration::from_secs(1))
            .build();
        let err = agent
            .oneshot(RunRequest::new("go").context(ctx))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout, "{name}");
        stopped_as(&sink.events(), wraps, "TIMEOUT", &name);
    }
}

#[tokio::test(start_paused = true)]
async fn the_run_is_dropped_while_a_tool_runs_inside_middleware() {
    for (name, agent, wraps) in hanging_agents() {
        let sink = CollectingSink::new();
        let ctx = RunContext::builder().events(sink.clone()).build();
        drop_at(
            agent.oneshot(RunRequest::new("go").context(ctx)),
            Duration::from_secs(1),
        )
        .await;
        stopped_as(&sink.events(), wraps, "CANCELLED", &name);
    }
}
