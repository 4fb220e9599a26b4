//! Shared by the `lifecycle_*` tests: a middleware that records every hook
//! it sees and can be told to fail, panic or trip at one of them.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tower::ServiceExt;
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::hooks::{
    Compaction, Notification, RunOutcome, RunStart, ToolCallResult, ToolVerdict,
};
use tower_agent::lifecycle::{
    Hook, HookPoint, LifecycleLayer, Middleware, MiddlewareStack, ModelMiddleware, ModelNext,
    ToolMiddleware, ToolNext, Wrapped,
};
use tower_agent::types::{ApprovalDecision, History, Message, ModelDelta, ModelResponse, ToolCall};
use tower_agent::{
    tool_sync, tripwire, Agent, AgentError, BoxError, ModelCall, RunContext, RunRequest,
    ToolInvocation, ToolOutput, ToolRouter,
};

/// A shared, ordered log of `name:hook` entries.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn push(&self, entry: String) {
        self.0.lock().unwrap().push(entry);
    }

    pub fn entries(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

/// What a [`Recorder`] does at a hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    Fail,
    Panic,
    Trip,
}

/// Records every hook it sees; at the hooks it is told to, fails, panics or
/// trips, synchronously or from inside its future.
#[derive(Clone)]
pub struct Recorder {
    pub name: String,
    pub log: Log,
    acts: Arc<Mutex<HashMap<HookPoint, Act>>>,
    pub pending: bool,
    pub fail_open: bool,
}

impl Recorder {
    pub fn new(name: &str, log: &Log) -> Self {
        Self {
            name: name.to_owned(),
            log: log.clone(),
            acts: Arc::default(),
            pending: false,
            fail_open: false,
        }
    }

    /// Hooks return boxed futures (the act happens inside them).
    pub fn pending(mut self) -> Self {
        self.pending = true;
        self
    }

    pub fn fail_open(mut self) -> Self {
        self.fail_open = true;
        self
    }

    pub fn at(self, hook: HookPoint, act: Act) -> Self {
        self.acts.lock().unwrap().insert(hook, act);
        self
    }

    fn act_for(&self, hook: HookPoint) -> Option<Act> {
        self.acts.lock().unwrap().get(&hook).copied()
    }

    fn outcome(&self, hook: HookPoint) -> Result<(), BoxError> {
        match self.act_for(hook) {
            None => Ok(()),
            Some(Act::Fail) => Err(format!("{} failed in {hook}", self.name).into()),
            Some(Act::Trip) => Err(tripwire(format!("{} tripped in {hook}", self.name)).into()),
            Some(Act::Panic) => panic!("{} panicked in {hook}", self.name),
        }
    }

    fn hook<'a, T: Send + 'a>(&'a self, hook: HookPoint, value: T) -> Hook<'a, T> {
        self.log.push(format!("{}:{hook}", self.name));
        if self.pending {
            Hook::new(async move {
                tokio::task::yield_now().await;
                self.outcome(hook).map(|()| value)
            })
        } else {
            Hook::ready(self.outcome(hook).map(|()| value))
        }
    }

    pub fn stack(&self) -> MiddlewareStack {
        MiddlewareStack::new()
            .push(self.clone())
            .push_model(self.clone())
            .push_tool(self.clone())
    }
}

impl Middleware for Recorder {
    fn name(&self) -> &str {
        &self.name
    }

    fn fail_policy(&self) -> tower_agent::lifecycle::FailPolicy {
        if self.fail_open {
            tower_agent::lifecycle::FailPolicy::Open
        } else {
            tower_agent::lifecycle::FailPolicy::Closed
        }
    }

    fn before_agent<'a>(&'a self, _: &'a RunContext, _: RunStart) -> Hook<'a, Option<String>> {
        self.hook(HookPoint::BeforeAgent, None)
    }

    fn before_run<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a mut Message,
        _: &'a History,
    ) -> Hook<'a, Option<String>> {
        self.hook(HookPoint::BeforeRun, None)
    }

    fn before_model<'a>(&'a self, _: &'a RunContext, _: &'a mut History) -> Hook<'a, ()> {
        self.hook(HookPoint::BeforeModel, ())
    }

    fn on_model_delta(&self, _: &RunContext, _: &mut ModelDelta) -> Result<(), BoxError> {
        self.log.push(format!("{}:on_model_delta", self.name));
        self.outcome(HookPoint::OnModelDelta)
    }

    fn after_model<'a>(&'a self, _: &'a RunContext, _: &'a mut ModelResponse) -> Hook<'a, ()> {
        self.hook(HookPoint::AfterModel, ())
    }

    fn before_tool<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a ToolCall,
        _: bool,
    ) -> Hook<'a, ToolVerdict> {
        self.hook(HookPoint::BeforeTool, ToolVerdict::default())
    }

    fn on_tool_delta(
        &self,
        _: &RunContext,
        _: &ToolCall,
        _: &mut ModelDelta,
    ) -> Result<(), BoxError> {
        self.log.push(format!("{}:on_tool_delta", self.name));
        self.outcome(HookPoint::OnToolDelta)
    }

    fn after_tool<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a ToolCall,
        _: &'a mut ToolOutput,
    ) -> Hook<'a, ()> {
        self.hook(HookPoint::AfterTool, ())
    }

    fn after_tool_batch<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a [ToolCallResult<'a>],
    ) -> Hook<'a, ()> {
        self.hook(HookPoint::AfterToolBatch, ())
    }

    fn before_stop<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a Message,
        _: u32,
    ) -> Hook<'a, Option<String>> {
        self.hook(HookPoint::BeforeStop, None)
    }

    fn before_compaction<'a>(&'a self, _: &'a RunContext, _: &'a History) -> Hook<'a, bool> {
        self.hook(HookPoint::BeforeCompaction, true)
    }

    fn after_compaction<'a>(&'a self, _: &'a RunContext, _: &'a Compaction) -> Hook<'a, ()> {
        self.hook(HookPoint::AfterCompaction, ())
    }

    fn before_model_switch<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a str,
        _: &'a str,
    ) -> Hook<'a, bool> {
        self.hook(HookPoint::BeforeModelSwitch, true)
    }

    fn decide_approval<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a ToolCall,
    ) -> Hook<'a, Option<ApprovalDecision>> {
        self.hook(HookPoint::DecideApproval, None)
    }

    fn on_notification<'a>(&'a self, _: &'a RunContext, _: &'a Notification) -> Hook<'a, ()> {
        self.hook(HookPoint::OnNotification, ())
    }

    fn on_error<'a>(&'a self, _: &'a RunContext, _: &'a AgentError) -> Hook<'a, ()> {
        self.hook(HookPoint::OnError, ())
    }

    fn after_agent<'a>(&'a self, _: &'a RunContext, outcome: RunOutcome<'a>) -> Hook<'a, ()> {
        self.log
            .push(format!("{}:after_agent:{}", self.name, outcome.status()));
        match self.act_for(HookPoint::AfterAgent) {
            None => Hook::ok(()),
            Some(_) => Hook::ready(self.outcome(HookPoint::AfterAgent)),
        }
    }
}

impl ModelMiddleware for Recorder {
    fn name(&self) -> &str {
        &self.name
    }

    fn wrap_model<'a>(
        &'a self,
        call: ModelCall,
        next: ModelNext,
    ) -> BoxFuture<'a, Result<ModelResponse, BoxError>> {
        self.log.push(format!("{}:wrap_model", self.name));
        Box::pin(async move {
            self.outcome(HookPoint::WrapModel)?;
            let response = next.run(call).await;
            self.log.push(format!("{}:wrap_model:end", self.name));
            response
        })
    }
}

impl ToolMiddleware for Recorder {
    fn name(&self) -> &str {
        &self.name
    }

    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> BoxFuture<'a, Result<ToolOutput, BoxError>> {
        self.log.push(format!("{}:wrap_tool", self.name));
        Box::pin(async move {
            self.outcome(HookPoint::WrapTool)?;
            let output = next.run(invocation).await;
            self.log.push(format!("{}:wrap_tool:end", self.name));
            output
        })
    }
}

/// Hands every tool call on as it came, with `Wrapped::next`: a wrap hook
/// with no future of its own.
pub struct HandOn;

impl Middleware for HandOn {
    fn name(&self) -> &str {
        "hand-on"
    }

    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> Wrapped<'a, ToolInvocation> {
        Wrapped::next(invocation, next)
    }
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
pub struct Lookup {
    pub id: String,
}

/// A router with `lookup` (answers `found <id>`).
pub fn lookup_tools() -> ToolRouter {
    ToolRouter::new().tool(tool_sync("lookup", "Looks an id up", |l: Lookup| {
        Ok::<_, BoxError>(format!("found {}", l.id))
    }))
}

/// A context whose events go to the returned sink.
pub fn observed() -> (RunContext, CollectingSink) {
    let sink = CollectingSink::new();
    (RunContext::builder().events(sink.clone()).build(), sink)
}

/// `(middleware, hook)` pairs whose started and completed counts differ.
pub fn unbalanced(events: &[AgentEvent]) -> Vec<(String, &'static str, i64)> {
    let mut open: HashMap<(String, &'static str), i64> = HashMap::new();
    for event in events {
        match event {
            AgentEvent::MiddlewareStarted {
                middleware, hook, ..
            } => *open.entry((middleware.to_string(), hook)).or_default() += 1,
            AgentEvent::MiddlewareCompleted {
                middleware, hook, ..
            } => *open.entry((middleware.to_string(), hook)).or_default() -= 1,
            _ => {}
        }
    }
    let mut bad: Vec<_> = open
        .into_iter()
        .filter(|(_, n)| *n != 0)
        .map(|((m, h), n)| (m, h, n))
        .collect();
    bad.sort();
    bad
}

/// The outcomes of `MiddlewareCompleted` events of `hook`.
pub fn outcomes(events: &[AgentEvent], hook: &str) -> Vec<&'static str> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::MiddlewareCompleted {
                hook: h, outcome, ..
            } if *h == hook => Some(*outcome),
            _ => None,
        })
        .collect()
}

/// Runs `agent` with `stack` as the agent's middleware.
pub async fn run_with(
    agent: Agent,
    stack: MiddlewareStack,
    request: RunRequest,
) -> Result<tower_agent::AgentRun, AgentError> {
    tower::Layer::layer(&LifecycleLayer::new(stack), agent)
        .oneshot(request)
        .await
}
