//! One step's tool calls: verdicts, approvals, dispatch, results in order.

use std::borrow::Cow;

use futures::future::{try_join_all, BoxFuture};
use smallvec::SmallVec;

use super::bare_tool::BareToolCall;
use super::hooked_tool::HookedToolCall;
use super::limits::ToolLimits;
use super::observe::ToolCallObserver;
use super::state::{classify, Run};
use super::ToolFlags;
use crate::context::Guard;
use crate::error::{attribute_tripwire, AgentError, ToolPanicked};
use crate::event::AgentEvent;
use crate::hooks::{Notification, StickyApprovals, ToolCallResult, ToolDecision, ToolVerdict};
use crate::request::{tool_failure, ToolOutput};
use crate::types::{
    arguments_hash, ApprovalDecision, Checkpoint, History, Message, MessageContent, PendingCall,
    StickyApproval, ToolCall,
};

/// How a step ended.
pub(super) enum Step {
    /// Every call has its result, appended to the conversation.
    Done,
    /// Some calls wait for a decision.
    Paused(Box<Checkpoint>),
}

/// The calls a step runs.
pub(super) enum StepCalls {
    /// Every call of the last message of this handle to the conversation,
    /// read in place: the handle is dropped before the results are appended,
    /// so appending copies nothing.
    Last(History),
    /// These calls, each with its index among the turn's calls.
    Listed(Vec<(usize, ToolCall)>),
}

impl StepCalls {
    /// How many calls.
    fn len(&self) -> usize {
        match self {
            StepCalls::Last(history) => history.last().map_or(0, |m| m.tool_calls.len()),
            StepCalls::Listed(calls) => calls.len(),
        }
    }

    /// The call at `at` (below [`len`](Self::len)), with its index among
    /// the turn's calls.
    fn get(&self, at: usize) -> (usize, &ToolCall) {
        match self {
            StepCalls::Last(history) => {
                let calls = &history.last().expect("a step has calls").tool_calls;
                (at, &calls[at])
            }
            StepCalls::Listed(calls) => {
                let (index, call) = &calls[at];
                (*index, call)
            }
        }
    }

    /// The calls, each with its index among the turn's calls.
    fn iter(&self) -> impl Iterator<Item = (usize, &ToolCall)> {
        let (last, listed) = match self {
            StepCalls::Last(history) => (history.last().map(|m| m.tool_calls.iter()), None),
            StepCalls::Listed(calls) => (None, Some(calls.iter())),
        };
        let last = last.into_iter().flat_map(|calls| calls.enumerate());
        let listed = listed
            .into_iter()
            .flat_map(|calls| calls.map(|(index, call)| (*index, call)));
        last.chain(listed)
    }
}

/// What a step's outcomes add up to, besides the results for the model.
struct Collected<'c> {
    pending: Vec<PendingCall>,
    /// What `after_tool_batch` reads, kept only for hooks that read it: each
    /// result's message waits in `completed`, without its content, until
    /// they did ([`fill_results`]). A step of one call keeps its result
    /// inline.
    results: SmallVec<[ToolCallResult<'c>; 1]>,
    keep_results: bool,
}

impl<'c> Collected<'c> {
    /// Takes one call's outcome: its result goes to `completed`.
    fn add(&mut self, run: &mut Run, outcome: Outcome<'c>, completed: &mut Vec<(usize, Message)>) {
        match outcome {
            Outcome::Done {
                index,
                call,
                output,
                ran,
            } => {
                run.counters.tool_calls += u32::from(ran);
                if self.keep_results {
                    completed.push((index, Message::tool(call.id.as_str(), String::new())));
                    self.results.push(ToolCallResult { call, output });
                } else {
                    let content = result_text(&run.config.limits, output.content);
                    completed.push((index, Message::tool(call.id.as_str(), content)));
                }
            }
            Outcome::Deferred(call) => self.pending.push(call),
        }
    }
}

/// What the model reads of a result: its content, moved, unless it is cut.
fn result_text(limits: &ToolLimits, content: String) -> String {
    match limits.cap_result(&content) {
        Cow::Borrowed(_) => content,
        Cow::Owned(cut) => cut,
    }
}

/// Gives the messages that wait for them (the last of `completed`, in the
/// same order) the content of the kept `results`, moved.
fn fill_results(
    limits: &ToolLimits,
    results: SmallVec<[ToolCallResult<'_>; 1]>,
    completed: &mut [(usize, Message)],
) {
    let waiting = completed.len() - results.len();
    for ((_, message), result) in completed[waiting..].iter_mut().zip(results) {
        let text = result_text(limits, result.output.content);
        message.content = Some(MessageContent::Text(text));
    }
}

enum Outcome<'a> {
    /// The call has its result; `ran` tells whether the tool was called.
    Done {
        index: usize,
        /// The call, with any arguments a hook rewrote.
        call: Cow<'a, ToolCall>,
        output: ToolOutput,
        ran: bool,
    },
    Deferred(PendingCall),
}

impl Run {
    /// Runs `calls` (concurrently when the agent allows), appends their
    /// results in call order, then `after_tool_batch`. `completed` holds
    /// results of the same step from before a pause.
    pub(super) fn tool_step<'a>(
        &'a mut self,
        calls: StepCalls,
        decisions: &'a [ApprovalDecision],
        resumed: bool,
        completed: Vec<(usize, Message)>,
    ) -> BoxFuture<'a, Result<Step, AgentError>> {
        Box::pin(self.run_step(calls, decisions, resumed, completed))
    }

    async fn run_step(
        &mut self,
        source: StepCalls,
        decisions: &[ApprovalDecision],
        resumed: bool,
        mut completed: Vec<(usize, Message)>,
    ) -> Result<Step, AgentError> {
        let keep_results = self.hooks.as_ref().is_some_and(|h| h.reads_tool_batch());
        if completed.capacity() == 0 {
            // Room for this step's results, not the four a first push makes.
            completed.reserve_exact(source.len());
        }
        // The step's collection ends in this block: the results borrow the
        // calls, and the calls are dropped below before the conversation
        // grows in place.
        let Collected {
            pending, results, ..
        } = {
            let mut step = Collected {
                pending: Vec::new(),
                // What `after_tool_batch` reads: kept only for hooks that read
                // it, in room made for this step's calls at once.
                results: if keep_results {
                    SmallVec::with_capacity(source.len())
                } else {
                    SmallVec::new()
                },
                keep_results,
            };
            if self.config.parallel_tool_calls && source.len() > 1 {
                // Boxed: a `Vec` of borrowing `async fn` futures trips rustc's
                // `Send` inference (rust-lang/rust#102211).
                let mut futures: Vec<BoxFuture<'_, Result<Outcome<'_>, AgentError>>> =
                    Vec::with_capacity(source.len());
                for (index, call) in source.iter() {
                    let decision = find_decision(decisions, &call.id);
                    futures.push(self.one_call(index, call, decision, resumed));
                }
                for outcome in try_join_all(futures).await? {
                    step.add(self, outcome, &mut completed);
                }
            } else {
                // By position: an iterator over the calls would be kept
                // across every call's await.
                for at in 0..source.len() {
                    let (index, call) = source.get(at);
                    let decision = find_decision(decisions, &call.id);
                    let outcome = self
                        .decide_and_invoke(index, call, decision, resumed)
                        .await?;
                    step.add(self, outcome, &mut completed);
                }
            }
            step
        };

        if !pending.is_empty() {
            fill_results(&self.config.limits, results, &mut completed);
            completed.sort_by_key(|(index, _)| *index);
            let ctx = &self.ctx;
            ctx.emit(|| AgentEvent::RunPaused {
                run_id: ctx.run_id().clone(),
                pending: pending.iter().map(|p| p.call.id.clone()).collect(),
            });
            if let Some(hooks) = &self.hooks {
                let notification = Notification::Paused {
                    pending: pending.iter().map(|p| p.call.clone()).collect(),
                };
                hooks
                    .on_notification(ctx, &notification)
                    .await
                    .map_err(classify)?;
            }
            return Ok(Step::Paused(Box::new(self.checkpoint(completed, pending))));
        }

        // The hooks read the results where they are; then their content
        // moves to the messages.
        if let Some(hooks) = &self.hooks {
            hooks
                .after_tool_batch(&self.ctx, &results)
                .await
                .map_err(classify)?;
        }
        fill_results(&self.config.limits, results, &mut completed);
        completed.sort_by_key(|(index, _)| *index);
        // The conversation is this run's alone again: the results are
        // appended in place.
        drop(source);
        self.messages.extend(completed.into_iter().map(|(_, m)| m));
        Ok(Step::Done)
    }

    fn one_call<'s, 'c: 's>(
        &'s self,
        index: usize,
        call: &'c ToolCall,
        decision: Option<&'c ApprovalDecision>,
        resumed: bool,
    ) -> BoxFuture<'s, Result<Outcome<'c>, AgentError>> {
        Box::pin(self.decide_and_invoke(index, call, decision, resumed))
    }

    async fn decide_and_invoke<'c>(
        &self,
        index: usize,
        call: &'c ToolCall,
        decision: Option<&'c ApprovalDecision>,
        resumed: bool,
    ) -> Result<Outcome<'c>, AgentError> {
        let ctx = &self.ctx;
        let mut call = Cow::Borrowed(call);
        if let Some(refusal) = self
            .config
            .limits
            .check_arguments(&call.name, &call.arguments)
        {
            self.log_decision(&call, "deny", "agent");
            return Ok(Outcome::Done {
                index,
                call,
                output: ToolOutput::error(refusal),
                ran: false,
            });
        }
        // Only the decision is kept past this point: the run's future
        // holds no room for the rest of the verdict while the tool runs.
        let verdict = match &self.hooks {
            Some(hooks) => {
                let verdict = hooks
                    .before_tool(ctx, &call, resumed)
                    .await
                    .map_err(classify)?;
                self.take_verdict(&mut call, verdict)
            }
            None => ToolDecision::Continue,
        };
        let flags = if self.config.flagged {
            let flags = self.config.flags.get(&call.name);
            flags.copied().unwrap_or_default()
        } else {
            ToolFlags::default()
        };
        let done = move |call: Cow<'c, ToolCall>, output: ToolOutput| Outcome::Done {
            index,
            call,
            output,
            ran: false,
        };
        let approval = match (verdict, decision) {
            (ToolDecision::Deny { reason }, _) => {
                return Ok(done(
                    call,
                    ToolOutput::error(format!("The call was denied: {reason}")),
                ));
            }
            (_, Some(decision)) if resumed => self.apply(&call, decision, "resume")?,
            (ToolDecision::Allow, _) => Approval::NotAsked,
            (ToolDecision::Defer, _) if self.standing(&call) => Approval::Approved,
            (ToolDecision::Defer, _) => {
                return Ok(Outcome::Deferred(PendingCall {
                    index,
                    arguments_hash: arguments_hash(&call.arguments),
                    call: call.into_owned(),
                }));
            }
            (ToolDecision::Ask | ToolDecision::AskUnlessAllowed, _) => self.ask(&call).await?,
            (ToolDecision::Continue, _) if flags.requires_approval => self.ask(&call).await?,
            (ToolDecision::Continue, _) => Approval::NotAsked,
        };
        let approved = match approval {
            Approval::Declined(reason) => {
                return Ok(done(
                    call,
                    ToolOutput::error(format!("The call was declined: {reason}")),
                ));
            }
            Approval::Approved => true,
            Approval::NotAsked => false,
        };
        let output = self.invoke(&call, approved, flags).await?;
        Ok(Outcome::Done {
            index,
            call,
            output,
            ran: true,
        })
    }

    /// Applies a `before_tool` verdict's rewritten arguments to `call` and
    /// logs its decision, which it returns.
    fn take_verdict(&self, call: &mut Cow<'_, ToolCall>, verdict: ToolVerdict) -> ToolDecision {
        if let Some(arguments) = &verdict.updated_arguments {
            call.to_mut().arguments = arguments.to_string();
        }
        if verdict.decision != ToolDecision::Continue {
            self.log_decision(
                call,
                verdict.decision.as_str(),
                verdict.decided_by.as_deref().unwrap_or("hook"),
            );
        }
        verdict.decision
    }

    /// Sends the call down the tool stack, bracketed by its events.
    async fn invoke(
        &self,
        call: &ToolCall,
        approved: bool,
        flags: ToolFlags,
    ) -> Result<ToolOutput, AgentError> {
        let observer = ToolCallObserver::open(&self.ctx, &self.config.name, call);
        match self.dispatch(call, approved, flags, observer.span()).await {
            Ok((output, panic)) => {
                observer.completed(&output, panic);
                Ok(output)
            }
            Err(err) => {
                observer.failed(&err);
                Err(err)
            }
        }
    }

    /// Sends the call down the tool stack; a failure the model should read
    /// becomes an error result. A panic becomes one too, and its message
    /// comes back beside it for the event and the trace.
    async fn dispatch(
        &self,
        call: &ToolCall,
        approved: bool,
        flags: ToolFlags,
        span: &tracing::Span,
    ) -> Result<(ToolOutput, Option<String>), AgentError> {
        let ctx = &self.ctx;
        // Whether this call may stream (decides whether a delta hook needs
        // a sink for it): asked of the tool only when one of the agent's may.
        let streams = self.config.tools_stream
            && self
                .config
                .router
                .as_ref()
                .is_none_or(|router| router.tool_may_stream(&call.name));
        let tools = (&self.config.tools, self.config.router.as_ref());
        let result = match &self.hooks {
            // Through the hooks that wrap the call: built, walked and called
            // at its first poll, in one future.
            Some(hooks) if !hooks.bare_tool_call(streams) => {
                let flags = (approved, flags.idempotent, streams);
                HookedToolCall::new(&**hooks, Guard::new(ctx), call, flags, tools, span).await
            }
            // Without hooks around the call (none, or only `before_tool`
            // and `after_tool`), it goes straight to the tool stack, or to
            // the router when no tool layer wraps it, which routes in
            // place: nothing boxed or cloned on the way.
            _ => {
                BareToolCall::new(
                    Guard::new(ctx),
                    call,
                    (approved, flags.idempotent),
                    tools.1,
                    tools.0,
                    span,
                )
                .await
            }
        };
        let output = result.and_then(|answer| match answer {
            Ok(Ok(output)) => Ok(output),
            Ok(Err(err)) => {
                let tool = format!("tool:{}", call.name);
                let err = attribute_tripwire(classify(err), &tool, "call_tool");
                tool_failure(ctx, &call.name, &call.id, err)
            }
            // Caught here (no hook caught it below): the same rule as a
            // panic a wrap hook's `next` caught.
            Err(panic) => {
                let panic = ToolPanicked::new(&call.name, &*panic);
                tool_failure(ctx, &call.name, &call.id, AgentError::Other(panic.into()))
            }
        });
        // Noted by `tool_failure` wherever the panic was caught, and taken
        // whatever became of the call; the event reports it only for a
        // result that stands for it (a wrap hook may have called the tool
        // again, or answered for it).
        let noted = ctx.take_tool_panic(&call.id);
        let mut output = output?;
        let panicked = noted.filter(|_| output.is_error);
        if ctx.stop_requested().is_some() {
            ctx.attribute_stop(&format!("tool:{}", call.name));
        }
        if let Some(hooks) = &self.hooks {
            hooks
                .after_tool(ctx, call, &mut output)
                .await
                .map_err(classify)?;
        }
        Ok((output, panicked))
    }

    /// A call asks for approval: the hooks decide, then the approver; if
    /// nobody does, it is declined.
    async fn ask(&self, call: &ToolCall) -> Result<Approval, AgentError> {
        let ctx = &self.ctx;
        if self.standing(call) {
            return Ok(Approval::Approved);
        }
        if let Some(hooks) = &self.hooks {
            if let Some(verdict) = hooks.decide_approval(ctx, call).await.map_err(classify)? {
                let by = verdict.decided_by.as_deref().unwrap_or("hook");
                return self.apply(call, &verdict.decision, by);
            }
            let notification = Notification::ApprovalRequested { call: call.clone() };
            hooks
                .on_notification(ctx, &notification)
                .await
                .map_err(classify)?;
        }
        if let Some(approver) = &self.config.approver {
            let decision = ctx.race(approver(call.clone(), ctx.clone())).await?;
            if let Some(decision) = decision {
                return self.apply(call, &decision, "approver");
            }
        }
        self.log_decision(call, "declined", "nobody");
        Ok(Approval::Declined("nobody approved it".into()))
    }

    /// Checks that `decision` is for this call and these arguments.
    fn apply(
        &self,
        call: &ToolCall,
        decision: &ApprovalDecision,
        by: &str,
    ) -> Result<Approval, AgentError> {
        if decision.call_id != call.id {
            return Err(AgentError::Approval(format!(
                "a decision for call `{}` was given for call `{}`",
                decision.call_id, call.id
            )));
        }
        if let Some(hash) = &decision.arguments_hash {
            if *hash != arguments_hash(&call.arguments) {
                return Err(AgentError::Approval(format!(
                    "the decision for call `{}` ({}) was made for other arguments than {}",
                    call.id, call.name, call.arguments
                )));
            }
        }
        if decision.approved {
            self.log_decision(call, "approved", by);
            if let Some(standing) = StickyApproval::from_decision(call, decision) {
                StickyApprovals::of(&self.ctx).remember(standing);
            }
            Ok(Approval::Approved)
        } else {
            self.log_decision(call, "declined", by);
            Ok(Approval::Declined(
                decision
                    .reason
                    .clone()
                    .unwrap_or_else(|| "no reason given".into()),
            ))
        }
    }

    /// Whether a standing approval ("always allow") covers the call; logged
    /// as approved by `sticky` when one does.
    fn standing(&self, call: &ToolCall) -> bool {
        let covered = StickyApprovals::find(&self.ctx).is_some_and(|s| s.covers(call));
        if covered {
            self.log_decision(call, "approved", "sticky");
        }
        covered
    }

    fn log_decision(&self, call: &ToolCall, decision: &'static str, by: &str) {
        let ctx = &self.ctx;
        tracing::debug!(call_id = %call.id, tool = %call.name, decision, decided_by = by, "tool call decision");
        ctx.emit(|| AgentEvent::ToolDecision {
            run_id: ctx.run_id().clone(),
            call_id: call.id.clone(),
            decision,
            decided_by: by.to_owned(),
        });
    }
}

fn find_decision<'d>(
    decisions: &'d [ApprovalDecision],
    call_id: &str,
) -> Option<&'d ApprovalDecision> {
    decisions.iter().find(|d| d.call_id == call_id)
}

enum Approval {
    Approved,
    Declined(String),
    NotAsked,
}
