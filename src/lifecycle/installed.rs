//! [`InstalledHooks`]: the hook points of one run, as the loop calls them
//! through the port. They compose the hooks the run inherited (from its
//! parent run, or from an outer lifecycle layer), outermost, with the run's
//! own compiled stack.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use tower::ServiceExt;

use super::call_chain::{model_call_in, tool_call_in, StackModel, StackTool};
use super::edit_watch::watcher;
use super::next::innermost_answer;
use super::stack::CompiledStack;
use super::stack_hooks::sole_verdict;
use super::verdict::merge_verdicts;
use super::HookPoint;
use crate::context::RunContext;
use crate::error::{AgentError, BoxError, ErrorKind};
use crate::hooks::{
    AgentMiddleware, ApprovalVerdict, Compaction, HookFuture, HookPort, ModelWalk, Notification,
    RunOutcome, RunStart, ToolAnswer, ToolCallResult, ToolFinish, ToolVerdict, ToolWalk,
};
use crate::request::{
    box_model, box_tool, BoxModel, BoxTool, ModelCall, ToolInvocation, ToolOutput,
};
use crate::types::{History, Message, ModelName, ModelResponse, ToolCall};

mod hand_over;
mod levels;
mod sole;
mod walk;

pub(crate) use levels::Levels;

use walk::finish_tool;

/// The hook points of a run: `outer` (inherited), then `stack`.
pub(crate) struct InstalledHooks {
    outer: Option<Arc<dyn HookPort>>,
    pub(crate) stack: Arc<CompiledStack>,
    /// The placement levels `stack` was composed from, so that a handoff
    /// can replace the agent's.
    levels: Levels,
    holds_stream: bool,
    /// The depth of the run these were installed for: a hook of `stack`
    /// failing in a run nested deeper fails every run up to that one.
    depth: usize,
}

impl InstalledHooks {
    /// The hooks of `levels` inside those installed in `ctx`.
    pub(crate) fn new(ctx: &RunContext, levels: Levels) -> Self {
        Self::inside(ctx, crate::hooks::installed(ctx), levels)
    }

    /// The hooks of `levels` inside `outer`.
    pub(crate) fn inside(
        ctx: &RunContext,
        outer: Option<Arc<dyn HookPort>>,
        levels: Levels,
    ) -> Self {
        let stack = levels.compose();
        let holds_stream = stack.holds_stream || outer.as_ref().is_some_and(|o| o.holds_stream());
        Self {
            outer,
            stack,
            levels,
            holds_stream,
            depth: ctx.depth(),
        }
    }

    /// A failure of this stack's hook in `ctx`'s run: noted for the runs it
    /// fails, and boxed for the port.
    fn own(&self, ctx: &RunContext, err: AgentError) -> BoxError {
        if err.kind() == ErrorKind::Middleware {
            ctx.note_hook_failure(ctx.depth().saturating_sub(self.depth));
        }
        Box::new(err)
    }
}

impl fmt::Debug for InstalledHooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstalledHooks")
            .field("inherited", &self.outer.is_some())
            .field("stack", &self.stack)
            .finish()
    }
}

impl HookPort for InstalledHooks {
    fn holds_stream(&self) -> bool {
        self.holds_stream
    }

    fn depth(&self) -> usize {
        self.depth
    }

    fn hand_over(
        self: Arc<Self>,
        ctx: &RunContext,
        to: Option<&AgentMiddleware>,
    ) -> Option<Arc<dyn HookPort>> {
        self.hand_over_here(ctx, to)
    }

    fn before_agent<'a>(
        &'a self,
        ctx: &'a RunContext,
        start: RunStart,
    ) -> HookFuture<'a, Vec<String>> {
        let hook = HookPoint::BeforeAgent;
        if let Some(e) = self.sole_here(hook) {
            return self.sole_port(
                e,
                ctx,
                hook,
                || e.mw.before_agent(ctx, start),
                |found| found.flatten().into_iter().collect(),
            );
        }
        match (&self.outer, self.stack.has(hook)) {
            (None, false) => HookFuture::ok(Vec::new()),
            (Some(outer), false) => outer.before_agent(ctx, start),
            (None, true) => self
                .stack
                .before_agent(ctx, start)
                .into_port(move |e| self.own(ctx, e)),
            (outer, true) => HookFuture::new(async move {
                let mut texts = match outer {
                    Some(outer) => outer.before_agent(ctx, start).await?,
                    None => Vec::new(),
                };
                texts.extend(
                    self.stack
                        .before_agent(ctx, start)
                        .await
                        .map_err(|e| self.own(ctx, e))?,
                );
                Ok(texts)
            }),
        }
    }

    fn before_run<'a>(
        &'a self,
        ctx: &'a RunContext,
        input: &'a mut Message,
        messages: &'a History,
    ) -> HookFuture<'a, Vec<String>> {
        // The only middleware here: no future boxed for an answer it has at once.
        let hook = HookPoint::BeforeRun;
        if let Some(e) = self.sole_here(hook) {
            return self.sole_port(
                e,
                ctx,
                hook,
                || e.mw.before_run(ctx, input, messages),
                |found| found.flatten().into_iter().collect(),
            );
        }
        match (&self.outer, self.stack.has(HookPoint::BeforeRun)) {
            (None, false) => HookFuture::ok(Vec::new()),
            (Some(outer), false) => outer.before_run(ctx, input, messages),
            (outer, true) => HookFuture::new(async move {
                let mut texts = match outer {
                    Some(outer) => outer.before_run(ctx, input, messages).await?,
                    None => Vec::new(),
                };
                let own = self.stack.before_run(ctx, input, messages);
                texts.extend(own.await.map_err(|e| self.own(ctx, e))?);
                Ok(texts)
            }),
        }
    }

    fn before_model<'a>(
        &'a self,
        ctx: &'a RunContext,
        messages: &'a mut History,
    ) -> HookFuture<'a, ()> {
        // The only middleware here, and nobody asks who changed the
        // messages: no future boxed for an answer it has at once.
        let hook = HookPoint::BeforeModel;
        if let Some(e) = self.sole_here(hook) {
            if watcher(ctx).is_none() {
                return self.sole_port(e, ctx, hook, || e.mw.before_model(ctx, messages), drop);
            }
        }
        match (&self.outer, self.stack.has(HookPoint::BeforeModel)) {
            (None, false) => HookFuture::ok(()),
            (Some(outer), false) => outer.before_model(ctx, messages),
            (outer, true) => HookFuture::new(async move {
                if let Some(outer) = outer {
                    outer.before_model(ctx, messages).await?;
                }
                self.stack
                    .before_model(ctx, messages)
                    .await
                    .map_err(|e| self.own(ctx, e))
            }),
        }
    }

    fn wrap_model(
        &self,
        call: ModelCall,
        next: BoxModel,
    ) -> BoxFuture<'_, Result<ModelResponse, BoxError>> {
        let own = self.stack.wraps_model(call.stream.is_some());
        let home = Some(self.depth);
        match &self.outer {
            None if !own => Box::pin(next.oneshot(call)),
            None => Box::pin(model_call_in(&self.stack, call, next, home)),
            Some(outer) if !own => outer.wrap_model(call, next),
            Some(outer) => {
                let own = box_model(StackModel {
                    stack: self.stack.clone(),
                    base: next,
                    home,
                });
                outer.wrap_model(call, own)
            }
        }
    }

    fn walk_model(&self, call: ModelCall, next: BoxModel, ctx: &RunContext) -> ModelWalk<'_> {
        self.walk_model_here(call, next, ctx)
    }

    fn bare_model_call(&self, streams: bool) -> bool {
        // A held stream goes to the caller only once the hooks passed the
        // answer: that frames the call too.
        let held = streams && self.holds_stream;
        !held
            && !self.stack.wraps_model(streams)
            && self
                .outer
                .as_ref()
                .is_none_or(|outer| outer.bare_model_call(streams))
    }

    fn bare_tool_call(&self, streams: bool) -> bool {
        !self.stack.wraps_tool(streams)
            && self
                .outer
                .as_ref()
                .is_none_or(|outer| outer.bare_tool_call(streams))
    }

    fn reads_model_answer(&self) -> bool {
        self.stack.has(HookPoint::AfterModel)
            || self
                .outer
                .as_ref()
                .is_some_and(|outer| outer.reads_model_answer())
    }

    fn model_answer(
        &self,
        answer: std::thread::Result<Result<ModelResponse, BoxError>>,
        model: &ModelName,
    ) -> Result<ModelResponse, BoxError> {
        innermost_answer::<ModelCall>(answer, model, None)
    }

    fn after_model<'a>(
        &'a self,
        ctx: &'a RunContext,
        response: &'a mut ModelResponse,
    ) -> HookFuture<'a, ()> {
        // The only middleware here: no future boxed for an answer it has at once.
        let hook = HookPoint::AfterModel;
        if let Some(e) = self.sole_here(hook) {
            return self.sole_port(e, ctx, hook, || e.mw.after_model(ctx, response), drop);
        }
        match (&self.outer, self.stack.has(HookPoint::AfterModel)) {
            (None, false) => HookFuture::ok(()),
            (Some(outer), false) => outer.after_model(ctx, response),
            (outer, true) => HookFuture::new(async move {
                self.stack
                    .after_model(ctx, response)
                    .await
                    .map_err(|e| self.own(ctx, e))?;
                match outer {
                    Some(outer) => outer.after_model(ctx, response).await,
                    None => Ok(()),
                }
            }),
        }
    }

    fn before_tool<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        resumed: bool,
    ) -> HookFuture<'a, ToolVerdict> {
        let hook = HookPoint::BeforeTool;
        if let Some(e) = self.sole_here(hook) {
            return self.sole_port(
                e,
                ctx,
                hook,
                || e.mw.before_tool(ctx, call, resumed),
                move |found| match found {
                    Some(verdict) => sole_verdict(ctx, call, e, verdict),
                    None => ToolVerdict::default(),
                },
            );
        }
        match (&self.outer, self.stack.has(hook)) {
            (None, false) => HookFuture::ok(ToolVerdict::default()),
            (Some(outer), false) => outer.before_tool(ctx, call, resumed),
            (None, true) => self
                .stack
                .before_tool(ctx, call, resumed)
                .into_port(move |e| self.own(ctx, e)),
            (Some(outer), true) => HookFuture::new(async move {
                let first = outer.before_tool(ctx, call, resumed).await?;
                // The inner stack sees the outer one's rewrite.
                let rewritten;
                let asked = match &first.updated_arguments {
                    Some(arguments) => {
                        rewritten = ToolCall {
                            arguments: arguments.to_string(),
                            ..call.clone()
                        };
                        &rewritten
                    }
                    None => call,
                };
                let second = self.stack.before_tool(ctx, asked, resumed).await;
                Ok(merge_verdicts(first, second.map_err(|e| self.own(ctx, e))?))
            }),
        }
    }

    fn decide_approval<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
    ) -> HookFuture<'a, Option<ApprovalVerdict>> {
        match (&self.outer, self.stack.has(HookPoint::DecideApproval)) {
            (None, false) => HookFuture::ok(None),
            (Some(outer), false) => outer.decide_approval(ctx, call),
            (None, true) => self
                .stack
                .decide_approval(ctx, call)
                .into_port(move |e| self.own(ctx, e)),
            (outer, true) => HookFuture::new(async move {
                if let Some(outer) = outer {
                    if let Some(verdict) = outer.decide_approval(ctx, call).await? {
                        return Ok(Some(verdict));
                    }
                }
                self.stack
                    .decide_approval(ctx, call)
                    .await
                    .map_err(|e| self.own(ctx, e))
            }),
        }
    }

    fn wrap_tool(&self, invocation: ToolInvocation, next: BoxTool) -> HookFuture<'_, ToolOutput> {
        let own = self.stack.wraps_tool(true);
        let home = Some(self.depth);
        match &self.outer {
            None if !own => HookFuture::new(next.oneshot(invocation)),
            None => HookFuture::new(tool_call_in(&self.stack, invocation, next, home)),
            Some(outer) if !own => outer.wrap_tool(invocation, next),
            Some(outer) => {
                let own = box_tool(StackTool {
                    stack: self.stack.clone(),
                    base: next,
                    home,
                });
                outer.wrap_tool(invocation, own)
            }
        }
    }

    fn walk_tool(
        &self,
        invocation: ToolInvocation,
        next: &Arc<BoxTool>,
        streams: bool,
        ctx: &RunContext,
    ) -> ToolWalk<'_> {
        self.walk_tool_here(invocation, next, streams, ctx)
    }

    fn finish_tool(
        &self,
        answer: ToolAnswer,
        call: &ToolCall,
        ctx: &RunContext,
        finish: &ToolFinish,
    ) -> Result<ToolOutput, BoxError> {
        finish_tool(answer, call, ctx, finish)
    }

    fn after_tool<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        output: &'a mut ToolOutput,
    ) -> HookFuture<'a, ()> {
        // The only middleware here: no future boxed for an answer it has at once.
        let hook = HookPoint::AfterTool;
        if let Some(e) = self.sole_here(hook) {
            return self.sole_port(e, ctx, hook, || e.mw.after_tool(ctx, call, output), drop);
        }
        match (&self.outer, self.stack.has(HookPoint::AfterTool)) {
            (None, false) => HookFuture::ok(()),
            (Some(outer), false) => outer.after_tool(ctx, call, output),
            (outer, true) => HookFuture::new(async move {
                self.stack
                    .after_tool(ctx, call, output)
                    .await
                    .map_err(|e| self.own(ctx, e))?;
                match outer {
                    Some(outer) => outer.after_tool(ctx, call, output).await,
                    None => Ok(()),
                }
            }),
        }
    }

    fn reads_tool_batch(&self) -> bool {
        self.stack.has(HookPoint::AfterToolBatch)
            || self
                .outer
                .as_ref()
                .is_some_and(|outer| outer.reads_tool_batch())
    }

    fn after_tool_batch<'a>(
        &'a self,
        ctx: &'a RunContext,
        results: &'a [ToolCallResult<'a>],
    ) -> HookFuture<'a, ()> {
        let hook = HookPoint::AfterToolBatch;
        if let Some(e) = self.sole_here(hook) {
            return self.sole_port(e, ctx, hook, || e.mw.after_tool_batch(ctx, results), drop);
        }
        match (&self.outer, self.stack.has(hook)) {
            (None, false) => HookFuture::ok(()),
            (Some(outer), false) => outer.after_tool_batch(ctx, results),
            (None, true) => self
                .stack
                .after_tool_batch(ctx, results)
                .into_port(move |e| self.own(ctx, e)),
            (outer, true) => HookFuture::new(async move {
                self.stack
                    .after_tool_batch(ctx, results)
                    .await
                    .map_err(|e| self.own(ctx, e))?;
                match outer {
                    Some(outer) => outer.after_tool_batch(ctx, results).await,
                    None => Ok(()),
                }
            }),
        }
    }

    fn before_stop<'a>(
        &'a self,
        ctx: &'a RunContext,
        output: &'a Message,
        continuations: u32,
    ) -> HookFuture<'a, Option<String>> {
        let hook = HookPoint::BeforeStop;
        if let Some(e) = self.sole_here(hook) {
            return self.sole_port(
                e,
                ctx,
                hook,
                || e.mw.before_stop(ctx, output, continuations),
                Option::flatten,
            );
        }
        match (&self.outer, self.stack.has(hook)) {
            (None, false) => HookFuture::ok(None),
            (Some(outer), false) => outer.before_stop(ctx, output, continuations),
            (None, true) => self
                .stack
                .before_stop(ctx, output, continuations)
                .into_port(move |e| self.own(ctx, e)),
            (outer, true) => HookFuture::new(async move {
                if let Some(outer) = outer {
                    if let Some(text) = outer.before_stop(ctx, output, continuations).await? {
                        return Ok(Some(text));
                    }
                }
                let own = self.stack.before_stop(ctx, output, continuations);
                own.await.map_err(|e| self.own(ctx, e))
            }),
        }
    }

    fn before_model_switch<'a>(
        &'a self,
        ctx: &'a RunContext,
        from: &'a str,
        to: &'a str,
    ) -> HookFuture<'a, bool> {
        match (&self.outer, self.stack.has(HookPoint::BeforeModelSwitch)) {
            (None, false) => HookFuture::ok(true),
            (Some(outer), false) => outer.before_model_switch(ctx, from, to),
            (None, true) => self
                .stack
                .before_model_switch(ctx, from, to)
                .into_port(move |e| self.own(ctx, e)),
            (outer, true) => HookFuture::new(async move {
                let outer_allows = match outer {
                    Some(outer) => outer.before_model_switch(ctx, from, to).await?,
                    None => true,
                };
                let own = self.stack.before_model_switch(ctx, from, to);
                Ok(own.await.map_err(|e| self.own(ctx, e))? && outer_allows)
            }),
        }
    }

    fn on_notification<'a>(
        &'a self,
        ctx: &'a RunContext,
        notification: &'a Notification,
    ) -> HookFuture<'a, ()> {
        match (&self.outer, self.stack.has(HookPoint::OnNotification)) {
            (None, false) => HookFuture::ok(()),
            (Some(outer), false) => outer.on_notification(ctx, notification),
            (None, true) => self
                .stack
                .on_notification(ctx, notification)
                .into_port(move |e| self.own(ctx, e)),
            (outer, true) => HookFuture::new(async move {
                if let Some(outer) = outer {
                    outer.on_notification(ctx, notification).await?;
                }
                let own = self.stack.on_notification(ctx, notification);
                own.await.map_err(|e| self.own(ctx, e))
            }),
        }
    }

    fn on_error<'a>(&'a self, ctx: &'a RunContext, error: &'a AgentError) -> HookFuture<'a, ()> {
        let hook = HookPoint::OnError;
        if let Some(e) = self.sole_here(hook) {
            return self.sole_port(e, ctx, hook, || e.mw.on_error(ctx, error), drop);
        }
        match (&self.outer, self.stack.has(hook)) {
            (None, false) => HookFuture::ok(()),
            (Some(outer), false) => outer.on_error(ctx, error),
            (None, true) => self
                .stack
                .on_error(ctx, error)
                .into_port(move |e| self.own(ctx, e)),
            (outer, true) => HookFuture::new(async move {
                let _ = self.stack.on_error(ctx, error).await;
                match outer {
                    Some(outer) => outer.on_error(ctx, error).await,
                    None => Ok(()),
                }
            }),
        }
    }

    fn after_agent<'a>(
        &'a self,
        ctx: &'a RunContext,
        outcome: RunOutcome<'a>,
    ) -> HookFuture<'a, ()> {
        let hook = HookPoint::AfterAgent;
        if let Some(e) = self.sole_here(hook) {
            return self.sole_port(e, ctx, hook, || e.mw.after_agent(ctx, outcome), drop);
        }
        match (&self.outer, self.stack.has(hook)) {
            (None, false) => HookFuture::ok(()),
            (Some(outer), false) => outer.after_agent(ctx, outcome),
            (None, true) => self
                .stack
                .after_agent(ctx, outcome)
                .into_port(move |e| self.own(ctx, e)),
            (outer, true) => HookFuture::new(async move {
                let _ = self.stack.after_agent(ctx, outcome).await;
                match outer {
                    Some(outer) => outer.after_agent(ctx, outcome).await,
                    None => Ok(()),
                }
            }),
        }
    }

    fn before_compaction<'a>(
        &'a self,
        ctx: &'a RunContext,
        messages: &'a History,
    ) -> HookFuture<'a, bool> {
        match (&self.outer, self.stack.has(HookPoint::BeforeCompaction)) {
            (None, false) => HookFuture::ok(true),
            (Some(outer), false) => outer.before_compaction(ctx, messages),
            (None, true) => self
                .stack
                .before_compaction(ctx, messages)
                .into_port(move |e| self.own(ctx, e)),
            (outer, true) => HookFuture::new(async move {
                let outer_allows = match outer {
                    Some(outer) => outer.before_compaction(ctx, messages).await?,
                    None => true,
                };
                let own = self.stack.before_compaction(ctx, messages);
                Ok(own.await.map_err(|e| self.own(ctx, e))? && outer_allows)
            }),
        }
    }

    fn after_compaction<'a>(
        &'a self,
        ctx: &'a RunContext,
        compaction: &'a Compaction,
    ) -> HookFuture<'a, ()> {
        match (&self.outer, self.stack.has(HookPoint::AfterCompaction)) {
            (None, false) => HookFuture::ok(()),
            (Some(outer), false) => outer.after_compaction(ctx, compaction),
            (None, true) => self
                .stack
                .after_compaction(ctx, compaction)
                .into_port(move |e| self.own(ctx, e)),
            (outer, true) => HookFuture::new(async move {
                let own = self.stack.after_compaction(ctx, compaction);
                own.await.map_err(|e| self.own(ctx, e))?;
                match outer {
                    Some(outer) => outer.after_compaction(ctx, compaction).await,
                    None => Ok(()),
                }
            }),
        }
    }
}
