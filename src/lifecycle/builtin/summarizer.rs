//! What writes a compaction's summary: the [`Summarizer`] trait, the
//! model-free [`ConcatSummarizer`] and the [`ModelSummarizer`], which asks
//! any model service.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use tower::Service;

use super::side_call::call_as;
use crate::context::RunContext;
use crate::error::BoxError;
use crate::request::{box_model, BoxModel, ModelCall};
use crate::types::{Message, ModelName, ModelRequest, ModelResponse};

/// Writes the summary of older messages.
///
/// Public so that whatever compacts (a middleware during a run, a memory
/// store after it) can share one. A summarizer that calls a model should
/// send its call with a context of the run (as [`ModelSummarizer`] does), so
/// that the call's usage lands in the run's ledger.
pub trait Summarizer: Send + Sync + 'static {
    /// A summary of `messages`.
    fn summarize<'a>(
        &'a self,
        ctx: &'a RunContext,
        messages: &'a [Message],
    ) -> BoxFuture<'a, Result<String, BoxError>>;
}

impl<S: Summarizer + ?Sized> Summarizer for Arc<S> {
    fn summarize<'a>(
        &'a self,
        ctx: &'a RunContext,
        messages: &'a [Message],
    ) -> BoxFuture<'a, Result<String, BoxError>> {
        (**self).summarize(ctx, messages)
    }
}

/// Each message as `role: text` (its calls' names when it has no text), one
/// a line, cut to `max_chars` characters.
fn transcript(messages: &[Message], max_chars: usize) -> String {
    let lines: Vec<String> = messages
        .iter()
        .map(|m| {
            let text = m.text();
            let mut line: String = text.chars().take(max_chars).collect();
            if line.len() < text.len() {
                line.push('…');
            }
            if line.is_empty() && !m.tool_calls.is_empty() {
                let names: Vec<&str> = m.tool_calls.iter().map(|c| c.name.as_str()).collect();
                line = format!("called {}", names.join(", "));
            }
            format!("{}: {line}", m.role.as_str())
        })
        .collect();
    lines.join("\n")
}

/// The default [`Summarizer`]: each message as `role: text`, cut to a
/// number of characters, one per line. Deterministic and model-free.
#[derive(Debug, Clone, Copy)]
pub struct ConcatSummarizer {
    max_chars: usize,
}

impl ConcatSummarizer {
    /// Keeps at most `max_chars` characters of each message.
    pub fn new(max_chars: usize) -> Self {
        Self { max_chars }
    }
}

impl Default for ConcatSummarizer {
    fn default() -> Self {
        Self::new(200)
    }
}

impl Summarizer for ConcatSummarizer {
    fn summarize<'a>(
        &'a self,
        _: &'a RunContext,
        messages: &'a [Message],
    ) -> BoxFuture<'a, Result<String, BoxError>> {
        Box::pin(std::future::ready(Ok(transcript(messages, self.max_chars))))
    }
}

/// The instructions a [`ModelSummarizer`] gives by default.
pub const SUMMARY_PROMPT: &str = "You condense conversations. Summarise the conversation \
    you are given so that an assistant can continue it without it: the user's goals and \
    constraints, decisions taken, facts learned (names, numbers, ids, results of tool calls), \
    and what is still open. Be brief and factual; write only the summary.";

/// A [`Summarizer`] that asks a model: a system prompt
/// ([`SUMMARY_PROMPT`] unless [`prompt`](Self::prompt) says otherwise) and
/// the messages as a transcript, sent to any model service.
///
/// The call goes out with a child context of the run named after the
/// compaction ([`name`](Self::name), `compaction` by default): its usage is
/// recorded in the run's ledger under that name, rolls up into the run's
/// total usage ([`AgentRun::usage_total`](crate::types::AgentRun)) and not
/// into the run's own model calls, and budgets held by the run hold it too.
/// A model service that does not record its usage itself has it recorded
/// here, once.
///
/// # Clone
///
/// Cheap; clones share the model service.
///
/// # Example
///
/// A summarizer is usable on its own, outside a middleware (after a run, to
/// compact a stored thread):
///
/// ```
/// use tower_agent::lifecycle::builtin::{ModelSummarizer, Summarizer};
/// use tower_agent::types::Message;
/// use tower_agent::{RunContext, ScriptedModel, ScriptedTurn, Usage};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::BoxError> {
/// let model = ScriptedModel::new([ScriptedTurn::text("The user asked about A-1; it shipped.")
///     .usage(Usage::new(40, 9))]);
/// let summarizer = ModelSummarizer::new(model.clone(), "gpt-4o-mini");
/// let ctx = RunContext::new();
/// let thread = [Message::user("Where is A-1?"), Message::assistant("It shipped on Monday.")];
/// let summary = summarizer.summarize(&ctx, &thread).await?;
/// assert_eq!(summary, "The user asked about A-1; it shipped.");
/// // The call's usage is in the ledger, under the compaction's name.
/// let entry = &ctx.usage_entries()[0];
/// assert_eq!(entry.agent.as_deref(), Some("compaction"));
/// assert_eq!(ctx.total_usage(), Usage::new(40, 9));
/// assert!(model.requests()[0].messages[1].text().contains("assistant: It shipped on Monday."));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ModelSummarizer {
    model: BoxModel,
    model_name: ModelName,
    prompt: Arc<str>,
    name: Arc<str>,
    max_tokens: Option<u32>,
    max_chars: usize,
}

impl ModelSummarizer {
    /// Summarizes with `model`, asking for `model_name`.
    pub fn new<S>(model: S, model_name: impl Into<ModelName>) -> Self
    where
        S: Service<ModelCall, Response = ModelResponse> + Clone + Send + Sync + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        Self {
            model: box_model(model),
            model_name: model_name.into(),
            prompt: Arc::from(SUMMARY_PROMPT),
            name: Arc::from("compaction"),
            max_tokens: Some(1_024),
            max_chars: 4_000,
        }
    }

    /// The system prompt of the summarising call.
    pub fn prompt(mut self, prompt: impl Into<Arc<str>>) -> Self {
        self.prompt = prompt.into();
        self
    }

    /// The name the call's usage is recorded under (default `compaction`).
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = name.into();
        self
    }

    /// The summary's `max_tokens` (default 1024; `None` for the model's own).
    pub fn max_tokens(mut self, max_tokens: Option<u32>) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// How many characters of each message the transcript keeps (default
    /// 4,000).
    pub fn max_chars(mut self, max_chars: usize) -> Self {
        self.max_chars = max_chars;
        self
    }

    async fn ask(&self, ctx: &RunContext, messages: &[Message]) -> Result<String, BoxError> {
        let mut request = ModelRequest::new(
            self.model_name.clone(),
            vec![
                Message::system(&*self.prompt),
                Message::user(transcript(messages, self.max_chars)),
            ],
        );
        request.settings_mut().max_tokens = self.max_tokens;
        let response = call_as(&self.model, ctx, &self.name, request).await?;
        Ok(response.message.text().trim().to_owned())
    }
}

impl fmt::Debug for ModelSummarizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelSummarizer")
            .field("model_name", &self.model_name)
            .field("name", &self.name)
            .field("max_tokens", &self.max_tokens)
            .finish_non_exhaustive()
    }
}

impl Summarizer for ModelSummarizer {
    fn summarize<'a>(
        &'a self,
        ctx: &'a RunContext,
        messages: &'a [Message],
    ) -> BoxFuture<'a, Result<String, BoxError>> {
        Box::pin(self.ask(ctx, messages))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ToolCall, Usage};
    use crate::{ScriptedModel, ScriptedTurn};

    #[tokio::test]
    async fn the_concat_summary_cuts_long_messages_and_names_calls() {
        let messages = [
            Message::user("abcdef"),
            Message::assistant_tool_calls(vec![ToolCall::new("c1", "lookup", "{}")]),
        ];
        let summary = ConcatSummarizer::new(3)
            .summarize(&RunContext::new(), &messages)
            .await
            .unwrap();
        assert_eq!(summary, "user: abc…\nassistant: called lookup");
    }

    #[tokio::test]
    async fn a_model_error_is_the_summarizer_s_error_and_usage_is_named() {
        let failing = ScriptedModel::new([]);
        let err = ModelSummarizer::new(failing, "m")
            .summarize(&RunContext::new(), &[Message::user("x")])
            .await;
        assert!(err.is_err());

        let model = ScriptedModel::new([ScriptedTurn::text("  short  ").usage(Usage::new(5, 1))]);
        let ctx = RunContext::new();
        let summary = ModelSummarizer::new(model.clone(), "m")
            .name("thread-compaction")
            .prompt("Summarise.")
            .max_tokens(Some(64))
            .summarize(&ctx, &[Message::user("x")])
            .await
            .unwrap();
        assert_eq!(summary, "short");
        assert_eq!(ctx.usage(), Usage::default(), "not the run's own call");
        assert_eq!(ctx.total_usage(), Usage::new(5, 1));
        let entries = ctx.usage_entries();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].agent.as_deref(), Some("thread-compaction"));
        let request = &model.requests()[0];
        assert_eq!(request.settings.max_tokens, Some(64));
        assert_eq!(request.messages[0].text(), "Summarise.");
    }
}
