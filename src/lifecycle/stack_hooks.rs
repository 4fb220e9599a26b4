//! Each hook point over a compiled stack: the order, the merging of values,
//! and what an error does.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

use super::call_hook::{finish, invoke, invoke_delta, invoke_now, log_ignored, Invoked};
use super::edit_watch::watcher;
use super::stack::{CompiledStack, StackEntry};
use super::verdict::{decision_rank, merge_verdicts};
use super::{Hook, HookPoint};
use crate::context::RunContext;
use crate::error::{AgentError, BoxError};
use crate::event::AgentEvent;
use crate::hooks::{
    ApprovalVerdict, Compaction, HookFuture, Notification, RunOutcome, RunStart, ToolCallResult,
    ToolVerdict,
};
use crate::request::ToolOutput;
use crate::types::{History, Message, ModelDelta, ModelResponse, ToolCall};

impl CompiledStack {
    /// The `i`-th middleware in the order `hook` calls them (reversed for
    /// the hooks that see what comes back).
    #[inline]
    fn nth(&self, hook: HookPoint, i: usize) -> &StackEntry {
        let n = self.entries.len();
        &self.entries[if hook.is_reversed() { n - 1 - i } else { i }]
    }

    /// Runs a hook point whose arguments are all shared over the stack:
    /// synchronously while every middleware answers at once (no future is
    /// boxed), then, from the first one that waits, in a boxed future.
    /// `step` takes each value in call order and says whether to stop
    /// there. At `on_error` and `after_agent` errors are logged, never
    /// returned.
    fn fold<'a, T, A>(
        &'a self,
        ctx: &'a RunContext,
        hook: HookPoint,
        mut acc: A,
        call: impl Fn(&'a StackEntry) -> Hook<'a, T> + Send + Sync + 'a,
        step: impl Fn(&mut A, &'a StackEntry, T) -> bool + Send + 'a,
    ) -> Folded<'a, A>
    where
        T: Send + 'a,
        A: Send + 'a,
    {
        let tolerant = matches!(hook, HookPoint::OnError | HookPoint::AfterAgent);
        let absorb =
            move |acc: &mut A, e: &'a StackEntry, found: Result<Option<T>, AgentError>| match found
            {
                Ok(None) => Ok(false),
                Ok(Some(value)) => Ok(step(acc, e, value)),
                Err(err) if tolerant => {
                    log_ignored(ctx, &e.name, hook, &err);
                    Ok(false)
                }
                Err(err) => Err(err),
            };
        let n = self.entries.len();
        for i in 0..n {
            let e = self.nth(hook, i);
            if !e.may_override(hook) {
                continue;
            }
            match invoke_now(e, ctx, hook, || call(e)) {
                Invoked::Done(found) => match absorb(&mut acc, e, found) {
                    Ok(false) => {}
                    Ok(true) => return Folded::now(Ok(acc)),
                    Err(err) => return Folded::now(Err(err)),
                },
                Invoked::Pending(future) => {
                    return Folded::Later(Box::pin(async move {
                        let found = finish(e, ctx, hook, future).await;
                        if absorb(&mut acc, e, found)? {
                            return Ok(acc);
                        }
                        for j in i + 1..n {
                            let e = self.nth(hook, j);
                            if !e.may_override(hook) {
                                continue;
                            }
                            let found = invoke(e, ctx, hook, || call(e)).await;
                            if absorb(&mut acc, e, found)? {
                                return Ok(acc);
                            }
                        }
                        Ok(acc)
                    }))
                }
            }
        }
        Folded::now(Ok(acc))
    }

    /// Texts to add after the system prompt, in registration order.
    pub(crate) fn before_agent<'a>(
        &'a self,
        ctx: &'a RunContext,
        start: RunStart,
    ) -> Folded<'a, Vec<String>> {
        self.fold(
            ctx,
            HookPoint::BeforeAgent,
            Vec::new(),
            move |e| e.mw.before_agent(ctx, start),
            |texts, _, found| {
                if let Some(text) = found {
                    texts.push(text);
                }
                false
            },
        )
    }

    /// Every middleware's verdict, merged; each is asked with the arguments
    /// the ones before it left. Synchronous while every middleware answers
    /// at once and none rewrites the arguments (nothing is boxed for a
    /// verdict there at once); the rest, from the first that waits or
    /// after a rewrite, in a boxed future.
    pub(crate) fn before_tool<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        resumed: bool,
    ) -> Folded<'a, ToolVerdict> {
        let hook = HookPoint::BeforeTool;
        let mut merged = ToolVerdict::default();
        for i in 0..self.entries.len() {
            let e = self.nth(hook, i);
            if !e.may_override(hook) {
                continue;
            }
            let verdict = match invoke_now(e, ctx, hook, || e.mw.before_tool(ctx, call, resumed)) {
                Invoked::Done(Ok(None)) => continue,
                Invoked::Done(Ok(Some(verdict))) => verdict,
                Invoked::Done(Err(err)) => return Folded::now(Err(err)),
                pending @ Invoked::Pending(_) => {
                    let current = Cow::Borrowed(call);
                    return Folded::Later(Box::pin(self.before_tool_from(
                        ctx,
                        call,
                        resumed,
                        i,
                        Some(pending),
                        merged,
                        current,
                    )));
                }
            };
            let mut current = Cow::Borrowed(call);
            merged = take_verdict(ctx, call, e, Some(&mut current), merged, verdict);
            if let Cow::Owned(_) = current {
                // The ones after see the rewrite, which lives in the future.
                return Folded::Later(Box::pin(self.before_tool_from(
                    ctx,
                    call,
                    resumed,
                    i + 1,
                    None,
                    merged,
                    current,
                )));
            }
        }
        Folded::now(Ok(merged))
    }

    /// [`before_tool`](Self::before_tool) from the `i`-th middleware on,
    /// whose answer is `first` if it was asked already, into `merged`, each
    /// asked with `current`.
    #[allow(clippy::too_many_arguments)]
    async fn before_tool_from<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        resumed: bool,
        i: usize,
        mut first: Option<Invoked<'a, ToolVerdict>>,
        mut merged: ToolVerdict,
        mut current: Cow<'a, ToolCall>,
    ) -> Result<ToolVerdict, AgentError> {
        let hook = HookPoint::BeforeTool;
        for j in i..self.entries.len() {
            let e = self.nth(hook, j);
            let found = match first.take() {
                Some(Invoked::Done(found)) => found,
                Some(Invoked::Pending(future)) => finish(e, ctx, hook, future).await,
                None if !e.may_override(hook) => continue,
                None => {
                    let asked = &*current;
                    invoke(e, ctx, hook, || e.mw.before_tool(ctx, asked, resumed)).await
                }
            };
            let Some(verdict) = found? else {
                continue;
            };
            merged = take_verdict(ctx, call, e, Some(&mut current), merged, verdict);
        }
        Ok(merged)
    }

    pub(crate) fn after_tool_batch<'a>(
        &'a self,
        ctx: &'a RunContext,
        results: &'a [ToolCallResult<'a>],
    ) -> Folded<'a, ()> {
        self.fold(
            ctx,
            HookPoint::AfterToolBatch,
            (),
            move |e| e.mw.after_tool_batch(ctx, results),
            |_, _, ()| false,
        )
    }

    /// The first middleware that keeps the run going decides; the rest are
    /// not asked.
    pub(crate) fn before_stop<'a>(
        &'a self,
        ctx: &'a RunContext,
        output: &'a Message,
        continuations: u32,
    ) -> Folded<'a, Option<String>> {
        self.fold(
            ctx,
            HookPoint::BeforeStop,
            None,
            move |e| e.mw.before_stop(ctx, output, continuations),
            |decided, _, found| {
                *decided = found;
                decided.is_some()
            },
        )
    }

    /// `false` if any middleware says so; every one is asked.
    pub(crate) fn before_compaction<'a>(
        &'a self,
        ctx: &'a RunContext,
        messages: &'a History,
    ) -> Folded<'a, bool> {
        self.fold(
            ctx,
            HookPoint::BeforeCompaction,
            true,
            move |e| e.mw.before_compaction(ctx, messages),
            |proceed, _, found| {
                *proceed &= found;
                false
            },
        )
    }

    pub(crate) fn after_compaction<'a>(
        &'a self,
        ctx: &'a RunContext,
        compaction: &'a Compaction,
    ) -> Folded<'a, ()> {
        self.fold(
            ctx,
            HookPoint::AfterCompaction,
            (),
            move |e| e.mw.after_compaction(ctx, compaction),
            |_, _, ()| false,
        )
    }

    /// `false` if any middleware blocks the switch; every one is asked.
    pub(crate) fn before_model_switch<'a>(
        &'a self,
        ctx: &'a RunContext,
        from: &'a str,
        to: &'a str,
    ) -> Folded<'a, bool> {
        self.fold(
            ctx,
            HookPoint::BeforeModelSwitch,
            true,
            move |e| e.mw.before_model_switch(ctx, from, to),
            |allowed, _, found| {
                *allowed &= found;
                false
            },
        )
    }

    /// The first middleware that decides does; the rest are not asked.
    pub(crate) fn decide_approval<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
    ) -> Folded<'a, Option<ApprovalVerdict>> {
        self.fold(
            ctx,
            HookPoint::DecideApproval,
            None,
            move |e| e.mw.decide_approval(ctx, call),
            |decided, e, found| match found {
                Some(decision) => {
                    *decided = Some(ApprovalVerdict {
                        decision,
                        decided_by: Some(e.name.to_string()),
                    });
                    true
                }
                None => false,
            },
        )
    }

    pub(crate) fn on_notification<'a>(
        &'a self,
        ctx: &'a RunContext,
        notification: &'a Notification,
    ) -> Folded<'a, ()> {
        self.fold(
            ctx,
            HookPoint::OnNotification,
            (),
            move |e| e.mw.on_notification(ctx, notification),
            |_, _, ()| false,
        )
    }

    /// Every middleware's `on_error`; their errors are logged, never
    /// returned.
    pub(crate) fn on_error<'a>(
        &'a self,
        ctx: &'a RunContext,
        error: &'a AgentError,
    ) -> Folded<'a, ()> {
        self.fold(
            ctx,
            HookPoint::OnError,
            (),
            move |e| e.mw.on_error(ctx, error),
            |_, _, ()| false,
        )
    }

    /// Every middleware's `after_agent`; their errors are logged, never
    /// returned.
    pub(crate) fn after_agent<'a>(
        &'a self,
        ctx: &'a RunContext,
        outcome: RunOutcome<'a>,
    ) -> Folded<'a, ()> {
        self.fold(
            ctx,
            HookPoint::AfterAgent,
            (),
            move |e| e.mw.after_agent(ctx, outcome),
            |_, _, ()| false,
        )
    }

    /// Texts to add after the input, in registration order.
    pub(crate) async fn before_run(
        &self,
        ctx: &RunContext,
        input: &mut Message,
        messages: &History,
    ) -> Result<Vec<String>, AgentError> {
        let hook = HookPoint::BeforeRun;
        let mut texts = Vec::new();
        for e in self.at(hook) {
            let input = &mut *input;
            let found = match invoke_now(e, ctx, hook, || e.mw.before_run(ctx, input, messages)) {
                Invoked::Done(found) => found?,
                Invoked::Pending(future) => finish(e, ctx, hook, future).await?,
            };
            if let Some(Some(text)) = found {
                texts.push(text);
            }
        }
        Ok(texts)
    }

    pub(crate) async fn before_model(
        &self,
        ctx: &RunContext,
        messages: &mut History,
    ) -> Result<(), AgentError> {
        let hook = HookPoint::BeforeModel;
        // A prompt-cache guard in the run asks who changed the messages.
        let edits = watcher(ctx);
        for e in self.at(hook) {
            let before = edits.as_ref().map(|_| messages.clone());
            let messages = &mut *messages;
            if let Some(future) = pending(invoke_now(e, ctx, hook, || {
                e.mw.before_model(ctx, messages)
            }))? {
                finish(e, ctx, hook, future).await?;
            }
            if let (Some(edits), Some(before)) = (&edits, before) {
                edits.record(&e.name, before, messages);
            }
        }
        Ok(())
    }

    pub(crate) async fn after_model(
        &self,
        ctx: &RunContext,
        response: &mut ModelResponse,
    ) -> Result<(), AgentError> {
        let hook = HookPoint::AfterModel;
        for e in self.at(hook) {
            let response = &mut *response;
            if let Some(future) =
                pending(invoke_now(e, ctx, hook, || e.mw.after_model(ctx, response)))?
            {
                finish(e, ctx, hook, future).await?;
            }
        }
        Ok(())
    }

    pub(crate) async fn after_tool(
        &self,
        ctx: &RunContext,
        call: &ToolCall,
        output: &mut ToolOutput,
    ) -> Result<(), AgentError> {
        let hook = HookPoint::AfterTool;
        for e in self.at(hook) {
            let output = &mut *output;
            if let Some(future) = pending(invoke_now(e, ctx, hook, || {
                e.mw.after_tool(ctx, call, output)
            }))? {
                finish(e, ctx, hook, future).await?;
            }
        }
        Ok(())
    }

    /// The delta hooks, synchronous: the first error stops the stream.
    pub(crate) fn on_model_delta(
        &self,
        ctx: &RunContext,
        delta: &mut ModelDelta,
    ) -> Result<(), AgentError> {
        let hook = HookPoint::OnModelDelta;
        for e in self.at(hook) {
            invoke_delta(e, ctx, hook, || e.mw.on_model_delta(ctx, delta))?;
        }
        Ok(())
    }

    pub(crate) fn on_tool_delta(
        &self,
        ctx: &RunContext,
        call: &ToolCall,
        delta: &mut ModelDelta,
    ) -> Result<(), AgentError> {
        let hook = HookPoint::OnToolDelta;
        for e in self.at(hook) {
            invoke_delta(e, ctx, hook, || e.mw.on_tool_delta(ctx, call, delta))?;
        }
        Ok(())
    }
}

/// The pending future of a hook that has no answer yet; an answer already
/// there is dropped (the hooks over `&mut` values return nothing), its error
/// returned. Only the future lives across the loops' awaits.
#[inline]
fn pending<T>(invoked: Invoked<'_, T>) -> Result<Option<HookBox<'_, T>>, AgentError> {
    match invoked {
        Invoked::Done(found) => found.map(|_| None),
        Invoked::Pending(future) => Ok(Some(future)),
    }
}

type HookBox<'h, T> = BoxFuture<'h, Result<T, BoxError>>;

/// A hook point's result over a stack: settled at once, or still waiting
/// (boxed only then).
#[must_use = "futures do nothing unless polled"]
pub(crate) enum Folded<'a, A> {
    Now(Option<Result<A, AgentError>>),
    Later(BoxFuture<'a, Result<A, AgentError>>),
}

impl<'a, A: Send + 'a> Folded<'a, A> {
    fn now(result: Result<A, AgentError>) -> Self {
        Folded::Now(Some(result))
    }

    /// As the port answers, with `own` boxing this stack's errors.
    pub(crate) fn into_port(
        self,
        own: impl FnOnce(AgentError) -> BoxError + Send + 'a,
    ) -> HookFuture<'a, A> {
        match self {
            Folded::Now(result) => {
                HookFuture::ready(result.expect("Folded polled after completion").map_err(own))
            }
            Folded::Later(future) => HookFuture::new(async move { future.await.map_err(own) }),
        }
    }
}

// Nothing is pinned structurally: the waiting future is pinned on the heap.
impl<A> Unpin for Folded<'_, A> {}

impl<A> Future for Folded<'_, A> {
    type Output = Result<A, AgentError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Folded::Now(result) => {
                Poll::Ready(result.take().expect("Folded polled after completion"))
            }
            Folded::Later(future) => future.as_mut().poll(cx),
        }
    }
}

/// The verdict of `e`, the only middleware at `before_tool`: named after it
/// where it decides, and logged.
pub(crate) fn sole_verdict(
    ctx: &RunContext,
    call: &ToolCall,
    e: &StackEntry,
    verdict: ToolVerdict,
) -> ToolVerdict {
    take_verdict(ctx, call, e, None, ToolVerdict::default(), verdict)
}

/// Merges the verdict `e` answered at `before_tool` into `merged`: named
/// after `e` where it decides, logged, and its rewrite applied to
/// `current` (the call the middleware after it are asked with), if any
/// come after it.
fn take_verdict(
    ctx: &RunContext,
    call: &ToolCall,
    e: &StackEntry,
    current: Option<&mut Cow<'_, ToolCall>>,
    merged: ToolVerdict,
    mut verdict: ToolVerdict,
) -> ToolVerdict {
    // Who decided is read only where the verdict outranks the ones before
    // it: a plain "continue" names nobody, and allocates nothing for it.
    if verdict.decided_by.is_none()
        && decision_rank(&verdict.decision) > decision_rank(&merged.decision)
    {
        verdict.decided_by = Some(e.name.to_string());
    }
    tracing::debug!(
        middleware = %e.name,
        call_id = %call.id,
        decision = verdict.decision.as_str(),
        rewrite = verdict.updated_arguments.is_some(),
        "before_tool verdict"
    );
    if let Some(arguments) = &verdict.updated_arguments {
        if let Some(current) = current {
            current.to_mut().arguments = arguments.to_string();
        }
        ctx.emit(|| AgentEvent::ToolDecision {
            run_id: ctx.run_id().clone(),
            call_id: call.id.clone(),
            decision: "rewrite",
            decided_by: e.name.to_string(),
        });
    }
    merge_verdicts(merged, verdict)
}
