//! The run loop: model → tool calls → model … until a final answer.

use std::sync::Arc;

use tower::ServiceExt;
use tracing::Instrument;

use super::handoff::find_agent;
use super::inbox::Inbox;
use super::observe::{ModelCallObserver, RunObserver};
use super::state::{classify, race, Run};
use super::tools::Step;
use super::Config;
use crate::error::AgentError;
use crate::hooks::{installed, RunOutcome, RunStart, StickyApprovals};
use crate::request::{DeltaSink, ModelCall, ModelCallParts, RunInput, RunRequest};
use crate::types::{
    AgentRun, Checkpoint, History, Message, ModelDelta, ModelRequest, ModelResponse, Role,
    RunStatus, StopReason,
};

pub(super) async fn run(config: Arc<Config>, request: RunRequest) -> Result<AgentRun, AgentError> {
    let ctx = request.context.clone();
    ctx.set_agent_name(&config.name);
    let observer = RunObserver::open(&ctx, &config.name);
    let span = observer.span().clone();
    // The hooks that open the run close it, even if a handoff changed
    // those installed since.
    let opened = installed(&ctx);
    let result = execute(config.clone(), request).instrument(span).await;
    observer.close(&result);
    // A lifecycle layer that brackets the run closes it itself, with the
    // result its caller gets; otherwise (a nested run that inherited its
    // parent's hooks) the loop does. Errors of these hooks cannot change the
    // result: the stack logs them.
    if !ctx.is_bracketed() {
        if let Some(hooks) = opened {
            if let Err(err) = &result {
                let _ = hooks.on_error(&ctx, err).await;
            }
            let _ = hooks.after_agent(&ctx, RunOutcome::of(&result)).await;
        }
    }
    result
}

async fn execute(config: Arc<Config>, request: RunRequest) -> Result<AgentRun, AgentError> {
    let RunRequest {
        input,
        history,
        context: ctx,
        stream,
        mut extensions,
    } = request;
    // The run's own: nested runs and model calls do not see it.
    let inbox = extensions.remove::<Inbox>();
    let hooks = installed(&ctx);
    if hooks.is_some() {
        // What the hooks may ask of a tool: its declared traits.
        ctx.insert_state(config.flags.clone());
    }
    let has_history = !history.is_empty();
    let resumed = matches!(input, RunInput::Resume { .. });
    let mut run = Run::new(config, ctx, hooks, stream, extensions);
    run.inbox = inbox;
    // `before_agent` comes first, before the input guard.
    let start_context = run.start_hooks(resumed, has_history).await?;
    let resume = match input {
        RunInput::Message(input) => {
            let history = if history.is_empty() {
                run.ctx.take_provided_history().unwrap_or(history)
            } else {
                history
            };
            run.begin(input, history).await?;
            None
        }
        RunInput::Resume {
            checkpoint,
            decisions,
        } => {
            run.restore(&checkpoint)?;
            Some((checkpoint, decisions))
        }
    };
    run.add_start_context(start_context);
    if let Some((checkpoint, decisions)) = resume {
        let calls = checkpoint
            .pending
            .iter()
            .map(|p| (p.index, p.call.clone()))
            .collect();
        let completed = checkpoint.completed.clone();
        if let Step::Paused(checkpoint) = run.tool_step(calls, &decisions, true, completed).await? {
            return Ok(run.snapshot(RunStatus::Paused(checkpoint), String::new(), None));
        }
        run.finish_handoff()?;
    }
    run.turns().await
}

impl Run {
    /// A new run: system prompt, history, the input guard, the input.
    ///
    /// A history that already starts with the system prompt (the transcript
    /// of an earlier run of this agent) is used as it is, so a long thread
    /// costs nothing to continue.
    async fn begin(&mut self, mut input: Message, mut messages: History) -> Result<(), AgentError> {
        if let Some(instructions) = &self.config.instructions {
            let starts_with_prompt = messages
                .first()
                .is_some_and(|m| m.role == Role::System && m.text() == instructions.as_str());
            if !starts_with_prompt {
                messages
                    .to_mut()
                    .insert(0, Message::system(instructions.as_str()));
            }
        }
        let added = match &self.hooks {
            Some(hooks) => hooks
                .before_run(&self.ctx, &mut input, &messages)
                .await
                .map_err(classify)?,
            None => Vec::new(),
        };
        messages.push(input);
        messages.extend(added.into_iter().map(Message::system));
        self.messages = messages;
        Ok(())
    }

    /// A resumed run: where the checkpoint left off, as the agent that
    /// paused it (the run may have been handed over to it).
    fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), AgentError> {
        if checkpoint.agent != *self.config.name {
            let Some(target) = find_agent(&self.config, &checkpoint.agent) else {
                return Err(AgentError::Config(format!(
                    "a checkpoint of agent `{}` cannot be resumed by agent `{}`",
                    checkpoint.agent, self.config.name
                )));
            };
            self.switch_to(&target);
        }
        self.restore_handoff(checkpoint.handoff.as_deref());
        self.messages = History::from(checkpoint.messages.clone());
        self.counters = checkpoint.counters;
        self.output_attempts = checkpoint.output_attempts;
        self.ctx
            .seed_usage(checkpoint.usage, checkpoint.usage_total);
        self.ctx.set_iteration(checkpoint.iteration);
        if !checkpoint.approvals.is_empty() {
            StickyApprovals::of(&self.ctx).extend(checkpoint.approvals.iter().cloned());
        }
        Ok(())
    }

    /// `before_agent`: context after the system prompt, for this run only. A
    /// run a lifecycle layer brackets gets what the layer's `before_agent`
    /// hooks added instead.
    async fn start_hooks(
        &mut self,
        resumed: bool,
        has_history: bool,
    ) -> Result<Vec<String>, AgentError> {
        if self.ctx.is_bracketed() {
            return Ok(self.ctx.take_bracket_context());
        }
        let Some(hooks) = &self.hooks else {
            return Ok(Vec::new());
        };
        let start = RunStart {
            resumed,
            has_history,
        };
        hooks.before_agent(&self.ctx, start).await.map_err(classify)
    }

    /// Puts the `before_agent` context, and what hooks added with
    /// `RunContext::add_run_context`, right after the system prompt.
    fn add_start_context(&mut self, mut texts: Vec<String>) {
        texts.extend(self.ctx.take_run_context());
        if texts.is_empty() {
            return;
        }
        self.ephemeral = texts.into_iter().map(Message::system).collect();
        let at = usize::from(
            self.messages
                .first()
                .is_some_and(|m| m.role == Role::System),
        );
        self.messages
            .to_mut()
            .splice(at..at, self.ephemeral.iter().cloned());
    }

    /// Turns until the run ends.
    async fn turns(mut self) -> Result<AgentRun, AgentError> {
        loop {
            // The agent running the run decides (a handoff changes it).
            let max_turns = self.config.max_turns;
            if let Some(stop) = self.ctx.stop_requested() {
                return Ok(self.snapshot(RunStatus::Stopped(stop), String::new(), None));
            }
            if self.ctx.is_cancelled() {
                return Err(AgentError::Cancelled);
            }
            if self.counters.turns >= max_turns {
                let partial = self.snapshot(
                    RunStatus::Stopped(StopReason {
                        reason: format!("max_turns ({max_turns}) reached"),
                        by: Some("agent".into()),
                    }),
                    String::new(),
                    None,
                );
                return Err(AgentError::MaxTurns {
                    limit: max_turns,
                    partial: Box::new(partial),
                });
            }
            let turn = self.counters.turns + 1;
            self.counters.turns = turn;
            self.ctx.set_iteration(turn);
            self.take_queued().await?;
            for text in self.ctx.take_context() {
                self.messages.push(Message::system(text));
            }
            if let Some(hooks) = &self.hooks {
                let edits = self.messages.edit_count();
                hooks
                    .before_model(&self.ctx, &mut self.messages)
                    .await
                    .map_err(classify)?;
                if self.messages.edit_count() != edits {
                    self.messages
                        .check_integrity()
                        .map_err(AgentError::HistoryIntegrity)?;
                }
            }

            let mut message = self.model_turn(turn).await?.message;
            message.role = Role::Assistant;
            for (i, call) in message.tool_calls.iter_mut().enumerate() {
                if call.id.is_empty() {
                    call.id = format!("call_{turn}_{}", i + 1);
                }
            }
            let calls: Vec<(usize, _)> = message.tool_calls.iter().cloned().enumerate().collect();
            self.messages.push(message);

            if calls.is_empty() {
                let last = self.messages.last().expect("just pushed");
                let text = last.text().into_owned();
                if let Some(hooks) = &self.hooks {
                    if turn < max_turns {
                        let more = hooks
                            .before_stop(&self.ctx, last, self.continuations)
                            .await
                            .map_err(classify)?;
                        if let Some(more) = more {
                            self.continuations += 1;
                            self.messages.push(Message::user(more));
                            continue;
                        }
                    }
                }
                if turn < max_turns && self.continues_for_queued() {
                    // Messages queued while the model answered: it answers them too.
                    continue;
                }
                let structured = match &self.config.output {
                    None => None,
                    Some(output) => match output.check(&text) {
                        Ok(value) => Some(value),
                        Err(problem) => {
                            self.output_attempts += 1;
                            if self.output_attempts > output.retries {
                                return Err(AgentError::StructuredOutput {
                                    attempts: self.output_attempts,
                                    message: problem,
                                    raw: text,
                                });
                            }
                            self.messages.push(Message::user(problem));
                            continue;
                        }
                    },
                };
                return Ok(self.snapshot(RunStatus::Completed, text, structured));
            }

            self.continuations = 0;
            let (calls, answered) = self.answer_handoffs(calls).await?;
            if calls.is_empty() {
                // Only handoffs: their answers, in call order.
                self.messages.extend(answered.into_iter().map(|(_, m)| m));
            } else if let Step::Paused(checkpoint) =
                self.tool_step(calls, &[], false, answered).await?
            {
                return Ok(self.snapshot(RunStatus::Paused(checkpoint), String::new(), None));
            }
            self.finish_handoff()?;
        }
    }

    /// One model call, through the hooks and the model stack.
    async fn model_turn(&mut self, turn: u32) -> Result<ModelResponse, AgentError> {
        let config = &self.config;
        let ctx = &self.ctx;
        let hold = self.stream.is_some() && self.hooks.as_ref().is_some_and(|h| h.holds_stream());
        let stream = if hold {
            Some(DeltaSink::provisional(|_| {}))
        } else {
            self.stream.clone()
        };
        let call = ModelCall::from_parts(ModelCallParts {
            request: ModelRequest {
                model: config.model_name.clone(),
                messages: self.messages.clone(),
                tools: config.specs.clone(),
                settings: config.settings.clone(),
            },
            stream,
            context: ctx.clone(),
            extensions: self.extensions.clone(),
        });
        let observer = ModelCallObserver::open(ctx, &config.name, &config.model_name, turn);
        let fut: crate::hooks::HookFuture<'_, ModelResponse> = match &self.hooks {
            Some(hooks) => hooks.wrap_model(call, config.model.clone()),
            None => crate::hooks::HookFuture::new(config.model.clone().oneshot(call)),
        };
        let result = race(ctx, fut.instrument(observer.span().clone()))
            .await
            .and_then(|r| r.map_err(classify));
        self.counters.model_calls += 1;
        let mut response = match result {
            Ok(response) => response,
            Err(err) => {
                observer.failed(&err);
                return Err(err);
            }
        };
        if !response.usage_recorded {
            ctx.record_usage(&response.model, response.usage);
            response.usage_recorded = true;
        }
        observer.record(&response);
        if let Some(hooks) = &self.hooks {
            if let Err(err) = hooks
                .after_model(ctx, &mut response)
                .await
                .map_err(classify)
            {
                observer.failed(&err);
                return Err(err);
            }
        }
        observer.completed(&response);
        if hold {
            if let Some(sink) = &self.stream {
                let text = response.message.text();
                if !text.is_empty() {
                    sink.send(&ModelDelta::text(text));
                }
            }
        }
        Ok(response)
    }
}
