//! Each hook point over a compiled stack: the order, the merging of values,
//! and what an error does.

use std::borrow::Cow;

use super::call_hook::{invoke, invoke_delta, log_ignored};
use super::edit_watch::watcher;
use super::stack::CompiledStack;
use super::verdict::merge_verdicts;
use super::HookPoint;
use crate::context::RunContext;
use crate::error::AgentError;
use crate::event::AgentEvent;
use crate::hooks::{
    ApprovalVerdict, Compaction, Notification, RunOutcome, RunStart, ToolCallResult, ToolVerdict,
};
use crate::request::ToolOutput;
use crate::types::{History, Message, ModelDelta, ModelResponse, ToolCall};

impl CompiledStack {
    /// Texts to add after the system prompt, in registration order.
    pub(crate) async fn before_agent(
        &self,
        ctx: &RunContext,
        start: RunStart,
    ) -> Result<Vec<String>, AgentError> {
        let hook = HookPoint::BeforeAgent;
        let mut texts = Vec::new();
        for e in self.at(hook) {
            let found = invoke(e, ctx, hook, || e.mw.before_agent(ctx, start)).await?;
            if let Some(Some(text)) = found {
                texts.push(text);
            }
        }
        Ok(texts)
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
            if let Some(Some(text)) =
                invoke(e, ctx, hook, || e.mw.before_run(ctx, input, messages)).await?
            {
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
            invoke(e, ctx, hook, || e.mw.before_model(ctx, messages)).await?;
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
            invoke(e, ctx, hook, || e.mw.after_model(ctx, response)).await?;
        }
        Ok(())
    }

    /// Every middleware's verdict, merged; each is asked with the arguments
    /// the ones before it left.
    pub(crate) async fn before_tool(
        &self,
        ctx: &RunContext,
        call: &ToolCall,
        resumed: bool,
    ) -> Result<ToolVerdict, AgentError> {
        let hook = HookPoint::BeforeTool;
        let mut merged = ToolVerdict::default();
        let mut current = Cow::Borrowed(call);
        for e in self.at(hook) {
            let asked = &*current;
            let Some(mut verdict) =
                invoke(e, ctx, hook, || e.mw.before_tool(ctx, asked, resumed)).await?
            else {
                continue;
            };
            if verdict.decided_by.is_none() {
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
                current.to_mut().arguments = arguments.to_string();
                ctx.emit(|| AgentEvent::ToolDecision {
                    run_id: ctx.run_id().clone(),
                    call_id: call.id.clone(),
                    decision: "rewrite",
                    decided_by: e.name.to_string(),
                });
            }
            merged = merge_verdicts(merged, verdict);
        }
        Ok(merged)
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
            invoke(e, ctx, hook, || e.mw.after_tool(ctx, call, output)).await?;
        }
        Ok(())
    }

    pub(crate) async fn after_tool_batch(
        &self,
        ctx: &RunContext,
        results: &[ToolCallResult],
    ) -> Result<(), AgentError> {
        let hook = HookPoint::AfterToolBatch;
        for e in self.at(hook) {
            invoke(e, ctx, hook, || e.mw.after_tool_batch(ctx, results)).await?;
        }
        Ok(())
    }

    /// The first middleware that keeps the run going decides; the rest are
    /// not asked.
    pub(crate) async fn before_stop(
        &self,
        ctx: &RunContext,
        output: &Message,
        continuations: u32,
    ) -> Result<Option<String>, AgentError> {
        let hook = HookPoint::BeforeStop;
        for e in self.at(hook) {
            if let Some(Some(text)) = invoke(e, ctx, hook, || {
                e.mw.before_stop(ctx, output, continuations)
            })
            .await?
            {
                return Ok(Some(text));
            }
        }
        Ok(None)
    }

    /// `false` if any middleware says so; every one is asked.
    pub(crate) async fn before_compaction(
        &self,
        ctx: &RunContext,
        messages: &History,
    ) -> Result<bool, AgentError> {
        let hook = HookPoint::BeforeCompaction;
        let mut proceed = true;
        for e in self.at(hook) {
            if let Some(false) =
                invoke(e, ctx, hook, || e.mw.before_compaction(ctx, messages)).await?
            {
                proceed = false;
            }
        }
        Ok(proceed)
    }

    pub(crate) async fn after_compaction(
        &self,
        ctx: &RunContext,
        compaction: &Compaction,
    ) -> Result<(), AgentError> {
        let hook = HookPoint::AfterCompaction;
        for e in self.at(hook) {
            invoke(e, ctx, hook, || e.mw.after_compaction(ctx, compaction)).await?;
        }
        Ok(())
    }

    /// `false` if any middleware blocks the switch; every one is asked.
    pub(crate) async fn before_model_switch(
        &self,
        ctx: &RunContext,
        from: &str,
        to: &str,
    ) -> Result<bool, AgentError> {
        let hook = HookPoint::BeforeModelSwitch;
        let mut allowed = true;
        for e in self.at(hook) {
            if let Some(false) =
                invoke(e, ctx, hook, || e.mw.before_model_switch(ctx, from, to)).await?
            {
                allowed = false;
            }
        }
        Ok(allowed)
    }

    /// The first middleware that decides does; the rest are not asked.
    pub(crate) async fn decide_approval(
        &self,
        ctx: &RunContext,
        call: &ToolCall,
    ) -> Result<Option<ApprovalVerdict>, AgentError> {
        let hook = HookPoint::DecideApproval;
        for e in self.at(hook) {
            if let Some(Some(decision)) =
                invoke(e, ctx, hook, || e.mw.decide_approval(ctx, call)).await?
            {
                return Ok(Some(ApprovalVerdict {
                    decision,
                    decided_by: Some(e.name.to_string()),
                }));
            }
        }
        Ok(None)
    }

    pub(crate) async fn on_notification(
        &self,
        ctx: &RunContext,
        notification: &Notification,
    ) -> Result<(), AgentError> {
        let hook = HookPoint::OnNotification;
        for e in self.at(hook) {
            invoke(e, ctx, hook, || e.mw.on_notification(ctx, notification)).await?;
        }
        Ok(())
    }

    /// Every middleware's `on_error`; their errors are logged, never returned.
    pub(crate) async fn on_error(&self, ctx: &RunContext, error: &AgentError) {
        let hook = HookPoint::OnError;
        for e in self.at(hook) {
            if let Err(err) = invoke(e, ctx, hook, || e.mw.on_error(ctx, error)).await {
                log_ignored(ctx, &e.name, hook, &err);
            }
        }
    }

    /// Every middleware's `after_agent`; their errors are logged, never
    /// returned.
    pub(crate) async fn after_agent(&self, ctx: &RunContext, outcome: RunOutcome<'_>) {
        let hook = HookPoint::AfterAgent;
        for e in self.at(hook) {
            if let Err(err) = invoke(e, ctx, hook, || e.mw.after_agent(ctx, outcome)).await {
                log_ignored(ctx, &e.name, hook, &err);
            }
        }
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
