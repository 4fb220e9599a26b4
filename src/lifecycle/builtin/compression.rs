//! [`ContextCompressionMiddleware`]: condenses older messages into a summary
//! once the conversation grows past a threshold, for the rest of the thread
//! or for one request.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::json;

use super::summarizer::{ConcatSummarizer, Summarizer};
use super::view::{lock, run_slot, View};
use crate::context::RunContext;
use crate::error::{AgentError, BoxError};
use crate::hooks::Compaction;
use crate::lifecycle::{Hook, Middleware, ModelNext, Wrapped};
use crate::request::ModelCall;
use crate::tokens::{Conversation, ModelInfoTable, TokenCounters, TokenTally};
use crate::types::{History, Message, Role};

const SUMMARY_HEADER: &str = "Summary of the earlier conversation:";

/// Whether `message` is a summary this middleware wrote.
fn is_summary(message: &Message) -> bool {
    message.role == Role::System && message.text().starts_with(SUMMARY_HEADER)
}

/// When [`ContextCompressionMiddleware`] compacts.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum CompactionTrigger {
    /// Past this many bytes of text ([`History::text_len`]).
    TextLen(u64),
    /// Past this many tokens, counted by the model's counter.
    Tokens(usize),
    /// Past this many messages.
    Messages(usize),
    /// Past this fraction of the model's context window, from the
    /// middleware's [`ModelInfoTable`].
    ContextFraction(f64),
}

/// What a compaction changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CompactionScope {
    /// The run's conversation, in `before_model`: the run (and its
    /// transcript) goes on from the compacted one. The default.
    #[default]
    Thread,
    /// Each model request only, in `wrap_model`: the run keeps every
    /// message, and the summary is reused from turn to turn until the
    /// request passes the threshold again.
    Turn,
}

impl CompactionScope {
    fn as_str(self) -> &'static str {
        match self {
            CompactionScope::Thread => "thread",
            CompactionScope::Turn => "turn",
        }
    }
}

/// When [`ContextCompressionMiddleware`] compacts, what it keeps, and what
/// it changes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SummarizationPolicy {
    /// When it compacts.
    pub trigger: CompactionTrigger,
    /// How many of the latest messages stay verbatim (widened back so that
    /// no tool call is split from its result).
    pub keep_last: usize,
    /// The thread, or one request.
    pub scope: CompactionScope,
}

impl SummarizationPolicy {
    /// Compacts past `trigger_text_len` bytes of text, keeping the last 6
    /// messages, for the thread.
    pub fn new(trigger_text_len: u64) -> Self {
        Self::when(CompactionTrigger::TextLen(trigger_text_len))
    }

    /// Compacts under `trigger`, keeping the last 6 messages, for the thread.
    pub fn when(trigger: CompactionTrigger) -> Self {
        Self {
            trigger,
            keep_last: 6,
            scope: CompactionScope::Thread,
        }
    }

    /// Compacts past `tokens` tokens.
    pub fn tokens(tokens: usize) -> Self {
        Self::when(CompactionTrigger::Tokens(tokens))
    }

    /// Compacts past `messages` messages.
    pub fn messages(messages: usize) -> Self {
        Self::when(CompactionTrigger::Messages(messages))
    }

    /// Compacts past `fraction` of the model's context window.
    pub fn context_fraction(fraction: f64) -> Self {
        Self::when(CompactionTrigger::ContextFraction(fraction))
    }

    /// How many of the latest messages stay verbatim.
    pub fn keep_last(mut self, keep_last: usize) -> Self {
        self.keep_last = keep_last;
        self
    }

    /// What a compaction changes.
    pub fn scope(mut self, scope: CompactionScope) -> Self {
        self.scope = scope;
        self
    }
}

/// One compaction that ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryRecord {
    /// The run.
    pub run_id: Arc<str>,
    /// The turn it ran before.
    pub iteration: u32,
    /// Messages before.
    pub messages_before: usize,
    /// Messages after.
    pub messages_after: usize,
    /// Tokens before, counted by the model's counter.
    pub tokens_before: usize,
    /// Tokens after.
    pub tokens_after: usize,
    /// The thread, or one request.
    pub scope: CompactionScope,
    /// The summary that replaced the older messages.
    pub summary: String,
}

/// What a turn-scoped compaction keeps per run: the compacted request it
/// made, extended while the run only appends.
#[derive(Default)]
struct TurnState {
    view: View,
}

/// What the middleware remembers of a run: the model its requests go to.
#[derive(Default)]
struct Seen {
    model: Option<Arc<str>>,
}

/// Condenses older messages into a summary once the conversation passes
/// its [`SummarizationPolicy`]'s trigger.
///
/// Below the threshold it costs one incremental measure (a tally of the
/// messages the turn added). Above it, it asks the run's
/// `before_compaction` hooks (any `false` skips it), condenses the messages
/// between the leading system messages and the recent window with its
/// [`Summarizer`] into one system message, keeps system messages and the
/// recent window verbatim, never splits a tool call from its result,
/// records a [`SummaryRecord`], logs a `compressed` custom event with the
/// messages and tokens before and after, and tells the `after_compaction`
/// hooks. An earlier summary is folded into the next one.
///
/// With [`CompactionScope::Thread`] (the default) the run goes on from the
/// compacted conversation; with [`CompactionScope::Turn`] only what the
/// model reads is compacted, and the summary is reused while the request
/// stays under the threshold.
///
/// A [`CompactionTrigger::ContextFraction`] needs the model's window: from
/// [`model`](Self::model), or else the model of the run's last request (so
/// a thread-scoped check starts from the second turn). A model the table
/// does not know fails the turn with `INVALID_CONFIG`.
///
/// # Clone
///
/// Clones share the summarizer and the records.
///
/// # Example
///
/// ```
/// use tower_agent::lifecycle::builtin::{
///     CompactionScope, ContextCompressionMiddleware, ModelSummarizer, SummarizationPolicy,
/// };
/// use tower_agent::lifecycle::MiddlewareStack;
/// use tower_agent::{Agent, ScriptedModel, ScriptedTurn};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::AgentError> {
/// let writer = ScriptedModel::new([ScriptedTurn::text("a summary")]);
/// // Compact at 80% of gpt-4o's window, keeping the last 10 messages.
/// let compaction = ContextCompressionMiddleware::new(
///     SummarizationPolicy::context_fraction(0.8).keep_last(10).scope(CompactionScope::Thread),
/// )
/// .model("gpt-4o")
/// .summarizer(ModelSummarizer::new(writer, "gpt-4o-mini"));
/// let agent = Agent::builder("a")
///     .model(ScriptedModel::new([ScriptedTurn::text("hi")]))
///     .model_name("gpt-4o")
///     .middleware(MiddlewareStack::new().push(compaction.clone()))
///     .build()?;
/// agent.run("hello").await?;
/// assert!(compaction.records().is_empty(), "far below the threshold");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ContextCompressionMiddleware {
    policy: SummarizationPolicy,
    summarizer: Arc<dyn Summarizer>,
    records: Arc<Mutex<Vec<SummaryRecord>>>,
    counters: TokenCounters,
    models: Arc<ModelInfoTable>,
    model: Option<Arc<str>>,
    id: Arc<()>,
}

impl ContextCompressionMiddleware {
    /// Compacts under `policy` with the [`ConcatSummarizer`], counting with
    /// OpenAI's encodings and the built-in [`ModelInfoTable`].
    pub fn new(policy: SummarizationPolicy) -> Self {
        Self {
            policy,
            summarizer: Arc::new(ConcatSummarizer::default()),
            records: Arc::default(),
            counters: TokenCounters::default(),
            models: Arc::new(ModelInfoTable::builtin()),
            model: None,
            id: Arc::new(()),
        }
    }

    /// Summarizes with `summarizer` instead.
    pub fn summarizer(mut self, summarizer: impl Summarizer) -> Self {
        self.summarizer = Arc::new(summarizer);
        self
    }

    /// Counts tokens with `counters`.
    pub fn counters(mut self, counters: TokenCounters) -> Self {
        self.counters = counters;
        self
    }

    /// Reads context windows from `models`.
    pub fn models(mut self, models: ModelInfoTable) -> Self {
        self.models = Arc::new(models);
        self
    }

    /// The model whose counter and window apply (default: the model of
    /// the run's requests, once one was seen).
    pub fn model(mut self, model: impl Into<Arc<str>>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// The compactions so far, oldest first.
    pub fn records(&self) -> Vec<SummaryRecord> {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn owner(&self) -> usize {
        Arc::as_ptr(&self.id) as usize
    }

    fn model_of(&self, ctx: &RunContext) -> Option<Arc<str>> {
        self.model
            .clone()
            .or_else(|| lock(&run_slot::<Seen>(ctx, self.owner())).model.clone())
    }

    fn tally(&self, ctx: &RunContext, model: Option<&str>) -> TokenTally {
        let conversation = match self.policy.scope {
            CompactionScope::Thread => Conversation::Thread,
            CompactionScope::Turn => Conversation::Request,
        };
        let counter = self.counters.for_model(model.unwrap_or(""));
        TokenTally::of_run(ctx, &counter, conversation)
    }

    /// Whether `messages` passed the trigger.
    fn over(&self, ctx: &RunContext, messages: &History) -> Result<bool, AgentError> {
        Ok(match self.policy.trigger {
            CompactionTrigger::TextLen(limit) => messages.text_len() > limit,
            CompactionTrigger::Messages(limit) => messages.len() > limit,
            CompactionTrigger::Tokens(limit) => {
                let model = self.model_of(ctx);
                self.tally(ctx, model.as_deref()).count(messages) > limit
            }
            CompactionTrigger::ContextFraction(fraction) => {
                let Some(model) = self.model_of(ctx) else {
                    return Ok(false);
                };
                let info = self.models.get(&model).ok_or_else(|| {
                    AgentError::Config(format!(
                        "context compression: no context window is known for model `{model}`"
                    ))
                })?;
                let limit = (info.context_window as f64 * fraction) as usize;
                self.tally(ctx, Some(&model)).count(messages) > limit
            }
        })
    }

    /// Where the older part starts and ends, if there is one worth
    /// compacting: after the leading system messages (an earlier summary is
    /// compacted again), up to a window start that no tool result after it
    /// reaches back across.
    fn plan(&self, messages: &History) -> Option<(usize, usize)> {
        let lead = messages
            .iter()
            .take_while(|m| m.role == Role::System && !is_summary(m))
            .count();
        let cut = super::view::tool_safe_cut(
            messages,
            messages.len().saturating_sub(self.policy.keep_last),
        );
        (cut > lead + 1).then_some((lead, cut))
    }

    /// Compacts `messages`: `None` when there is nothing to compact or a
    /// hook skipped it.
    async fn compact(
        &self,
        ctx: &RunContext,
        messages: &History,
    ) -> Result<Option<History>, BoxError> {
        let Some((lead, cut)) = self.plan(messages) else {
            return Ok(None);
        };
        if !crate::hooks::before_compaction(ctx, messages).await? {
            return Ok(None);
        }
        let (kept_system, older): (Vec<Message>, Vec<Message>) = messages
            .iter()
            .skip(lead)
            .take(cut - lead)
            .cloned()
            .partition(|m| m.role == Role::System && !is_summary(m));
        let summary = self.summarizer.summarize(ctx, &older).await?;
        let before = messages.len();
        let mut compacted = Vec::with_capacity(lead + kept_system.len() + 1 + before - cut);
        compacted.extend(messages.iter().take(lead).cloned());
        compacted.extend(kept_system);
        compacted.push(Message::system(format!("{SUMMARY_HEADER}\n{summary}")));
        compacted.extend(messages.iter().skip(cut).cloned());
        let compacted = History::from(compacted);
        let model = self.model_of(ctx);
        let tally = self.tally(ctx, model.as_deref());
        let tokens_before = tally.count(messages);
        let tokens_after = tally.count(&compacted);
        let record = SummaryRecord {
            run_id: ctx.run_id().clone(),
            iteration: ctx.iteration(),
            messages_before: before,
            messages_after: compacted.len(),
            tokens_before,
            tokens_after,
            scope: self.policy.scope,
            summary: summary.clone(),
        };
        ctx.log_event(
            "compressed",
            json!({
                "scope": self.policy.scope.as_str(),
                "messages_before": before,
                "messages_after": compacted.len(),
                "tokens_before": tokens_before,
                "tokens_after": tokens_after,
            }),
        );
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(record);
        let compaction = Compaction {
            by: Middleware::name(self).to_owned(),
            messages_before: before,
            messages_after: compacted.len(),
            summary: Some(summary),
        };
        crate::hooks::after_compaction(ctx, &compaction).await?;
        Ok(Some(compacted))
    }

    async fn compact_thread(
        &self,
        ctx: &RunContext,
        messages: &mut History,
    ) -> Result<(), BoxError> {
        if !self.over(ctx, messages)? {
            return Ok(());
        }
        if let Some(compacted) = self.compact(ctx, messages).await? {
            *messages = compacted;
        }
        Ok(())
    }

    /// The request to send for `call`: the compacted view of the run's
    /// messages, compacted again when it passes the threshold.
    async fn compact_turn(&self, ctx: &RunContext, input: &History) -> Result<History, BoxError> {
        let slot = run_slot::<TurnState>(ctx, self.owner());
        let candidate = lock(&slot)
            .view
            .extend(input)
            .unwrap_or_else(|| input.clone());
        let output = if self.over(ctx, &candidate)? {
            self.compact(ctx, &candidate).await?.unwrap_or(candidate)
        } else {
            candidate
        };
        lock(&slot).view.set(input, &output);
        Ok(output)
    }
}

impl fmt::Debug for ContextCompressionMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContextCompressionMiddleware")
            .field("policy", &self.policy)
            .field("model", &self.model)
            .field("records", &self.records().len())
            .finish_non_exhaustive()
    }
}

impl Middleware for ContextCompressionMiddleware {
    fn name(&self) -> &str {
        "context-compression"
    }

    fn before_model<'a>(&'a self, ctx: &'a RunContext, messages: &'a mut History) -> Hook<'a, ()> {
        if self.policy.scope != CompactionScope::Thread {
            return Hook::skip();
        }
        match self.policy.trigger {
            CompactionTrigger::TextLen(limit) if messages.text_len() <= limit => Hook::ok(()),
            CompactionTrigger::Messages(limit) if messages.len() <= limit => Hook::ok(()),
            _ => Hook::new(self.compact_thread(ctx, messages)),
        }
    }

    fn wrap_model<'a>(&'a self, mut call: ModelCall, next: ModelNext) -> Wrapped<'a, ModelCall> {
        let needs_model = self.model.is_none()
            && matches!(
                self.policy.trigger,
                CompactionTrigger::Tokens(_) | CompactionTrigger::ContextFraction(_)
            );
        if needs_model {
            let slot = run_slot::<Seen>(&call.context, self.owner());
            let mut seen = lock(&slot);
            if seen.model.as_deref() != Some(&*call.request.model) {
                seen.model = Some(Arc::from(&*call.request.model));
            }
        }
        if self.policy.scope != CompactionScope::Turn {
            return Wrapped::next(call, next);
        }
        Wrapped::new(async move {
            let ctx = call.context.clone();
            call.request.messages = self.compact_turn(&ctx, &call.request.messages).await?;
            next.run(call).await
        })
    }
}
