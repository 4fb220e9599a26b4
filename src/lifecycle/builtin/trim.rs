//! [`MessageTrimMiddleware`]: keeps the conversation within a window of
//! messages, text or tokens.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use super::view::{lock, run_slot, SystemIndex, View};
use crate::context::RunContext;
use crate::error::BoxError;
use crate::lifecycle::{Hook, Middleware, ModelMiddleware, ModelNext};
use crate::request::ModelCall;
use crate::tokens::{
    Conversation, EstimateCounter, TokenCounter, TokenCounters, TokenTally, REPLY_PRIMING,
};
use crate::types::{History, Message, ModelResponse, Role};

/// How [`MessageTrimMiddleware`] and [`trim_messages`] measure the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrimStrategy {
    /// At most this many messages besides the system messages.
    LastMessages(usize),
    /// At most this many bytes of text ([`Message::text_len`]) besides the
    /// system messages.
    MaxTextLen(usize),
    /// At most this many tokens in all, system messages and the reply
    /// priming included, counted by the model's [`TokenCounter`].
    MaxTokens(usize),
}

impl TrimStrategy {
    fn limit(self) -> usize {
        match self {
            TrimStrategy::LastMessages(n)
            | TrimStrategy::MaxTextLen(n)
            | TrimStrategy::MaxTokens(n) => n,
        }
    }
}

/// Where the kept window starts, walking back from the newest message
/// (`newest_first` yields the `n` messages newest first).
///
/// `cost(i)` is what message `i` counts, `fixed(i)` what the system
/// messages before `i` count (they are kept wherever the window starts).
/// `pinned` is the last user message and its cost: kept (and counted) when
/// the window starts after it. The window always holds the last message,
/// and only starts where no tool result after it answers a call before it.
/// Among such starts it takes the earliest one whose window fits `target`
/// (the first legal one if none fits). `0` means everything fits. The walk
/// stops at the first start that does not fit: it costs the window, not
/// the thread.
fn window_start<'m, I>(
    n: usize,
    newest_first: I,
    cost: impl Fn(usize) -> usize,
    fixed: impl Fn(usize) -> usize,
    pinned: Option<(usize, usize)>,
    target: usize,
) -> usize
where
    I: Iterator<Item = &'m Message>,
{
    let mut pending: HashSet<&str> = HashSet::new();
    let mut window = 0;
    let mut best = None;
    for (k, message) in newest_first.enumerate() {
        let i = n - 1 - k;
        if message.role == Role::Tool {
            if let Some(id) = &message.tool_call_id {
                pending.insert(id.as_str());
            }
        }
        for call in &message.tool_calls {
            pending.remove(call.id.as_str());
        }
        window += cost(i);
        if !pending.is_empty() || message.role == Role::Tool {
            continue;
        }
        let extra = match pinned {
            Some((user, tokens)) if user < i => tokens,
            _ => 0,
        };
        if best.is_some() && window + fixed(i) + extra > target {
            break;
        }
        best = Some(i);
    }
    best.unwrap_or(0)
}

/// The system messages and the last user message before `start`, then
/// every message from it.
fn kept(history: &[&Message], start: usize) -> Vec<Message> {
    let user = history.iter().rposition(|m| m.role == Role::User);
    history[..start]
        .iter()
        .enumerate()
        .filter(|(i, m)| m.role == Role::System || Some(*i) == user)
        .map(|(_, m)| *m)
        .chain(history[start..].iter().copied())
        .cloned()
        .collect()
}

/// Trims `messages` under `strategy`: `None` when nothing needs to go.
/// Tokens are counted with the [`EstimateCounter`]; the middleware counts
/// with the model's counter.
///
/// The system messages stay wherever they are, and so do the last message
/// and the last user message (counted in the limit). The window never starts inside a tool turn:
/// it is widened back to the assistant turn that made the calls, so every
/// tool call keeps its result and no result is left without its call.
///
/// ```
/// use tower_agent::lifecycle::builtin::{trim_messages, TrimStrategy};
/// use tower_agent::types::{Message, ToolCall};
///
/// let messages = vec![
///     Message::system("Be brief."),
///     Message::user("one"),
///     Message::assistant_tool_calls(vec![ToolCall::new("c1", "lookup", "{}")]),
///     Message::tool("c1", "found"),
///     Message::assistant("two"),
/// ];
/// // The last two would start at the tool result, which goes with its
/// // call; the system prompt and the last user message stay.
/// let kept = trim_messages(&messages, TrimStrategy::LastMessages(2)).unwrap();
/// assert_eq!(kept.len(), 3);
/// assert_eq!(kept[1].text(), "one");
/// assert_eq!(kept[2].text(), "two");
/// let more = [messages.clone(), vec![Message::user("three"), Message::assistant("four")]].concat();
/// let kept = trim_messages(&more, TrimStrategy::LastMessages(2)).unwrap();
/// assert_eq!(kept.len(), 3);
/// assert_eq!(kept[1].text(), "three");
/// ```
pub fn trim_messages(messages: &[Message], strategy: TrimStrategy) -> Option<Vec<Message>> {
    let refs: Vec<&Message> = messages.iter().collect();
    let counter = EstimateCounter::new();
    let cost = |i: usize| measure(strategy, &counter, refs[i]);
    let fixed = |i: usize| {
        refs[..i]
            .iter()
            .filter(|m| m.role == Role::System)
            .map(|m| measure(strategy, &counter, m))
            .sum::<usize>()
            + priming(strategy)
    };
    let pinned = refs
        .iter()
        .rposition(|m| m.role == Role::User)
        .map(|u| (u, cost(u)));
    let start = window_start(
        refs.len(),
        refs.iter().rev().copied(),
        cost,
        fixed,
        pinned,
        strategy.limit(),
    );
    let user = pinned.map(|(u, _)| u);
    let trims = refs[..start]
        .iter()
        .enumerate()
        .any(|(i, m)| m.role != Role::System && Some(i) != user);
    trims.then(|| kept(&refs, start))
}

fn measure(strategy: TrimStrategy, counter: &dyn TokenCounter, message: &Message) -> usize {
    match strategy {
        TrimStrategy::LastMessages(_) => usize::from(message.role != Role::System),
        TrimStrategy::MaxTextLen(_) => {
            if message.role == Role::System {
                0
            } else {
                message.text_len()
            }
        }
        TrimStrategy::MaxTokens(_) => counter.count_message(message),
    }
}

fn priming(strategy: TrimStrategy) -> usize {
    match strategy {
        TrimStrategy::MaxTokens(_) => REPLY_PRIMING,
        _ => 0,
    }
}

/// What a trim keeps per run: where the window started last time (and the
/// digest of the messages before it), what the system messages before it
/// cost, and the request it made.
#[derive(Default)]
struct Cut {
    start: usize,
    prefix: [u8; 16],
    fixed: usize,
    /// The last user message, when the window starts after it.
    user: Option<usize>,
    systems: SystemIndex,
    view: View,
}

/// Keeps the conversation within a [`TrimStrategy`] window.
///
/// The system messages always stay, and so do the last message and the last
/// user message (in its place, when the window starts after it, as in a
/// long tool loop); a tool call is never separated from its result, and no
/// result is left without its call. The run checks the history's integrity
/// after every edit, as for any `before_model` change.
///
/// Two placements, one type:
/// - [`push`](crate::lifecycle::MiddlewareStack::push) it: in `before_model`
///   it trims the run's conversation, which goes on from the trimmed one
///   (the transcript too);
/// - [`push_model`](crate::lifecycle::MiddlewareStack::push_model) it: it
///   trims each model request only, and the run keeps every message.
///
/// # Cost and the prompt cache
///
/// Tokens are counted with the model's counter (from
/// [`counters`](Self::counters), OpenAI's encodings by default) through the
/// run's [`TokenTally`], so a turn counts only the messages it added. Once
/// it has cut, the window keeps its start while it still fits, so the
/// request keeps its prefix and a turn costs the messages it added, at any
/// length of the thread. [`retain`](Self::retain) below 1 cuts down to that
/// fraction of the limit, so the next cut comes turns later: the cached
/// prefix then moves once per cut, not once per turn.
///
/// ```
/// use tower_agent::lifecycle::builtin::{MessageTrimMiddleware, TrimStrategy};
/// use tower_agent::lifecycle::MiddlewareStack;
///
/// let per_request = MiddlewareStack::new()
///     .push_model(MessageTrimMiddleware::new(TrimStrategy::LastMessages(20)));
/// # let _ = per_request;
/// ```
///
/// # Clone
///
/// Clones are the same middleware: they share what they keep per run.
///
/// # Example
///
/// ```
/// use tower_agent::lifecycle::builtin::{MessageTrimMiddleware, TrimStrategy};
/// use tower_agent::lifecycle::MiddlewareStack;
/// use tower_agent::{Agent, ScriptedModel, ScriptedTurn};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::AgentError> {
/// let model = ScriptedModel::new([ScriptedTurn::text("hi")]);
/// // Each request holds at most 2,000 tokens; a cut goes down to 1,500, so
/// // the cached prefix stays put for the next turns.
/// let trim = MessageTrimMiddleware::new(TrimStrategy::MaxTokens(2_000)).retain(0.75);
/// let agent = Agent::builder("a")
///     .model(model.clone())
///     .middleware(MiddlewareStack::new().push_model(trim))
///     .build()?;
/// let run = agent.run("hello").await?;
/// assert_eq!(run.output, "hi");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MessageTrimMiddleware {
    strategy: TrimStrategy,
    retain: f64,
    counters: TokenCounters,
    model: Option<Arc<str>>,
    id: Arc<()>,
}

impl MessageTrimMiddleware {
    /// Trims under `strategy`, sliding the window (a cut keeps as much as
    /// fits).
    pub fn new(strategy: TrimStrategy) -> Self {
        Self {
            strategy,
            retain: 1.0,
            counters: TokenCounters::default(),
            model: None,
            id: Arc::new(()),
        }
    }

    /// A cut keeps at most `fraction` of the limit (clamped to 0..=1;
    /// default 1). Lower values cut less often, and keep the cached prefix
    /// longer.
    pub fn retain(mut self, fraction: f64) -> Self {
        self.retain = if fraction.is_nan() {
            1.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        self
    }

    /// Counts tokens with `counters` (default [`TokenCounters::openai`]).
    pub fn counters(mut self, counters: TokenCounters) -> Self {
        self.counters = counters;
        self
    }

    /// The model whose counter counts in `before_model`, where the request's
    /// model is not known yet (default: the counters' default).
    pub fn model(mut self, model: impl Into<Arc<str>>) -> Self {
        self.model = Some(model.into());
        self
    }

    fn slot(&self, ctx: &RunContext) -> Arc<Mutex<Cut>> {
        run_slot::<Cut>(ctx, Arc::as_ptr(&self.id) as usize)
    }

    /// The messages to send instead of `history`, if it must be trimmed.
    fn trim(&self, ctx: &RunContext, history: &History, model: Option<&str>) -> Option<History> {
        let slot = self.slot(ctx);
        let mut cut = lock(&slot);
        let strategy = self.strategy;
        let limit = strategy.limit();
        let counter = self
            .counters
            .for_model(model.or(self.model.as_deref()).unwrap_or(""));
        let tally = match strategy {
            TrimStrategy::MaxTokens(_) => {
                Some(TokenTally::of_run(ctx, &counter, Conversation::Thread))
            }
            _ => None,
        };
        let decide = |cut: &mut Cut,
                      cost: &dyn Fn(usize) -> usize,
                      window_total: &dyn Fn(usize) -> usize,
                      total: usize| {
            let n = history.len();
            // The window of the last cut, while it still fits and the
            // messages before it are the same (then it still holds the
            // last user message: the rest was appended after it).
            if cut.start > 0
                && cut.start < n
                && history.prefix_digest(cut.start) == cut.prefix
                && window_total(cut.start) + cut.fixed <= limit
            {
                return Some(cut.start);
            }
            if total <= limit {
                return None;
            }
            let systems = cut.systems.before(history, n).to_vec();
            let user = cut.systems.last_user();
            let pinned = user.map(|u| (u, cost(u)));
            let fixed = |i: usize| {
                systems
                    .iter()
                    .take_while(|&&s| s < i)
                    .map(|&s| cost(s))
                    .sum::<usize>()
                    + priming(strategy)
            };
            let target = (limit as f64 * self.retain) as usize;
            let start = window_start(n, history.iter().rev(), cost, fixed, pinned, target);
            let pinned_before = user.is_some_and(|u| u < start);
            let trims =
                start > systems.partition_point(|&s| s < start) + usize::from(pinned_before);
            if !trims {
                return None;
            }
            cut.start = start;
            cut.prefix = history.prefix_digest(start);
            cut.fixed = fixed(start) + pinned.filter(|_| pinned_before).map_or(0, |(_, c)| c);
            cut.user = user.filter(|_| pinned_before);
            cut.view.clear();
            Some(start)
        };
        let start = match &tally {
            Some(tally) => tally.with_counts(history, |counts| {
                let cost = |i: usize| counts.get(i);
                let window = |start: usize| counts.sum(start..counts.len());
                decide(&mut cut, &cost, &window, counts.total() + REPLY_PRIMING)
            }),
            None => {
                let cost = |i: usize| measure(strategy, &*counter, &history[i]);
                // Counting messages or text needs no tally: the total is the
                // messages' count or the history's cached text size.
                let total = match strategy {
                    TrimStrategy::LastMessages(_) => history.len(),
                    _ => usize::try_from(history.text_len()).unwrap_or(usize::MAX),
                };
                let window = |start: usize| window_total(history, start, &cost);
                decide(&mut cut, &cost, &window, total)
            }
        };
        let Some(start) = start else {
            cut.start = 0;
            cut.view.clear();
            return None;
        };
        if let Some(output) = cut.view.extend(history) {
            cut.view.set(history, &output);
            return Some(output);
        }
        let mut before = cut.systems.before(history, start).to_vec();
        if let Some(user) = cut.user {
            let at = before.partition_point(|&i| i < user);
            before.insert(at, user);
        }
        let mut output: Vec<Message> = before.iter().map(|&i| history[i].clone()).collect();
        output.extend((start..history.len()).map(|i| history[i].clone()));
        let output = History::from(output);
        cut.view.set(history, &output);
        Some(output)
    }
}

/// The cost of `history[start..]`, walking back from the end (the window
/// is what is kept, so this is bounded by it).
fn window_total(history: &History, start: usize, cost: &dyn Fn(usize) -> usize) -> usize {
    let n = history.len();
    history
        .iter()
        .rev()
        .take(n - start)
        .enumerate()
        .map(|(k, _)| cost(n - 1 - k))
        .sum()
}

impl Middleware for MessageTrimMiddleware {
    fn name(&self) -> &str {
        "message-trim"
    }

    fn before_model<'a>(&'a self, ctx: &'a RunContext, messages: &'a mut History) -> Hook<'a, ()> {
        if let Some(kept) = self.trim(ctx, messages, None) {
            *messages = kept;
        }
        Hook::ok(())
    }
}

impl ModelMiddleware for MessageTrimMiddleware {
    fn name(&self) -> &str {
        "message-trim"
    }

    fn wrap_model<'a>(
        &'a self,
        mut call: ModelCall,
        next: ModelNext,
    ) -> BoxFuture<'a, Result<ModelResponse, BoxError>> {
        let model = call.request.model.clone();
        if let Some(kept) = self.trim(&call.context, &call.request.messages, Some(&model)) {
            call.request.messages = kept;
        }
        Box::pin(next.run(call))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ToolCall;

    fn thread(turns: usize) -> History {
        let mut messages = vec![Message::system("sys")];
        for t in 0..turns {
            messages.push(Message::user(format!("question {t}")));
            let id = format!("c{t}");
            messages.push(Message::assistant_tool_calls(vec![ToolCall::new(
                id.as_str(),
                "lookup",
                "{}",
            )]));
            messages.push(Message::tool(id.as_str(), "a result of some length"));
            messages.push(Message::assistant(format!("answer {t}")));
        }
        History::from(messages)
    }

    #[test]
    fn a_token_window_keeps_system_messages_the_last_user_message_and_tool_pairs() {
        let trim = MessageTrimMiddleware::new(TrimStrategy::MaxTokens(60))
            .counters(TokenCounters::new(EstimateCounter::new()));
        let ctx = RunContext::new();
        let history = thread(10);
        let kept = trim.trim(&ctx, &history, None).unwrap();
        assert_eq!(kept[0].text(), "sys");
        assert_eq!(kept.check_integrity(), Ok(()));
        assert!(kept.iter().any(|m| m.text() == "question 9"));
        let tokens = EstimateCounter::new().count_messages(&kept.to_vec());
        assert!(tokens <= 60, "{tokens}");
        assert!(kept.len() < history.len());
    }

    #[test]
    fn an_oversized_last_user_message_is_kept_anyway() {
        let trim = MessageTrimMiddleware::new(TrimStrategy::MaxTokens(10))
            .counters(TokenCounters::new(EstimateCounter::new()));
        let mut history = thread(2);
        history.push(Message::user("x".repeat(400)));
        let kept = trim.trim(&RunContext::new(), &history, None).unwrap();
        assert_eq!(kept.len(), 2, "the system prompt and the last user message");
        assert_eq!(kept[1].text_len(), 400);
    }

    #[test]
    fn the_window_keeps_its_start_while_it_fits_and_extends_the_request() {
        let trim = MessageTrimMiddleware::new(TrimStrategy::LastMessages(8)).retain(0.5);
        let ctx = RunContext::new();
        let mut history = thread(4);
        let first = trim.trim(&ctx, &history, None).unwrap();
        assert_eq!(first.len(), 1 + 4, "cut down to half the limit");
        history.push(Message::user("more"));
        let second = trim.trim(&ctx, &history, None).unwrap();
        assert!(second.shares_prefix_with(&first), "extended, not rebuilt");
        assert_eq!(second.len(), first.len() + 1);
        for _ in 0..3 {
            history.push(Message::assistant("ok"));
        }
        let third = trim.trim(&ctx, &history, None).unwrap();
        assert!(third.len() <= 1 + 8);
        assert_eq!(third.check_integrity(), Ok(()));
    }

    #[test]
    fn nothing_is_trimmed_below_the_limit() {
        let trim = MessageTrimMiddleware::new(TrimStrategy::MaxTextLen(100_000));
        assert!(trim.trim(&RunContext::new(), &thread(3), None).is_none());
        assert!(trim_messages(&[], TrimStrategy::LastMessages(0)).is_none());
        assert!(trim_messages(&[Message::user("a")], TrimStrategy::MaxTokens(0)).is_none());
    }
}
