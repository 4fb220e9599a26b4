//! The tallies of one run: [`TokenTally::of_run`].

use std::sync::{Arc, Mutex, PoisonError};

use super::{TokenCounter, TokenCounters, TokenTally};
use crate::context::RunContext;
use crate::types::ModelRequest;

/// Which conversation of a run a tally follows. A run has two that differ:
/// its thread (what `before_model` hooks and the wrap hooks see first) and
/// the request as it reaches the backend (after trimming, clearing and
/// compaction of one request). Each keeps its own tally, so they never
/// recount each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Conversation {
    /// The run's messages, as the hooks see them.
    Thread,
    /// The request as the layers next to the backend see it.
    Request,
}

/// The tallies kept in a run's state, one per counter and conversation.
#[derive(Clone, Default)]
struct RunTallies(Arc<Mutex<Vec<(usize, Conversation, TokenTally)>>>);

impl TokenTally {
    /// The tally of `ctx`'s run that counts `conversation` with `counter`,
    /// made on first use and kept in the run's state: whoever asks for it
    /// in the same run (a trim, a compaction, a budget) shares the counts,
    /// and a turn counts only the messages it added.
    ///
    /// Counters are told apart by identity: ask with the same `Arc` (a
    /// [`TokenCounters`] hands out the same one for a model every time).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tower_agent::tokens::{Conversation, EstimateCounter, TokenCounter, TokenTally};
    /// use tower_agent::types::{History, Message};
    /// use tower_agent::RunContext;
    ///
    /// let ctx = RunContext::new();
    /// let counter: Arc<dyn TokenCounter> = Arc::new(EstimateCounter::new());
    /// let history = History::from(vec![Message::user("abcd")]);
    /// let first = TokenTally::of_run(&ctx, &counter, Conversation::Thread);
    /// first.count(&history);
    /// let again = TokenTally::of_run(&ctx, &counter, Conversation::Thread);
    /// assert_eq!(format!("{again:?}"), format!("{first:?}"), "the same tally");
    /// ```
    pub fn of_run(
        ctx: &RunContext,
        counter: &Arc<dyn TokenCounter>,
        conversation: Conversation,
    ) -> TokenTally {
        let tallies = ctx.with_state(|s| s.get_or_insert_with(RunTallies::default).clone());
        let key = Arc::as_ptr(counter).cast::<()>() as usize;
        let mut tallies = tallies.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, _, tally)) = tallies
            .iter()
            .find(|(k, c, _)| *k == key && *c == conversation)
        {
            return tally.clone();
        }
        let tally = TokenTally::new(counter.clone());
        tallies.push((key, conversation, tally.clone()));
        tally
    }
}

/// The input tokens of `request` in `ctx`'s run: its messages, counted
/// incrementally by the run's [`Conversation::Request`] tally of the
/// model's counter, and its tools. What the budget and rate-limit layers
/// reserve for a call when they are given a [`TokenCounters`].
///
/// ```
/// use tower_agent::tokens::{request_tokens, EstimateCounter, TokenCounters};
/// use tower_agent::types::{Message, ModelRequest};
/// use tower_agent::RunContext;
///
/// let counters = TokenCounters::new(EstimateCounter::new());
/// let request = ModelRequest::new("m", vec![Message::user("abcd")]);
/// // Reply priming 3, message overhead 3, text 1.
/// assert_eq!(request_tokens(&RunContext::new(), &counters, &request), 7);
/// ```
pub fn request_tokens(ctx: &RunContext, counters: &TokenCounters, request: &ModelRequest) -> u64 {
    let counter = counters.for_model(&request.model);
    let tally = TokenTally::of_run(ctx, &counter, Conversation::Request);
    let tools = if request.tools.is_empty() {
        0
    } else {
        counter.count_tools(&request.tools)
    };
    (tally.count(&request.messages) + tools) as u64
}
