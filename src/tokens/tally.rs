//! [`TokenTally`]: a conversation's token count, kept up to date by counting
//! only the messages that changed.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use super::{TokenCounter, REPLY_PRIMING};
use crate::types::{History, Message};

/// The token count of one conversation as it grows.
///
/// It remembers each message's count and the digest of every prefix it
/// counted. Asked again, it finds the longest prefix that is still the same
/// (a binary search over [`History::prefix_digest`]) and counts only the
/// messages after it: after an append, one message; after an edit of the
/// tail, the tail. A turn therefore costs the same at 10 or 10,000 messages.
///
/// Keep one tally per conversation (a run, a thread): it follows the last
/// history it was shown, so two conversations asked in turn recount each
/// other.
///
/// ```
/// use tower_agent::tokens::{EstimateCounter, TokenTally};
/// use tower_agent::types::{History, Message};
///
/// let tally = TokenTally::new(std::sync::Arc::new(EstimateCounter::new()));
/// let mut history = History::from(vec![Message::user("abcdefgh")]);
/// assert_eq!(tally.count(&history), 3 + (3 + 2));
/// history.push(Message::assistant("abcd"));
/// assert_eq!(tally.count(&history), 3 + (3 + 2) + (3 + 1));
/// assert_eq!(tally.counts(&history), vec![5, 4]);
/// ```
///
/// # Clone
///
/// Cheap; clones share the remembered counts.
#[derive(Clone)]
pub struct TokenTally {
    counter: Arc<dyn TokenCounter>,
    seen: Arc<Mutex<Seen>>,
}

#[derive(Default)]
struct Seen {
    /// `digests[i]` is the digest of the first `i + 1` messages counted.
    digests: Vec<[u8; 16]>,
    /// `counts[i]` is the tokens of message `i`.
    counts: Vec<u32>,
    /// `ends[i]` is the tokens of messages `0..=i`.
    ends: Vec<u64>,
    total: usize,
}

impl Seen {
    /// Forgets every message from `len` on.
    fn truncate(&mut self, len: usize) {
        let dropped: usize = self.counts[len..].iter().map(|&c| c as usize).sum();
        self.total -= dropped;
        self.counts.truncate(len);
        self.ends.truncate(len);
        self.digests.truncate(len);
    }

    /// How many leading messages of `history` are the ones counted.
    fn common_prefix(&self, history: &History) -> usize {
        let max = self.digests.len().min(history.len());
        if max == 0 {
            return 0;
        }
        if history.prefix_digest(max) == self.digests[max - 1] {
            return max;
        }
        // Prefix equality is monotone: find the last length that still matches.
        let (mut lo, mut hi) = (0, max - 1);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if history.prefix_digest(mid) == self.digests[mid - 1] {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }
}

impl TokenTally {
    /// A tally counting with `counter`.
    pub fn new(counter: Arc<dyn TokenCounter>) -> Self {
        Self {
            counter,
            seen: Arc::default(),
        }
    }

    /// The counter it counts with.
    pub fn counter(&self) -> &Arc<dyn TokenCounter> {
        &self.counter
    }

    /// The tokens of one message, with the chat format's overhead.
    pub fn message(&self, message: &Message) -> usize {
        self.counter.count_message(message)
    }

    /// The tokens of `history` as a request: every message and the reply
    /// priming. Counts only what changed since the last call.
    pub fn count(&self, history: &History) -> usize {
        REPLY_PRIMING + self.update(history, |seen| seen.total)
    }

    /// The tokens of each message of `history`, oldest first.
    pub fn counts(&self, history: &History) -> Vec<u32> {
        self.update(history, |seen| seen.counts.clone())
    }

    /// Reads the per-message counts of `history` without copying them:
    /// `read` gets a [`Counts`] view (each message's tokens and the sum of
    /// any range in O(1)). Counts only what changed since the last call.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tower_agent::tokens::{EstimateCounter, TokenTally};
    /// use tower_agent::types::{History, Message};
    ///
    /// let tally = TokenTally::new(Arc::new(EstimateCounter::new()));
    /// let history = History::from(vec![Message::user("abcd"), Message::user("abcdefgh")]);
    /// let (last, both) = tally.with_counts(&history, |counts| (counts.get(1), counts.sum(0..2)));
    /// assert_eq!((last, both), (5, 4 + 5));
    /// ```
    pub fn with_counts<R>(&self, history: &History, read: impl FnOnce(&Counts<'_>) -> R) -> R {
        self.update(history, |seen| {
            read(&Counts {
                counts: &seen.counts,
                ends: &seen.ends,
            })
        })
    }

    /// Brings the remembered counts up to `history` and reads them.
    fn update<R>(&self, history: &History, read: impl FnOnce(&Seen) -> R) -> R {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let keep = seen.common_prefix(history);
        if keep < seen.counts.len() {
            seen.truncate(keep);
        }
        for (i, message) in history.iter().skip(keep).enumerate() {
            let tokens = self.counter.count_message(message);
            seen.counts.push(u32::try_from(tokens).unwrap_or(u32::MAX));
            seen.digests.push(history.prefix_digest(keep + i + 1));
            seen.total += tokens;
            let total = seen.total as u64;
            seen.ends.push(total);
        }
        read(&seen)
    }
}

/// The per-message token counts of a history, as
/// [`TokenTally::with_counts`] hands them: borrowed, never copied.
#[derive(Debug, Clone, Copy)]
pub struct Counts<'a> {
    counts: &'a [u32],
    ends: &'a [u64],
}

impl Counts<'_> {
    /// How many messages.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether there is no message.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// The tokens of message `index` (0 past the end).
    pub fn get(&self, index: usize) -> usize {
        self.counts.get(index).map_or(0, |&c| c as usize)
    }

    /// The tokens of the messages in `range` (clamped to the messages), in O(1).
    pub fn sum(&self, range: std::ops::Range<usize>) -> usize {
        let end = range.end.min(self.ends.len());
        let start = range.start.min(end);
        if start == end {
            return 0;
        }
        let upto = |n: usize| if n == 0 { 0 } else { self.ends[n - 1] };
        (upto(end) - upto(start)) as usize
    }

    /// The tokens of every message, without the reply priming.
    pub fn total(&self) -> usize {
        self.sum(0..self.counts.len())
    }
}

impl fmt::Debug for TokenTally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("TokenTally")
            .field("counter", &self.counter.name())
            .field("messages", &seen.counts.len())
            .field("total", &seen.total)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::tokens::EstimateCounter;

    /// Counts how many texts it was asked to count.
    #[derive(Debug, Default)]
    struct Counting(AtomicUsize);

    impl TokenCounter for Counting {
        fn name(&self) -> &str {
            "counting"
        }

        fn count(&self, text: &str) -> usize {
            self.0.fetch_add(1, Ordering::Relaxed);
            EstimateCounter::new().count(text)
        }
    }

    fn long_history(n: usize) -> History {
        (0..n)
            .map(|i| Message::user(format!("message {i}")))
            .collect()
    }

    #[test]
    fn an_append_counts_only_the_new_message() {
        let counter = Arc::new(Counting::default());
        let tally = TokenTally::new(counter.clone());
        let mut history = long_history(1_000);
        let full = tally.count(&history);
        assert_eq!(counter.0.load(Ordering::Relaxed), 1_000);
        history.push(Message::assistant("done"));
        let after = tally.count(&history);
        assert_eq!(counter.0.load(Ordering::Relaxed), 1_001);
        assert_eq!(after, full + 3 + 1);
        assert_eq!(
            after,
            EstimateCounter::new().count_messages(&history.to_vec())
        );
    }

    #[test]
    fn an_edit_recounts_from_the_first_changed_message() {
        let counter = Arc::new(Counting::default());
        let tally = TokenTally::new(counter.clone());
        let mut history = long_history(100);
        tally.count(&history);
        history.to_mut()[90] = Message::user("changed, and longer than before");
        let after = tally.count(&history);
        assert_eq!(counter.0.load(Ordering::Relaxed), 100 + 10);
        assert_eq!(
            after,
            EstimateCounter::new().count_messages(&history.to_vec())
        );
    }

    #[test]
    fn a_shorter_or_different_history_is_counted_right() {
        let tally = TokenTally::new(Arc::new(EstimateCounter::new()));
        let mut history = long_history(50);
        tally.count(&history);
        history.truncate(10);
        assert_eq!(
            tally.count(&history),
            EstimateCounter::new().count_messages(&history.to_vec())
        );
        let other = History::from(vec![Message::system("another thread entirely")]);
        assert_eq!(
            tally.count(&other),
            EstimateCounter::new().count_messages(&other.to_vec())
        );
        assert_eq!(tally.counts(&History::new()), Vec::<u32>::new());
        assert_eq!(tally.count(&History::new()), REPLY_PRIMING);
    }
}
