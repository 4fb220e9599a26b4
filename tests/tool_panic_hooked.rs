//! What the model reads of a tool's panic is the same on every way a call
//! goes down the stack: no hooks, `before_tool` only, a wrap hook handing
//! the call on, a wrap hook with a future of its own, a `from_fn` tool
//! middleware, a tower tool layer, the lifecycle layer's tower adapter. By
//! default it reads that the tool failed; the message goes to the
//! `ToolCallCompleted` event; `show_tool_panics` lets the model read it.

mod lifecycle_support;

use std::sync::{Arc, Mutex};

use lifecycle_support::HandOn;
use schemars::JsonSchema;
use serde::Deserialize;
use tower::limit::ConcurrencyLimitLayer;
use tower::{Layer, ServiceExt};
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::hooks::ToolVerdict;
use tower_agent::lifecycle::{
    from_fn, Hook, LifecycleLayer, Middleware, MiddlewareStack, Runtime, ToolNext, Wrapped,
};
use tower_agent::types::{Role, ToolCall};
use tower_agent::{
    tool_sync, Agent, AgentBuilder, BoxError, RunContext, RunRequest, ScriptedModel, ScriptedTurn,
    ToolInvocation, ToolOutput, ToolRouter,
};

#[derive(Deserialize, JsonSchema)]
struct Nothing {}

fn tools() -> ToolRouter {
    ToolRouter::new()
        .tool(tool_sync(
            "explode",
            "Panics",
            |_: Nothing| -> Result<String, BoxError> { panic!("secret at /srv/app.rs:12") },
        ))
        .tool(
            tool_sync(
                "explode_blocking",
                "Panics on a blocking thread",
                |_: Nothing| -> Result<String, BoxError> { panic!("secret on a thread") },
            )
            .blocking(),
        )
}

const HIDDEN: [&str; 2] = [
    "The tool `explode` failed unexpectedly and returned no result.",
    "The tool `explode_blocking` failed unexpectedly and returned no result.",
];

const SHOWN: [&str; 2] = [
    "The tool `explode` panicked: secret at /srv/app.rs:12",
    "The tool `explode_blocking` panicked: secret on a thread",
];

const PANICS: [(&str, Option<&str>); 2] = [
    ("1", Some("secret at /srv/app.rs:12")),
    ("2", Some("secret on a thread")),
];

/// What a wrap hook read from `next`: the tool's result, or the text of
/// its error.
type Answer = Result<ToolOutput, String>;

/// What the wrap hooks with a future of their own read from `next`, by
/// call id.
#[derive(Clone, Default)]
struct Read(Arc<Mutex<Vec<(String, Answer)>>>);

impl Read {
    /// Runs `next` with `invocation`, noting what it answers.
    async fn run(
        &self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> Result<ToolOutput, BoxError> {
        let id = invocation.call.id.clone();
        let answer = next.run(invocation).await;
        let noted = match &answer {
            Ok(output) => Ok(output.clone()),
            Err(err) => Err(err.to_string()),
        };
        self.0.lock().unwrap().push((id, noted));
        answer
    }

    fn by_id(&self) -> Vec<Answer> {
        let mut read = self.0.lock().unwrap().clone();
        read.sort_by(|a, b| a.0.cmp(&b.0));
        read.into_iter().map(|(_, answer)| answer).collect()
    }
}

/// Overrides `before_tool` only.
struct BeforeTool;

impl Middleware for BeforeTool {
    fn name(&self) -> &str {
        "before-tool"
    }

    fn before_tool<'a>(
        &'a self,
        _ctx: &'a RunContext,
        _call: &'a ToolCall,
        _resumed: bool,
    ) -> Hook<'a, ToolVerdict> {
        Hook::ok(ToolVerdict::proceed())
    }
}

/// Calls `next` in a future of its own and keeps what it read.
struct Reader(Read);

impl Middleware for Reader {
    fn name(&self) -> &str {
        "reader"
    }

    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> Wrapped<'a, ToolInvocation> {
        Wrapped::new(self.0.run(invocation, next))
    }
}

fn reading_fn(
    read: Read,
) -> impl Fn(
    ToolInvocation,
    ToolNext,
) -> futures::future::BoxFuture<'static, Result<ToolOutput, BoxError>>
       + Clone
       + Send
       + Sync
       + 'static {
    move |invocation: ToolInvocation, next: ToolNext| {
        let read = read.clone();
        Box::pin(async move { read.run(invocation, next).await })
    }
}

/// A way a tool call goes down the stack.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Path {
    NoHooks,
    BeforeToolOnly,
    WrapNext,
    WrapFuture,
    FromFnOnTheStack,
    TowerToolLayer,
    FromFnToolLayer,
    /// A `Wrapped::next` hook, then one with a future, then a tower layer.
    Everything,
}

const PATHS: [Path; 8] = [
    Path::NoHooks,
    Path::BeforeToolOnly,
    Path::WrapNext,
    Path::WrapFuture,
    Path::FromFnOnTheStack,
    Path::TowerToolLayer,
    Path::FromFnToolLayer,
    Path::Everything,
];

impl Path {
    /// What a wrap hook of this path reads from `next` when the tools
    /// panic, given what the model reads: below a lifecycle chain, the
    /// tool's error result; below the tower adapter, an error that names
    /// the tool and leaves the message out.
    fn reads(self, model: [&str; 2]) -> Vec<Answer> {
        match self {
            Path::WrapFuture | Path::FromFnOnTheStack | Path::Everything => model
                .iter()
                .map(|text| Ok(ToolOutput::error(*text)))
                .collect(),
            Path::FromFnToolLayer => vec![
                Err("the tool `explode` panicked".to_owned()),
                Err("the tool `explode_blocking` panicked".to_owned()),
            ],
            Path::NoHooks | Path::BeforeToolOnly | Path::WrapNext | Path::TowerToolLayer => {
                vec![]
            }
        }
    }

    fn agent(self, builder: AgentBuilder, read: &Read) -> AgentBuilder {
        match self {
            Path::NoHooks => builder,
            Path::BeforeToolOnly => builder.middleware(BeforeTool),
            Path::WrapNext => builder.middleware(HandOn),
            Path::WrapFuture => builder.middleware(Reader(read.clone())),
            Path::FromFnOnTheStack => builder.middleware(
                MiddlewareStack::new().push_tool(from_fn(reading_fn(read.clone())).name("fn")),
            ),
            Path::TowerToolLayer => builder.tool_layer(ConcurrencyLimitLayer::new(4)),
            Path::FromFnToolLayer => {
                builder.tool_layer(from_fn(reading_fn(read.clone())).name("fn"))
            }
            Path::Everything => builder
                .middleware(
                    MiddlewareStack::new()
                        .push(HandOn)
                        .push(Reader(read.clone()))
                        .push(BeforeTool),
                )
                .tool_layer(ConcurrencyLimitLayer::new(4)),
        }
    }
}

/// A turn calling both tools, then an answer.
fn both_tools() -> ScriptedModel {
    ScriptedModel::new([
        ScriptedTurn::tool_calls([
            ToolCall::new("1", "explode", "{}"),
            ToolCall::new("2", "explode_blocking", "{}"),
        ]),
        ScriptedTurn::text("done"),
    ])
}

/// A context whose events go to a sink, and the sink.
fn collecting() -> (RunContext, CollectingSink) {
    let sink = CollectingSink::new();
    (RunContext::builder().events(sink.clone()).build(), sink)
}

/// The tool results the model read in its second turn.
fn read_by_model(model: &ScriptedModel) -> Vec<String> {
    model.requests()[1]
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.text().into_owned())
        .collect()
}

/// The panics of the `ToolCallCompleted` events, by call id.
fn panics_by_id(sink: &CollectingSink) -> Vec<(String, Option<String>)> {
    let mut panics: Vec<_> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::ToolCallCompleted { call_id, panic, .. } => Some((call_id, panic)),
            _ => None,
        })
        .collect();
    panics.sort();
    panics
}

/// Runs one turn calling both tools along `path`: what the model read in
/// its next turn, the panics of the `ToolCallCompleted` events by call id,
/// and what the path's wrap hook read from `next`.
async fn run(
    path: Path,
    show: bool,
    parallel: bool,
) -> (Vec<String>, Vec<(String, Option<String>)>, Vec<Answer>) {
    let model = both_tools();
    let read = Read::default();
    let builder = Agent::builder("panics")
        .model(model.clone())
        .tools(tools())
        .show_tool_panics(show)
        .parallel_tool_calls(parallel);
    let agent = path.agent(builder, &read).build().unwrap();
    let (ctx, sink) = collecting();
    let run = agent
        .oneshot(RunRequest::new("go").context(ctx))
        .await
        .unwrap();
    assert_eq!(run.output, "done", "{path:?}");
    (read_by_model(&model), panics_by_id(&sink), read.by_id())
}

fn owned(panics: [(&str, Option<&str>); 2]) -> Vec<(String, Option<String>)> {
    panics
        .iter()
        .map(|(id, p)| (id.to_string(), p.map(str::to_owned)))
        .collect()
}

#[tokio::test]
async fn the_model_reads_only_that_the_tool_failed_on_every_path() {
    for path in PATHS {
        for parallel in [true, false] {
            let (model, panics, read) = run(path, false, parallel).await;
            assert_eq!(model, HIDDEN, "{path:?} parallel={parallel}");
            assert_eq!(panics, owned(PANICS), "{path:?} parallel={parallel}");
            assert_eq!(read, path.reads(HIDDEN), "{path:?} parallel={parallel}");
        }
    }
}

#[tokio::test]
async fn the_model_reads_the_panic_when_told_to_on_every_path() {
    for path in PATHS {
        let (model, panics, read) = run(path, true, true).await;
        assert_eq!(model, SHOWN, "{path:?}");
        assert_eq!(panics, owned(PANICS), "{path:?}");
        assert_eq!(read, path.reads(SHOWN), "{path:?}");
    }
}

#[tokio::test]
async fn a_lifecycle_layer_around_the_agent_keeps_the_panic_from_the_model() {
    for show in [false, true] {
        let model = both_tools();
        let read = Read::default();
        let agent = Agent::builder("panics")
            .model(model.clone())
            .tools(tools())
            .show_tool_panics(show)
            .build()
            .unwrap();
        let agent = LifecycleLayer::new(
            MiddlewareStack::new()
                .push(HandOn)
                .push(Reader(read.clone())),
        )
        .layer(agent);
        let (ctx, sink) = collecting();
        agent
            .oneshot(RunRequest::new("go").context(ctx))
            .await
            .unwrap();
        let expected = if show { SHOWN } else { HIDDEN };
        assert_eq!(read_by_model(&model), expected);
        let expected: Vec<_> = expected.iter().map(|t| Ok(ToolOutput::error(*t))).collect();
        assert_eq!(read.by_id(), expected);
        assert_eq!(panics_by_id(&sink), owned(PANICS));
    }
}

#[tokio::test]
async fn a_panic_called_outside_a_run_reads_as_a_failure() {
    let read = Read::default();
    let runtime = Runtime::new(
        MiddlewareStack::new()
            .push(HandOn)
            .push(Reader(read.clone())),
    );
    for (id, name) in [("1", "explode"), ("2", "explode_blocking")] {
        let invocation = ToolInvocation::new(ToolCall::new(id, name, "{}"), RunContext::new());
        let output = runtime.invoke_tool(tools(), invocation).await.unwrap();
        assert_eq!(output, ToolOutput::error(HIDDEN[usize::from(id == "2")]));
    }
    let expected: Vec<_> = HIDDEN.iter().map(|t| Ok(ToolOutput::error(*t))).collect();
    assert_eq!(read.by_id(), expected);
}

/// A tool stack that panics in `call` rather than in its future.
#[derive(Clone)]
struct PanicsInCall;

impl tower::Service<ToolInvocation> for PanicsInCall {
    type Response = ToolOutput;
    type Error = BoxError;
    type Future = std::future::Ready<Result<ToolOutput, BoxError>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _invocation: ToolInvocation) -> Self::Future {
        panic!("secret in call")
    }
}

#[tokio::test]
async fn a_panic_in_the_tool_stacks_call_is_the_tools_panic() {
    for path in [
        Path::NoHooks,
        Path::BeforeToolOnly,
        Path::WrapNext,
        Path::WrapFuture,
        Path::FromFnOnTheStack,
    ] {
        let model = ScriptedModel::new([
            ScriptedTurn::tool_call("explode", "{}"),
            ScriptedTurn::text("done"),
        ]);
        let read = Read::default();
        let builder = Agent::builder("panics")
            .model(model.clone())
            .tools(tools())
            .tool_layer(tower::layer::layer_fn(|_| PanicsInCall));
        let agent = path.agent(builder, &read).build().unwrap();
        let (ctx, sink) = collecting();
        let run = agent
            .oneshot(RunRequest::new("go").context(ctx))
            .await
            .unwrap();
        assert_eq!(run.output, "done", "{path:?}");
        assert_eq!(read_by_model(&model), [HIDDEN[0]], "{path:?}");
        let panic = sink.events().into_iter().find_map(|e| match e {
            AgentEvent::ToolCallCompleted { panic, .. } => Some(panic),
            _ => None,
        });
        assert_eq!(panic, Some(Some("secret in call".to_owned())), "{path:?}");
    }
}

#[tokio::test]
async fn after_a_handoff_the_target_agent_decides() {
    for show in [false, true] {
        let model = ScriptedModel::new([
            ScriptedTurn::tool_call("explode", "{}"),
            ScriptedTurn::text("done"),
        ]);
        let read = Read::default();
        let billing = Agent::builder("billing")
            .model(model.clone())
            .tools(tools())
            .show_tool_panics(show)
            .middleware(Reader(read.clone()))
            .build()
            .unwrap();
        let triage = Agent::builder("triage")
            .model(ScriptedModel::new([ScriptedTurn::tool_call(
                "transfer_to_billing",
                "{}",
            )]))
            .show_tool_panics(!show)
            .middleware(Reader(read.clone()))
            .handoff(&billing)
            .build()
            .unwrap();
        let run = triage.oneshot(RunRequest::new("go")).await.unwrap();
        assert_eq!(run.output, "done");
        let expected = if show { SHOWN[0] } else { HIDDEN[0] };
        let texts: Vec<String> = model.requests()[1]
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool && m.text().contains("explode"))
            .map(|m| m.text().into_owned())
            .collect();
        assert_eq!(texts, [expected], "show={show}");
    }
}

/// Answers for a tool whose call came back as an error result.
struct FallBack;

impl Middleware for FallBack {
    fn name(&self) -> &str {
        "fall-back"
    }

    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> Wrapped<'a, ToolInvocation> {
        Wrapped::new(async move {
            let output = next.run(invocation).await?;
            Ok(if output.is_error {
                ToolOutput::text("answered from the cache")
            } else {
                output
            })
        })
    }
}

#[tokio::test]
async fn a_panic_a_wrap_hook_answered_for_is_not_reported_with_its_answer() {
    let model = both_tools();
    let agent = Agent::builder("panics")
        .model(model.clone())
        .tools(tools())
        .middleware(MiddlewareStack::new().push(FallBack))
        .build()
        .unwrap();
    let (ctx, sink) = collecting();
    agent
        .oneshot(RunRequest::new("go").context(ctx))
        .await
        .unwrap();
    assert_eq!(
        read_by_model(&model),
        ["answered from the cache", "answered from the cache"]
    );
    assert_eq!(
        panics_by_id(&sink),
        [("1".to_owned(), None), ("2".to_owned(), None)]
    );
}
