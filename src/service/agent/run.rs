//! The run loop: model → tool calls → model … until a final answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use futures::future::{BoxFuture, Either};
use pin_project_lite::pin_project;
use tower::Service;

use super::handoff::find_agent;
use super::hooked_turn::HookedCall;
use super::inbox::Inbox;
use super::observe::{InSpan, ModelCallObserver, RunObserver};
use super::state::{classify, Run};
use super::tools::{Step, StepCalls};
use super::Config;
use crate::context::{Guard, RunContext};
use crate::error::AgentError;
use crate::hooks::{installed, HookPort, RunOutcome, RunStart, StickyApprovals};
use crate::request::{BoxModel, DeltaSink, ModelCall, ModelCallParts, RunInput, RunRequest};
use crate::types::{
    AgentRun, Checkpoint, History, Message, ModelDelta, ModelRequest, ModelResponse, Role,
    RunStatus, StopReason,
};

/// The run of `request`, bracketed by its observer and, when no lifecycle
/// layer does it, by the closing hooks.
///
/// What only the run's start needs (the request's input and history, the
/// start hooks, a resumed step) is a future of its own, on the heap until
/// the first model call: a run waiting on its model holds only its state.
pub(super) fn run(
    config: Arc<Config>,
    request: RunRequest,
) -> impl Future<Output = Result<AgentRun, AgentError>> + Send + 'static {
    let ctx = request.context.clone();
    let start: BoxFuture<'static, Result<Started, AgentError>> =
        Box::pin(start(config.clone(), request));
    Observed {
        ctx,
        config,
        begun: false,
        observer: None,
        opened: None,
        stage: Stage::Running {
            fut: proceed(start),
        },
    }
}

pin_project! {
    /// The run, polled inside its observer's span; once it ends, the
    /// observer closes and, when no lifecycle layer brackets the run, the
    /// hooks that opened it close it. The observer opens at the first poll.
    struct Observed<F> {
        ctx: RunContext,
        config: Arc<Config>,
        begun: bool,
        observer: Option<RunObserver>,
        // The hooks that open the run close it, even if a handoff changed
        // those installed since.
        opened: Option<Arc<dyn HookPort>>,
        #[pin]
        stage: Stage<F>,
    }

    impl<F> PinnedDrop for Observed<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(observer) = this.observer.take() {
                observer.dropped(this.ctx, &this.config.name);
            }
        }
    }
}

/// Closes the run's observer if the run's poll panics, as the run fails
/// (`INTERNAL`), rather than later, when the caller drops the future.
struct OnUnwind<'a> {
    observer: &'a mut Option<RunObserver>,
    ctx: &'a RunContext,
    agent: &'a Arc<str>,
}

impl Drop for OnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(observer) = self.observer.take() {
                observer.dropped(self.ctx, self.agent);
            }
        }
    }
}

pin_project! {
    /// The run, then the hooks that close it: one in the room of the other.
    #[project = StageProj]
    enum Stage<F> {
        Running {
            #[pin]
            fut: F,
        },
        Closing {
            fut: BoxFuture<'static, Result<AgentRun, AgentError>>,
        },
    }
}

impl<F> Future for Observed<F>
where
    F: Future<Output = Result<AgentRun, AgentError>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        let fut = match this.stage.as_mut().project() {
            StageProj::Closing { fut } => return fut.as_mut().poll(cx),
            StageProj::Running { fut } => fut,
        };
        let ctx: &RunContext = this.ctx;
        let agent = &this.config.name;
        if !*this.begun {
            *this.begun = true;
            ctx.set_agent_name(agent);
            *this.observer = Some(RunObserver::open(ctx, agent));
            // A run a lifecycle layer brackets (marked before it starts) is
            // closed by the layer: its hooks are not kept for closing.
            if !ctx.is_bracketed() {
                *this.opened = installed(ctx);
            }
        }
        let result = {
            let unwinding = OnUnwind {
                observer: &mut *this.observer,
                ctx,
                agent,
            };
            let observer = unwinding
                .observer
                .as_ref()
                .expect("Observed polled after it completed");
            let _entered = observer.span().enter();
            ready!(fut.poll(cx))
        };
        if let Some(observer) = this.observer.take() {
            observer.close(ctx, agent, &result);
        }
        // A lifecycle layer that brackets the run closes it itself, with the
        // result its caller gets; otherwise (a nested run that inherited its
        // parent's hooks) the loop does. Errors of these hooks cannot change
        // the result: the stack logs them.
        match this.opened.take() {
            Some(hooks) if !ctx.is_bracketed() => {
                let ctx = ctx.clone();
                let mut closing: BoxFuture<'static, _> = Box::pin(async move {
                    if let Err(err) = &result {
                        let _ = hooks.on_error(&ctx, err).await;
                    }
                    let _ = hooks.after_agent(&ctx, RunOutcome::of(&result)).await;
                    result
                });
                let polled = closing.as_mut().poll(cx);
                if polled.is_pending() {
                    // The run's future, done, gives its room to the hooks'.
                    this.stage.set(Stage::Closing { fut: closing });
                }
                polled
            }
            _ => Poll::Ready(result),
        }
    }
}

/// The run's start, then its turns.
async fn proceed(
    start: BoxFuture<'static, Result<Started, AgentError>>,
) -> Result<AgentRun, AgentError> {
    let mut run = match start.await? {
        Started::Running(run) => *run,
        Started::Ended(run) => return Ok(*run),
    };
    run.turns().await
}

/// How a run's start ended.
enum Started {
    /// The run goes on to its turns, its state moved into the run's
    /// future. Boxed meanwhile: the start's future stays under the size
    /// past which the allocator tidies its free lists on every run (about
    /// 1,000 bytes).
    Running(Box<Run>),
    /// A resumed run paused again in the step it resumed.
    Ended(Box<AgentRun>),
}

async fn start(config: Arc<Config>, request: RunRequest) -> Result<Started, AgentError> {
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
        config.flags.install(&ctx);
    }
    let has_history = !history.is_empty();
    let resumed = matches!(input, RunInput::Resume { .. });
    // The request's history is the conversation from the start: a new run
    // appends to it, a resumed one replaces it with the checkpoint's.
    let mut run = Run::new(config, ctx, hooks, stream, extensions, history);
    run.inbox = inbox;
    // `before_agent` comes first, before the input guard.
    let start_context = run.start_hooks(resumed, has_history).await?;
    let resume = match input {
        RunInput::Message(input) => {
            run.begin(input).await?;
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
        let calls = StepCalls::Listed(calls);
        if let Step::Paused(checkpoint) = run.tool_step(calls, &decisions, true, completed).await? {
            let paused = run.snapshot(RunStatus::Paused(checkpoint), String::new(), None);
            return Ok(Started::Ended(Box::new(paused)));
        }
        run.finish_handoff()?;
    }
    Ok(Started::Running(Box::new(run)))
}

impl Run {
    /// A new run: system prompt, history, the input guard, the input.
    ///
    /// A history that already starts with the system prompt (the transcript
    /// of an earlier run of this agent) is used as it is, so a long thread
    /// costs nothing to continue.
    async fn begin(&mut self, mut input: Message) -> Result<(), AgentError> {
        if self.messages.is_empty() {
            if let Some(provided) = self.ctx.take_provided_history() {
                self.messages = provided;
            }
        }
        let messages = &mut self.messages;
        if let Some(instructions) = &self.config.instructions {
            let starts_with_prompt = messages
                .first()
                .is_some_and(|m| m.role == Role::System && m.text() == instructions.as_str());
            if messages.is_empty() {
                // The agent's prompt, shared by all its runs, then room for
                // the input: a run waiting on its first answer holds no room
                // for it.
                *messages = match &self.config.prompt {
                    Some(prompt) => History::continuing(prompt, Vec::with_capacity(1)),
                    None => History::from(vec![Message::system(instructions.as_str())]),
                };
            } else if !starts_with_prompt {
                messages
                    .to_mut()
                    .insert(0, Message::system(instructions.as_str()));
            }
        }
        let added = match &self.hooks {
            Some(hooks) => hooks
                .before_run(&self.ctx, &mut input, &self.messages)
                .await
                .map_err(classify)?,
            None => Vec::new(),
        };
        self.messages.push(input);
        self.messages.extend(added.into_iter().map(Message::system));
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
    async fn turns(&mut self) -> Result<AgentRun, AgentError> {
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
            if self.inbox.is_some() {
                // Boxed: a run without a handle does not carry its state.
                Box::pin(self.take_queued()).await?;
            }
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

            let answered: Answered = 'turn: {
                if !self.reads_answer() {
                    break 'turn self.model_turn(turn).await;
                }
                // The call as a bare turn's, its answer read by `after_model`
                // before it joins the conversation: nothing boxed but the
                // answer while the hook reads it. Built here, from the run's
                // fields, so that the observer outlives the borrow of the
                // conversation.
                let config = &*self.config;
                let model = self.model.get_or_insert_with(|| config.model.clone());
                let parts = (&self.stream, &self.extensions);
                let bare = BareTurn::new(config, &self.ctx, &mut self.messages, model, parts, turn);
                let (mut answer, observer) = match bare.answer().await {
                    Ok(answered) => answered,
                    Err(err) => break 'turn Err(err),
                };
                let hooks = self.hooks.as_deref().expect("an answer is read by hooks");
                let read = hooks.after_model(&self.ctx, &mut answer).await;
                if let Err(err) = read.map_err(classify) {
                    observer.failed(&err);
                    break 'turn Err(Box::new(err));
                }
                let turn = observer.turn();
                observer.completed(&answer);
                Ok(append_answer(&mut self.messages, turn, answer.message))
            };
            self.counters.model_calls += 1;
            let has_calls = answered.map_err(|err| *err)?;

            if !has_calls {
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
            let (calls, answered) = if self.config.handoffs.is_empty() {
                // The calls are read where they are, in the conversation.
                (StepCalls::Last(self.messages.clone()), Vec::new())
            } else {
                let calls = self
                    .messages
                    .last()
                    .map(|m| m.tool_calls.iter().cloned().enumerate().collect())
                    .unwrap_or_default();
                // Boxed: an agent without handoffs does not carry its state.
                let (calls, answered) = Box::pin(self.answer_handoffs(calls)).await?;
                (StepCalls::Listed(calls), answered)
            };
            if matches!(&calls, StepCalls::Listed(calls) if calls.is_empty()) {
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

    /// One model turn: the call, and its answer appended to the
    /// conversation.
    ///
    /// Without hooks, or with hooks that have nothing around the call, the
    /// call goes to the run's own clone of the model stack (made once per
    /// run), in a [`BareTurn`]; otherwise through the hooks, in a future of
    /// its own on the heap.
    fn model_turn(&mut self, turn: u32) -> Either<BareTurn<'_, '_>, BoxFuture<'_, Answered>> {
        if let Some(hooks) = &self.hooks {
            // Nothing of the hooks around this call (a stack whose
            // middleware only see the turn before it): the bare turn.
            if !hooks.bare_model_call(self.stream.is_some()) {
                return Either::Right(Box::pin(self.hooked_turn(turn)));
            }
        }
        Either::Left(self.bare_turn(turn))
    }

    /// The current turn's call, as a run without hooks makes it.
    fn bare_turn(&mut self, turn: u32) -> BareTurn<'_, '_> {
        let config = &*self.config;
        let model = self.model.get_or_insert_with(|| config.model.clone());
        BareTurn::new(
            config,
            &self.ctx,
            &mut self.messages,
            model,
            (&self.stream, &self.extensions),
            turn,
        )
    }

    /// Whether the next model call has nothing of the hooks around it but an
    /// `after_model` that reads its answer.
    fn reads_answer(&self) -> bool {
        self.hooks.as_ref().is_some_and(|hooks| {
            hooks.reads_model_answer() && hooks.bare_model_call(self.stream.is_some())
        })
    }

    /// A model turn through the hooks: one call through them and the model
    /// stack, its answer appended to the conversation. The answer stays in
    /// this frame from the race to the conversation, not handed up through
    /// results of its own.
    async fn hooked_turn(&mut self, turn: u32) -> Answered {
        let config = &self.config;
        let ctx = &self.ctx;
        let Some(hooks) = &self.hooks else {
            unreachable!("a hooked call is made only with hooks");
        };
        let hold = self.stream.is_some() && hooks.holds_stream();
        let observer = ModelCallObserver::open(ctx, &config.name, &config.model_name, turn);
        let span = observer.span();
        let call = model_call(
            config,
            ctx,
            &self.messages,
            &self.stream,
            hold,
            &self.extensions,
        );
        // The run's own clone of the model stack, as a bare turn's: back in
        // its place once the call is done, unless a wrap hook kept it.
        let model = self.model.take().unwrap_or_else(|| config.model.clone());
        let mut call = HookedCall::new(&**hooks, ctx, call, model, &config.model_name);
        let answer = ctx.race(InSpan::new(span, &mut call)).await;
        if let Some(model) = call.take_model() {
            self.model = Some(model);
        }
        let mut response = match answer {
            Ok(Ok(response)) => response,
            Ok(Err(err)) => {
                let err = classify(err);
                observer.failed(&err);
                return Err(Box::new(err));
            }
            Err(err) => {
                observer.failed(&err);
                return Err(Box::new(err));
            }
        };
        if !response.usage_recorded {
            ctx.record_usage_of(&response.model, response.usage);
            response.usage_recorded = true;
        }
        observer.record(&response);
        if let Err(err) = hooks
            .after_model(ctx, &mut response)
            .await
            .map_err(classify)
        {
            observer.failed(&err);
            return Err(Box::new(err));
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
        Ok(append_answer(&mut self.messages, turn, response.message))
    }
}

/// How a model turn ended: whether the answer, now in the conversation,
/// calls tools; or why it failed (boxed, so that a run waiting on its model
/// makes no room for an error).
type Answered = Result<bool, Box<AgentError>>;

/// Appends the model's answer to the conversation as the assistant's, with
/// the calls the model left without an id numbered; whether it calls tools.
fn append_answer(messages: &mut History, turn: u32, mut message: Message) -> bool {
    message.role = Role::Assistant;
    for (i, call) in message.tool_calls.iter_mut().enumerate() {
        if call.id.is_empty() {
            call.id = format!("call_{turn}_{}", i + 1);
        }
    }
    let has_calls = !message.tool_calls.is_empty();
    messages.push(message);
    has_calls
}

/// A model turn without hooks: waits for the run's model stack to be
/// ready, builds the request only then, races the answer against the run's
/// cancellation and deadline, and appends it to the conversation, all in
/// its own `poll`. So a run waiting on its model holds the stack's future,
/// the observer and a few references; neither the request nor what the
/// answer becomes. The conversation and the model stack are borrowed for
/// `'m` alone, so that the observer [`answer`](Self::answer) hands back
/// may outlive that borrow.
pub(super) struct BareTurn<'a, 'm> {
    guard: Guard<'a>,
    model: &'m mut BoxModel,
    config: &'a Config,
    messages: &'m mut History,
    stream: &'a Option<DeltaSink>,
    extensions: &'a http::Extensions,
    /// Taken when the turn ends; it knows the turn.
    observer: Option<ModelCallObserver<'a>>,
    called: Option<<BoxModel as Service<ModelCall>>::Future>,
}

impl<'a, 'm> BareTurn<'a, 'm> {
    /// Turn `turn` of the conversation `messages`, to `model`; the call
    /// carries the run's stream sink and extensions (`parts`).
    fn new(
        config: &'a Config,
        ctx: &'a RunContext,
        messages: &'m mut History,
        model: &'m mut BoxModel,
        parts: (&'a Option<DeltaSink>, &'a http::Extensions),
        turn: u32,
    ) -> Self {
        let observer = ModelCallObserver::open(ctx, &config.name, &config.model_name, turn);
        Self {
            guard: Guard::new(ctx),
            model,
            config,
            messages,
            stream: parts.0,
            extensions: parts.1,
            observer: Some(observer),
            called: None,
        }
    }

    /// The turn's answer, its usage recorded and the span told, with the
    /// call's observer still open, instead of appended: for a hook to read
    /// first.
    fn answer(self) -> TurnAnswer<'a, 'm> {
        TurnAnswer(self)
    }

    /// Polls the model for its answer: its usage recorded, its span told,
    /// a failure told to the observer; then `finish` takes the answer, the
    /// call's observer and the conversation.
    // Inlined into each poll, with its `finish`: the answer is moved once,
    // not out through a return.
    #[inline(always)]
    fn poll_with<R>(
        &mut self,
        cx: &mut Context<'_>,
        finish: impl FnOnce(ModelResponse, ModelCallObserver<'a>, &mut History) -> R,
    ) -> Poll<Result<R, Box<AgentError>>> {
        let observer = self
            .observer
            .as_ref()
            .expect("BareTurn polled after it completed");
        let (model, called) = (&mut *self.model, &mut self.called);
        let (config, ctx, messages) = (self.config, self.guard.ctx(), &*self.messages);
        let (stream, extensions) = (self.stream, self.extensions);
        let answer = ready!(self.guard.poll(cx, |cx| {
            let _entered = observer.span().enter();
            if called.is_none() {
                if let Err(err) = ready!(model.poll_ready(cx)) {
                    return Poll::Ready(Err(err));
                }
                let call = model_call(config, ctx, messages, stream, false, extensions);
                *called = Some(model.call(call));
            }
            let called = called.as_mut().expect("called just above");
            called.as_mut().poll(cx)
        }));
        // The call's future holds the conversation: gone, the answer may
        // be appended in place.
        self.called = None;
        let observer = self.observer.take().expect("checked above");
        let mut response = match answer {
            Ok(Ok(response)) => response,
            Ok(Err(err)) => {
                let err = classify(err);
                observer.failed(&err);
                return Poll::Ready(Err(Box::new(err)));
            }
            Err(err) => {
                observer.failed(&err);
                return Poll::Ready(Err(Box::new(err)));
            }
        };
        if !response.usage_recorded {
            ctx.record_usage_of(&response.model, response.usage);
            response.usage_recorded = true;
        }
        observer.record(&response);
        Poll::Ready(Ok(finish(response, observer, self.messages)))
    }
}

impl Future for BareTurn<'_, '_> {
    type Output = Answered;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answered> {
        self.poll_with(cx, |response, observer, messages| {
            let turn = observer.turn();
            observer.completed(&response);
            append_answer(messages, turn, response.message)
        })
    }
}

/// [`BareTurn::answer`]: the turn's answer, not appended.
pub(super) struct TurnAnswer<'a, 'm>(BareTurn<'a, 'm>);

impl<'a> Future for TurnAnswer<'a, '_> {
    /// The answer, boxed for the hook to read while the run waits on it,
    /// and the call's open observer.
    type Output = Result<(Box<ModelResponse>, ModelCallObserver<'a>), Box<AgentError>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0
            .poll_with(cx, |response, observer, _| (Box::new(response), observer))
    }
}

fn model_call(
    config: &Config,
    ctx: &RunContext,
    messages: &History,
    stream: &Option<DeltaSink>,
    hold: bool,
    extensions: &http::Extensions,
) -> ModelCall {
    ModelCall::from_parts(ModelCallParts {
        request: ModelRequest {
            model: config.model_name.clone(),
            messages: messages.clone(),
            tools: config.specs.clone(),
            settings: config.settings.clone(),
        },
        // A held stream goes to the caller once the hooks passed the answer.
        stream: if hold {
            Some(DeltaSink::provisional(|_| {}))
        } else {
            stream.clone()
        },
        context: ctx.clone(),
        extensions: extensions.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Agent, ScriptedModel, ScriptedTurn};

    /// Every suspended run holds its future, its state inside: 2,936 bytes
    /// before the run's start moved to a future of its own and the model
    /// call stopped holding its request, its hooks' answer and a deadline
    /// timer inline; 1,072 (with the state in a box of its own) before the
    /// run's result, a model turn's answer and its error stopped being kept
    /// beside the futures that make them; 576 before the observers kept
    /// their tracing state on the heap and the run's observed future owned
    /// its context instead of an async wrapper keeping it.
    #[test]
    fn a_run_future_stays_small() {
        let agent = Agent::builder("small")
            .instructions("Answer in one word.")
            .model(ScriptedModel::from_fn(|_| ScriptedTurn::text("ok")))
            .build()
            .unwrap();
        let run = run(agent.config.clone(), RunRequest::new("hi"));
        let bytes = std::mem::size_of_val(&run);
        assert!(bytes <= 400, "the run future takes {bytes} bytes");
    }
}
