//! One run in progress: its state, and what every step of the loop shares
//! (racing the run's cancellation and deadline, classifying errors, the
//! transcript, snapshots and checkpoints).

use std::sync::Arc;

use serde_json::Value;

use super::inbox::Inbox;
use super::Config;
use crate::context::RunContext;
use crate::error::{AgentError, BoxError};
use crate::hooks::{HookPort, StickyApprovals};
use crate::request::{BoxModel, DeltaSink};
use crate::types::{AgentRun, Checkpoint, Counters, History, Message, PendingCall, RunStatus};

/// One run in progress.
pub(super) struct Run {
    pub(super) config: Arc<Config>,
    pub(super) ctx: RunContext,
    pub(super) hooks: Option<Arc<dyn HookPort>>,
    pub(super) messages: History,
    /// Context added for this run only; left out of the transcript (a
    /// boxed slice: most runs have none, and every run carries the room).
    pub(super) ephemeral: Box<[Message]>,
    pub(super) stream: Option<DeltaSink>,
    pub(super) extensions: http::Extensions,
    pub(super) counters: Counters,
    pub(super) output_attempts: u32,
    pub(super) continuations: u32,
    /// A handoff the current step decided on, applied once its calls ran
    /// (boxed: most runs never hand over, and every run carries the room).
    pub(super) handoff: Option<Box<Decided>>,
    /// Messages queued into the run through its handle.
    pub(super) inbox: Option<Inbox>,
    /// The run's clone of the agent's model stack, made at its first call
    /// without hooks (hooks get a clone per call) and dropped by a handoff.
    pub(super) model: Option<BoxModel>,
}

impl Run {
    /// A run of the conversation `messages`.
    pub(super) fn new(
        config: Arc<Config>,
        ctx: RunContext,
        hooks: Option<Arc<dyn HookPort>>,
        stream: Option<DeltaSink>,
        extensions: http::Extensions,
        messages: History,
    ) -> Self {
        ctx.set_show_tool_panics(config.limits.show_panics);
        Self {
            config,
            ctx,
            hooks,
            messages,
            ephemeral: Box::default(),
            stream,
            extensions,
            counters: Counters::default(),
            output_attempts: 0,
            continuations: 0,
            handoff: None,
            inbox: None,
            model: None,
        }
    }

    /// The conversation without the context added for this run only: shared
    /// with the run's history (O(1)) unless there is such context.
    pub(super) fn transcript(&self) -> History {
        if self.ephemeral.is_empty() {
            return self.messages.clone();
        }
        let mut messages = self.messages.to_vec();
        for ephemeral in self.ephemeral.iter() {
            if let Some(at) = messages.iter().position(|m| m == ephemeral) {
                messages.remove(at);
            }
        }
        History::from(messages)
    }

    /// What a paused run needs to be resumed.
    pub(super) fn checkpoint(
        &self,
        completed: Vec<(usize, Message)>,
        pending: Vec<PendingCall>,
    ) -> Checkpoint {
        Checkpoint {
            agent: self.config.name.to_string(),
            run_id: self.ctx.run_id().to_string(),
            thread_id: self.ctx.thread_id().map(str::to_owned),
            messages: self.transcript().into_vec(),
            completed,
            pending,
            iteration: self.ctx.iteration(),
            usage: self.ctx.usage(),
            usage_total: self.ctx.total_usage(),
            counters: self.counters,
            output_attempts: self.output_attempts,
            handoff: self.decided_target(),
            approvals: StickyApprovals::find(&self.ctx)
                .map(|s| s.to_vec())
                .unwrap_or_default(),
        }
    }

    /// The run as it stands, ended with `status`.
    pub(super) fn snapshot(
        &self,
        status: RunStatus,
        output: String,
        structured: Option<serde_json::Value>,
    ) -> AgentRun {
        let (usage, usage_total, cost) = self.ctx.usage_figures();
        AgentRun {
            run_id: self.ctx.run_id().clone(),
            agent: self.config.name.clone(),
            messages: self.transcript(),
            output,
            structured,
            usage,
            usage_total,
            cost,
            counters: self.counters,
            status,
        }
    }
}

pub(super) fn classify(err: BoxError) -> AgentError {
    AgentError::classify(err)
}

/// A handoff the run decided on, applied once the step's other calls ran.
#[derive(Debug, Clone)]
pub(super) struct Decided {
    /// Its position in the agent's handoffs.
    pub(super) handoff: usize,
    pub(super) call_id: String,
    pub(super) reason: Option<Value>,
}
