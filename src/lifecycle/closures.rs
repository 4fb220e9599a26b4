//! Middleware from closures, for the common cases: one hook, a name, no
//! type and no lifetimes ([`MiddlewareStack::before_model`] and the rest).

use std::future::Future;

use futures::future::BoxFuture;

use super::{Hook, HookPoint, Middleware, MiddlewareStack};
use crate::context::RunContext;
use crate::error::{AgentError, BoxError};
use crate::hooks::{RunOutcome, ToolVerdict};
use crate::request::ToolOutput;
use crate::types::{History, Message, ModelResponse, ToolCall};

/// An async closure hook's boxed future.
type Answer<T> = BoxFuture<'static, Result<T, BoxError>>;

/// The one hook a closure middleware has: each closure's type spelled out.
#[allow(clippy::type_complexity)]
enum FnHook {
    BeforeRun(Box<dyn Fn(&RunContext, &mut Message) -> Result<(), BoxError> + Send + Sync>),
    BeforeModel(Box<dyn Fn(&RunContext, &mut History) -> Result<(), BoxError> + Send + Sync>),
    AfterModel(Box<dyn Fn(&RunContext, &mut ModelResponse) -> Result<(), BoxError> + Send + Sync>),
    BeforeTool(Box<dyn Fn(&RunContext, &ToolCall) -> Result<ToolVerdict, BoxError> + Send + Sync>),
    AfterTool(
        Box<dyn Fn(&RunContext, &ToolCall, &mut ToolOutput) -> Result<(), BoxError> + Send + Sync>,
    ),
    AfterAgent(Box<dyn Fn(&RunContext, RunOutcome<'_>) -> Result<(), BoxError> + Send + Sync>),
    OnError(Box<dyn Fn(&RunContext, &AgentError) -> Result<(), BoxError> + Send + Sync>),
    BeforeRunAsync(Box<dyn Fn(RunContext, Message) -> Answer<Message> + Send + Sync>),
    BeforeModelAsync(Box<dyn Fn(RunContext, History) -> Answer<History> + Send + Sync>),
    AfterModelAsync(Box<dyn Fn(RunContext, ModelResponse) -> Answer<ModelResponse> + Send + Sync>),
    BeforeToolAsync(Box<dyn Fn(RunContext, ToolCall) -> Answer<ToolVerdict> + Send + Sync>),
    AfterToolAsync(
        Box<dyn Fn(RunContext, ToolCall, ToolOutput) -> Answer<ToolOutput> + Send + Sync>,
    ),
    AfterAgentAsync(Box<dyn Fn(&RunContext, RunOutcome<'_>) -> Answer<()> + Send + Sync>),
    OnErrorAsync(Box<dyn Fn(&RunContext, &AgentError) -> Answer<()> + Send + Sync>),
}

impl FnHook {
    /// The hook point the closure runs at.
    fn point(&self) -> HookPoint {
        match self {
            FnHook::BeforeRun(_) | FnHook::BeforeRunAsync(_) => HookPoint::BeforeRun,
            FnHook::BeforeModel(_) | FnHook::BeforeModelAsync(_) => HookPoint::BeforeModel,
            FnHook::AfterModel(_) | FnHook::AfterModelAsync(_) => HookPoint::AfterModel,
            FnHook::BeforeTool(_) | FnHook::BeforeToolAsync(_) => HookPoint::BeforeTool,
            FnHook::AfterTool(_) | FnHook::AfterToolAsync(_) => HookPoint::AfterTool,
            FnHook::AfterAgent(_) | FnHook::AfterAgentAsync(_) => HookPoint::AfterAgent,
            FnHook::OnError(_) | FnHook::OnErrorAsync(_) => HookPoint::OnError,
        }
    }
}

/// A middleware with one hook, from a closure.
struct FnMiddleware {
    name: String,
    hook: FnHook,
}

impl Middleware for FnMiddleware {
    fn name(&self) -> &str {
        &self.name
    }

    fn before_run<'a>(
        &'a self,
        ctx: &'a RunContext,
        input: &'a mut Message,
        _messages: &'a History,
    ) -> Hook<'a, Option<String>> {
        match &self.hook {
            FnHook::BeforeRun(f) => Hook::ready(f(ctx, input).map(|()| None)),
            FnHook::BeforeRunAsync(f) => {
                let fut = f(ctx.clone(), input.clone());
                Hook::new(async move {
                    *input = fut.await?;
                    Ok(None)
                })
            }
            _ => Hook::not_overridden(),
        }
    }

    fn before_model<'a>(&'a self, ctx: &'a RunContext, messages: &'a mut History) -> Hook<'a, ()> {
        match &self.hook {
            FnHook::BeforeModel(f) => Hook::ready(f(ctx, messages)),
            FnHook::BeforeModelAsync(f) => {
                let fut = f(ctx.clone(), messages.clone());
                Hook::new(async move {
                    *messages = fut.await?;
                    Ok(())
                })
            }
            _ => Hook::not_overridden(),
        }
    }

    fn after_model<'a>(
        &'a self,
        ctx: &'a RunContext,
        response: &'a mut ModelResponse,
    ) -> Hook<'a, ()> {
        match &self.hook {
            FnHook::AfterModel(f) => Hook::ready(f(ctx, response)),
            FnHook::AfterModelAsync(f) => {
                let fut = f(ctx.clone(), response.clone());
                Hook::new(async move {
                    *response = fut.await?;
                    Ok(())
                })
            }
            _ => Hook::not_overridden(),
        }
    }

    fn before_tool<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        _resumed: bool,
    ) -> Hook<'a, ToolVerdict> {
        match &self.hook {
            FnHook::BeforeTool(f) => Hook::ready(f(ctx, call)),
            FnHook::BeforeToolAsync(f) => Hook::new(f(ctx.clone(), call.clone())),
            _ => Hook::not_overridden(),
        }
    }

    fn after_tool<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        output: &'a mut ToolOutput,
    ) -> Hook<'a, ()> {
        match &self.hook {
            FnHook::AfterTool(f) => Hook::ready(f(ctx, call, output)),
            FnHook::AfterToolAsync(f) => {
                let fut = f(ctx.clone(), call.clone(), output.clone());
                Hook::new(async move {
                    *output = fut.await?;
                    Ok(())
                })
            }
            _ => Hook::not_overridden(),
        }
    }

    fn on_error<'a>(&'a self, ctx: &'a RunContext, error: &'a AgentError) -> Hook<'a, ()> {
        match &self.hook {
            FnHook::OnError(f) => Hook::ready(f(ctx, error)),
            FnHook::OnErrorAsync(f) => Hook::new(f(ctx, error)),
            _ => Hook::not_overridden(),
        }
    }

    fn after_agent<'a>(&'a self, ctx: &'a RunContext, outcome: RunOutcome<'a>) -> Hook<'a, ()> {
        match &self.hook {
            FnHook::AfterAgent(f) => Hook::ready(f(ctx, outcome)),
            FnHook::AfterAgentAsync(f) => Hook::new(f(ctx, outcome)),
            _ => Hook::not_overridden(),
        }
    }
}

impl MiddlewareStack {
    /// Registers the closure middleware: the stack knows from the start
    /// that its other hook points are absent.
    fn push_fn(self, name: impl Into<String>, hook: FnHook) -> Self {
        let point = hook.point();
        self.push_known(
            FnMiddleware {
                name: name.into(),
                hook,
            },
            &[point],
        )
    }

    /// Registers a middleware called `name` whose `before_run` is `f`: it
    /// sees (and may change) a new run's input; an `Err` (a
    /// [`tripwire`](crate::tripwire) among them) stops the run.
    ///
    /// ```
    /// use tower_agent::lifecycle::MiddlewareStack;
    /// use tower_agent::tripwire;
    ///
    /// let stack = MiddlewareStack::new().before_run("refund-guard", |_ctx, input| {
    ///     if input.text().contains("refund") {
    ///         return Err(tripwire("refunds go to a person").into());
    ///     }
    ///     Ok(())
    /// });
    /// # let _ = stack;
    /// ```
    pub fn before_run<F>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(&RunContext, &mut Message) -> Result<(), BoxError> + Send + Sync + 'static,
    {
        self.push_fn(name, FnHook::BeforeRun(Box::new(f)))
    }

    /// Like [`before_run`](Self::before_run), async: `f` gets the run's
    /// context and a copy of the input, and answers the input to go on
    /// with.
    ///
    /// ```
    /// use tower_agent::lifecycle::MiddlewareStack;
    /// use tower_agent::Message;
    ///
    /// let stack = MiddlewareStack::new().before_run_async("translate", |_ctx, input| async move {
    ///     // e.g. an HTTP call to a translation service
    ///     Ok(Message::user(input.text().to_uppercase()))
    /// });
    /// # let _ = stack;
    /// ```
    pub fn before_run_async<F, Fut>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(RunContext, Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Message, BoxError>> + Send + 'static,
    {
        self.push_fn(
            name,
            FnHook::BeforeRunAsync(Box::new(move |ctx, m| Box::pin(f(ctx, m)))),
        )
    }

    /// Registers a middleware called `name` whose `before_model` is `f`: it
    /// may change the messages before each model turn.
    pub fn before_model<F>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(&RunContext, &mut History) -> Result<(), BoxError> + Send + Sync + 'static,
    {
        self.push_fn(name, FnHook::BeforeModel(Box::new(f)))
    }

    /// Like [`before_model`](Self::before_model), async: `f` gets the run's
    /// context and the messages (both O(1) clones) and answers the messages
    /// to go on with.
    pub fn before_model_async<F, Fut>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(RunContext, History) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<History, BoxError>> + Send + 'static,
    {
        self.push_fn(
            name,
            FnHook::BeforeModelAsync(Box::new(move |ctx, m| Box::pin(f(ctx, m)))),
        )
    }

    /// Registers a middleware called `name` whose `after_model` is `f`: it
    /// may change each answer before the run uses it.
    pub fn after_model<F>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(&RunContext, &mut ModelResponse) -> Result<(), BoxError> + Send + Sync + 'static,
    {
        self.push_fn(name, FnHook::AfterModel(Box::new(f)))
    }

    /// Like [`after_model`](Self::after_model), async: `f` gets the run's
    /// context and a copy of the answer, and answers the one the run uses.
    pub fn after_model_async<F, Fut>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(RunContext, ModelResponse) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ModelResponse, BoxError>> + Send + 'static,
    {
        self.push_fn(
            name,
            FnHook::AfterModelAsync(Box::new(move |ctx, r| Box::pin(f(ctx, r)))),
        )
    }

    /// Registers a middleware called `name` whose `before_tool` is `f`: its
    /// [`ToolVerdict`] decides each call (merged with the others').
    ///
    /// ```
    /// use tower_agent::hooks::ToolVerdict;
    /// use tower_agent::lifecycle::MiddlewareStack;
    ///
    /// let stack = MiddlewareStack::new().before_tool("no-deletes", |_ctx, call| {
    ///     Ok(if call.name == "delete" {
    ///         ToolVerdict::deny("deleting is not allowed")
    ///     } else {
    ///         ToolVerdict::proceed()
    ///     })
    /// });
    /// # let _ = stack;
    /// ```
    pub fn before_tool<F>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(&RunContext, &ToolCall) -> Result<ToolVerdict, BoxError> + Send + Sync + 'static,
    {
        self.push_fn(name, FnHook::BeforeTool(Box::new(f)))
    }

    /// Like [`before_tool`](Self::before_tool), async: `f` gets the run's
    /// context and a copy of the call.
    pub fn before_tool_async<F, Fut>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(RunContext, ToolCall) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ToolVerdict, BoxError>> + Send + 'static,
    {
        self.push_fn(
            name,
            FnHook::BeforeToolAsync(Box::new(move |ctx, c| Box::pin(f(ctx, c)))),
        )
    }

    /// Registers a middleware called `name` whose `after_tool` is `f`: it
    /// may change each result the model reads.
    ///
    /// ```
    /// use tower_agent::lifecycle::MiddlewareStack;
    ///
    /// let stack = MiddlewareStack::new().after_tool("log-tools", |_ctx, call, output| {
    ///     println!("{} -> {}", call.name, output.content);
    ///     Ok(())
    /// });
    /// # let _ = stack;
    /// ```
    pub fn after_tool<F>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(&RunContext, &ToolCall, &mut ToolOutput) -> Result<(), BoxError>
            + Send
            + Sync
            + 'static,
    {
        self.push_fn(name, FnHook::AfterTool(Box::new(f)))
    }

    /// Like [`after_tool`](Self::after_tool), async: `f` gets copies of the
    /// call and its result, and answers the result the model reads.
    pub fn after_tool_async<F, Fut>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(RunContext, ToolCall, ToolOutput) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ToolOutput, BoxError>> + Send + 'static,
    {
        self.push_fn(
            name,
            FnHook::AfterToolAsync(Box::new(move |ctx, c, o| Box::pin(f(ctx, c, o)))),
        )
    }

    /// Registers a middleware called `name` whose `after_agent` is `f`: it
    /// sees how each run ended. Its errors are logged.
    pub fn after_agent<F>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(&RunContext, RunOutcome<'_>) -> Result<(), BoxError> + Send + Sync + 'static,
    {
        self.push_fn(name, FnHook::AfterAgent(Box::new(f)))
    }

    /// Like [`after_agent`](Self::after_agent), async: `f` reads what it
    /// needs of the context and the outcome, and answers a future that owns
    /// it (to send a report, close a session). Its errors are logged.
    ///
    /// ```
    /// use tower_agent::lifecycle::MiddlewareStack;
    ///
    /// let stack = MiddlewareStack::new().after_agent_async("report", |ctx, outcome| {
    ///     let (run, status) = (ctx.run_id().clone(), outcome.status());
    ///     async move {
    ///         // e.g. an HTTP call to a dashboard
    ///         println!("run {run} {status}");
    ///         Ok(())
    ///     }
    /// });
    /// # let _ = stack;
    /// ```
    pub fn after_agent_async<F, Fut>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(&RunContext, RunOutcome<'_>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        self.push_fn(
            name,
            FnHook::AfterAgentAsync(Box::new(move |ctx, o| Box::pin(f(ctx, o)))),
        )
    }

    /// Registers a middleware called `name` whose `on_error` is `f`: it sees
    /// the error of each run that failed. Its errors are logged.
    pub fn on_error<F>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(&RunContext, &AgentError) -> Result<(), BoxError> + Send + Sync + 'static,
    {
        self.push_fn(name, FnHook::OnError(Box::new(f)))
    }

    /// Like [`on_error`](Self::on_error), async: `f` reads what it needs of
    /// the context and the error, and answers a future that owns it (to page
    /// someone, say). Its errors are logged.
    pub fn on_error_async<F, Fut>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(&RunContext, &AgentError) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        self.push_fn(
            name,
            FnHook::OnErrorAsync(Box::new(move |ctx, e| Box::pin(f(ctx, e)))),
        )
    }
}
