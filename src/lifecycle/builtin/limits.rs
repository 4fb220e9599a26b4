//! Call limits: [`ModelCallLimitMiddleware`] (model calls per run and per
//! thread) and [`ToolCallLimitMiddleware`] (calls of one tool, or of all,
//! per run and per thread).
//!
//! On the limit, a run either ends with [`AgentError::LimitExceeded`]
//! (`LIMIT_EXCEEDED`, a tripwire: also from inside a nested run), naming
//! the limit, or goes on gracefully: a model-call limit stops the run
//! before its next model call (status *stopped*), a tool-call limit answers
//! the model that the tool is exhausted (a `before_tool` deny) and lets it
//! finish.
//!
//! A nested run counts toward its own run limits; with
//! [`count_in_root`](ModelCallLimitMiddleware::count_in_root) its calls
//! count toward the root run's limits too. Thread limits count every run of
//! the thread that this middleware (or a clone) sees, nested runs included.
//!
//! ```
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_agent::lifecycle::builtin::limits::{ModelCallLimitMiddleware, ToolCallLimitMiddleware};
//! use tower_agent::lifecycle::{LifecycleLayer, MiddlewareStack};
//! use tower_agent::{tool_sync, Agent, RunRequest, ScriptedModel, ScriptedTurn, ToolRouter};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::AgentError> {
//! let model = ScriptedModel::new([
//!     ScriptedTurn::tool_call("search", r#"{"q": "a"}"#),
//!     ScriptedTurn::tool_call("search", r#"{"q": "b"}"#),
//!     ScriptedTurn::text("done"),
//! ]);
//! let search = tool_sync("search", "Searches", |_: serde_json::Value| Ok::<_, tower_agent::BoxError>("found"));
//! let agent = Agent::builder("a").model(model.clone()).tools(ToolRouter::new().tool(search)).build()?;
//! let limits = MiddlewareStack::new()
//!     .push(ModelCallLimitMiddleware::new().run_limit(5))
//!     .push(ToolCallLimitMiddleware::tool("search").run_limit(1));
//! let agent = ServiceBuilder::new().layer(LifecycleLayer::new(limits)).service(agent);
//!
//! let run = agent.oneshot(RunRequest::new("look twice")).await?;
//! assert_eq!(run.output, "done");
//! // The second search was answered with "exhausted", not run.
//! let last_request = model.requests().pop().unwrap();
//! assert!(last_request.messages.last().unwrap().text().contains("exhausted"));
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use crate::context::RunContext;
use crate::error::{AgentError, LimitExceeded};
use crate::hooks::ToolVerdict;
use crate::lifecycle::{Hook, Middleware};
use crate::types::{History, ModelResponse, ToolCall};

/// Counts per run (in each run's state, so they end with the run) and per
/// thread (in the middleware, shared by clones).
#[derive(Default)]
struct Counts {
    threads: Mutex<HashMap<String, u32>>,
}

/// A run's counters, one per limit middleware, in the run's state.
#[derive(Clone, Default)]
struct RunCounts(Arc<Mutex<HashMap<usize, u32>>>);

impl Counts {
    fn id(self: &Arc<Self>) -> usize {
        Arc::as_ptr(self) as usize
    }

    fn run(self: &Arc<Self>, ctx: &RunContext) -> u32 {
        let counts = ctx.with_state(|s| s.get::<RunCounts>().cloned());
        counts.map_or(0, |c| {
            *c.0.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&self.id())
                .unwrap_or(&0)
        })
    }

    fn add_run(self: &Arc<Self>, ctx: &RunContext) {
        let counts = ctx.with_state(|s| s.get_or_insert_with(RunCounts::default).clone());
        *counts
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(self.id())
            .or_insert(0) += 1;
    }

    fn thread(&self, ctx: &RunContext) -> u32 {
        ctx.thread_id().map_or(0, |t| {
            *self
                .threads
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(t)
                .unwrap_or(&0)
        })
    }

    fn add_thread(&self, ctx: &RunContext) {
        if let Some(thread) = ctx.thread_id() {
            *self
                .threads
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(thread.to_owned())
                .or_insert(0) += 1;
        }
    }
}

/// The limits one middleware keeps.
#[derive(Clone, Copy, Debug, Default)]
struct Limits {
    run: Option<u32>,
    thread: Option<u32>,
    in_root: bool,
}

impl Limits {
    /// The first limit one more call would pass, as `(scope, max)`.
    fn reached(&self, counts: &Arc<Counts>, ctx: &RunContext) -> Option<(&'static str, u32)> {
        if let Some(max) = self.run {
            if counts.run(ctx) >= max {
                return Some(("run", max));
            }
            let root = ctx.root();
            if self.in_root && ctx.parent().is_some() && counts.run(root) >= max {
                return Some(("root run", max));
            }
        }
        if let Some(max) = self.thread {
            if counts.thread(ctx) >= max {
                return Some(("thread", max));
            }
        }
        None
    }

    fn count(&self, counts: &Arc<Counts>, ctx: &RunContext) {
        counts.add_run(ctx);
        if self.in_root && ctx.parent().is_some() {
            counts.add_run(ctx.root());
        }
        counts.add_thread(ctx);
    }
}

/// The setters both limit middleware share: the run and thread limits,
/// `count_in_root` and the action on the limit.
macro_rules! limit_setters {
    ($what:literal, $action:ty) => {
        #[doc = concat!("At most `max` ", $what, " per run.")]
        pub fn run_limit(mut self, max: u32) -> Self {
            self.limits.run = Some(max);
            self
        }

        #[doc = concat!("At most `max` ", $what, " per thread, over every run of it.")]
        pub fn thread_limit(mut self, max: u32) -> Self {
            self.limits.thread = Some(max);
            self
        }

        /// Whether a nested run's calls also count toward the root run's limit.
        pub fn count_in_root(mut self, yes: bool) -> Self {
            self.limits.in_root = yes;
            self
        }

        /// What to do on the limit.
        pub fn on_limit(mut self, action: $action) -> Self {
            self.action = action;
            self
        }
    };
}

/// What a [`ModelCallLimitMiddleware`] does on its limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ModelLimitAction {
    /// End the run with `LIMIT_EXCEEDED` before the call past the limit.
    #[default]
    Error,
    /// Stop the run (status *stopped*) after the last call the limit allows,
    /// once that turn's tool calls ran.
    Stop,
}

/// Limits model calls per run and per thread. See the [module docs](self).
///
/// # Clone
///
/// Clones share the thread counts.
#[derive(Clone)]
pub struct ModelCallLimitMiddleware {
    limits: Limits,
    action: ModelLimitAction,
    counts: Arc<Counts>,
}

impl Default for ModelCallLimitMiddleware {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ModelCallLimitMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelCallLimitMiddleware")
            .field("limits", &self.limits)
            .field("action", &self.action)
            .finish_non_exhaustive()
    }
}

impl ModelCallLimitMiddleware {
    /// No limits yet; ends the run on a limit.
    pub fn new() -> Self {
        Self {
            limits: Limits::default(),
            action: ModelLimitAction::Error,
            counts: Arc::default(),
        }
    }

    limit_setters!("model calls", ModelLimitAction);
}

impl Middleware for ModelCallLimitMiddleware {
    fn name(&self) -> &str {
        "model-call-limit"
    }

    fn before_model<'a>(&'a self, ctx: &'a RunContext, _: &'a mut History) -> Hook<'a, ()> {
        if let Some((scope, max)) = self.limits.reached(&self.counts, ctx) {
            let err = AgentError::LimitExceeded(LimitExceeded {
                limit: format!("model calls per {scope}"),
                max,
            });
            return Hook::err(err);
        }
        self.limits.count(&self.counts, ctx);
        Hook::ok(())
    }

    fn after_model<'a>(&'a self, ctx: &'a RunContext, _: &'a mut ModelResponse) -> Hook<'a, ()> {
        if self.action == ModelLimitAction::Stop {
            if let Some((scope, max)) = self.limits.reached(&self.counts, ctx) {
                ctx.stop_by(
                    self.name(),
                    format!("model call limit reached: at most {max} per {scope}"),
                );
            }
        }
        Hook::skip()
    }
}

/// What a [`ToolCallLimitMiddleware`] does on its limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ToolLimitAction {
    /// Answer the model that the tool is exhausted (the call does not run)
    /// and let it finish.
    #[default]
    Exhausted,
    /// End the run with `LIMIT_EXCEEDED`.
    Error,
}

/// Limits calls of one tool, or of all tools, per run and per thread. See
/// the [module docs](self).
///
/// # Clone
///
/// Clones share the thread counts.
#[derive(Clone)]
pub struct ToolCallLimitMiddleware {
    tool: Option<Arc<str>>,
    name: Arc<str>,
    limits: Limits,
    action: ToolLimitAction,
    counts: Arc<Counts>,
}

impl fmt::Debug for ToolCallLimitMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolCallLimitMiddleware")
            .field("tool", &self.tool)
            .field("limits", &self.limits)
            .field("action", &self.action)
            .finish_non_exhaustive()
    }
}

impl ToolCallLimitMiddleware {
    /// Limits the calls of every tool together; no limits yet.
    pub fn all() -> Self {
        Self {
            tool: None,
            name: "tool-call-limit".into(),
            limits: Limits::default(),
            action: ToolLimitAction::Exhausted,
            counts: Arc::default(),
        }
    }

    /// Limits the calls of the tool `name`; no limits yet.
    pub fn tool(name: impl Into<Arc<str>>) -> Self {
        let tool: Arc<str> = name.into();
        Self {
            name: format!("tool-call-limit:{tool}").into(),
            tool: Some(tool),
            ..Self::all()
        }
    }

    limit_setters!("calls", ToolLimitAction);

    fn what(&self) -> String {
        match &self.tool {
            Some(tool) => format!("calls of `{tool}`"),
            None => "tool calls".to_owned(),
        }
    }
}

impl Middleware for ToolCallLimitMiddleware {
    fn name(&self) -> &str {
        &self.name
    }

    fn before_tool<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        _resumed: bool,
    ) -> Hook<'a, ToolVerdict> {
        if self.tool.as_deref().is_some_and(|t| t != call.name) {
            return Hook::skip();
        }
        if let Some((scope, max)) = self.limits.reached(&self.counts, ctx) {
            return match self.action {
                ToolLimitAction::Error => Hook::err(AgentError::LimitExceeded(LimitExceeded {
                    limit: format!("{} per {scope}", self.what()),
                    max,
                })),
                ToolLimitAction::Exhausted => Hook::ok(ToolVerdict::deny(format!(
                    "The tool `{}` is exhausted: at most {max} {} per {scope}. Answer without it.",
                    call.name,
                    self.what()
                ))),
            };
        }
        self.limits.count(&self.counts, ctx);
        Hook::ok(ToolVerdict::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::ToolDecision;

    async fn model_turn(mw: &ModelCallLimitMiddleware, ctx: &RunContext) -> Result<(), String> {
        let mut history = History::new();
        match mw.before_model(ctx, &mut history).run().await {
            None | Some(Ok(())) => Ok(()),
            Some(Err(err)) => Err(AgentError::classify(err).to_string()),
        }
    }

    async fn tool_turn(mw: &ToolCallLimitMiddleware, ctx: &RunContext, tool: &str) -> ToolDecision {
        let call = ToolCall::new("c", tool, "{}");
        match mw.before_tool(ctx, &call, false).run().await {
            None => ToolDecision::Continue,
            Some(Ok(verdict)) => verdict.decision,
            Some(Err(err)) => ToolDecision::Deny {
                reason: format!("error: {}", AgentError::classify(err).code()),
            },
        }
    }

    #[tokio::test]
    async fn model_calls_per_run_and_per_thread() {
        let mw = ModelCallLimitMiddleware::new().run_limit(2).thread_limit(3);
        let first = RunContext::builder().thread_id("t").build();
        model_turn(&mw, &first).await.unwrap();
        model_turn(&mw, &first).await.unwrap();
        let err = model_turn(&mw, &first).await.unwrap_err();
        assert_eq!(err, "limit reached: at most 2 model calls per run");
        let second = RunContext::builder().thread_id("t").build();
        model_turn(&mw, &second).await.unwrap();
        let err = model_turn(&mw, &second).await.unwrap_err();
        assert_eq!(err, "limit reached: at most 3 model calls per thread");
        // Another thread, and a clone sharing the thread count.
        let other = RunContext::builder().thread_id("u").build();
        model_turn(&mw.clone(), &other).await.unwrap();
    }

    #[tokio::test]
    async fn nested_runs_count_on_their_own_and_optionally_in_the_root() {
        let own = ModelCallLimitMiddleware::new().run_limit(1);
        let root = RunContext::new();
        model_turn(&own, &root).await.unwrap();
        model_turn(&own, &root.child()).await.unwrap();

        let shared = ModelCallLimitMiddleware::new()
            .run_limit(2)
            .count_in_root(true);
        let root = RunContext::new();
        model_turn(&shared, &root).await.unwrap();
        let child = root.child();
        model_turn(&shared, &child).await.unwrap();
        assert_eq!(
            model_turn(&shared, &child).await.unwrap_err(),
            "limit reached: at most 2 model calls per root run"
        );
        model_turn(&shared, &root).await.unwrap_err();
    }

    #[tokio::test]
    async fn stop_ends_the_run_after_the_last_allowed_call() {
        let mw = ModelCallLimitMiddleware::new()
            .run_limit(1)
            .on_limit(ModelLimitAction::Stop);
        let ctx = RunContext::new();
        model_turn(&mw, &ctx).await.unwrap();
        let mut response = ModelResponse::new("m", crate::types::Message::assistant("hi"));
        assert!(mw.after_model(&ctx, &mut response).run().await.is_none());
        let stop = ctx.stop_requested().unwrap();
        assert_eq!(stop.by.as_deref(), Some("model-call-limit"));
    }

    #[tokio::test]
    async fn one_tool_or_all_exhausted_or_failing() {
        let search = ToolCallLimitMiddleware::tool("search").run_limit(1);
        let ctx = RunContext::new();
        assert_eq!(
            tool_turn(&search, &ctx, "search").await,
            ToolDecision::Continue
        );
        assert_eq!(
            tool_turn(&search, &ctx, "fetch").await,
            ToolDecision::Continue
        );
        match tool_turn(&search, &ctx, "search").await {
            ToolDecision::Deny { reason } => assert!(
                reason.starts_with(
                    "The tool `search` is exhausted: at most 1 calls of `search` per run"
                ),
                "{reason}"
            ),
            other => panic!("expected a deny, got {other:?}"),
        }

        let all = ToolCallLimitMiddleware::all()
            .thread_limit(2)
            .on_limit(ToolLimitAction::Error);
        let ctx = RunContext::builder().thread_id("t").build();
        tool_turn(&all, &ctx, "a").await;
        tool_turn(&all, &ctx, "b").await;
        assert_eq!(
            tool_turn(&all, &ctx, "c").await,
            ToolDecision::Deny {
                reason: "error: LIMIT_EXCEEDED".into()
            }
        );
    }
}
