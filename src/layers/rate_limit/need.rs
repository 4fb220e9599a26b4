//! A call's token need, and the memo of a history's text size that lets
//! the default estimate skip measuring a history it measured already.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use crate::types::History;

/// A history's text size, by the `(lineage, len)` that fix its messages.
///
/// Read and written without a lock: a sequence number, odd while a writer
/// writes, tells a reader whether what it read is one writer's whole
/// entry. A reader that finds it torn (or a writer that finds another one
/// writing) measures the history itself.
pub(super) struct TextMemo {
    seq: AtomicU64,
    lineage: AtomicU64,
    len: AtomicU64,
    text_len: AtomicU64,
}

impl TextMemo {
    pub(super) fn new() -> Self {
        Self {
            seq: AtomicU64::new(0),
            lineage: AtomicU64::new(0),
            len: AtomicU64::new(u64::MAX),
            text_len: AtomicU64::new(0),
        }
    }

    /// The tokens `need` comes to, measuring the history only when it is
    /// not the one remembered.
    #[inline]
    pub(super) fn tokens(&self, need: Need<'_>) -> u64 {
        let (messages, output) = match need {
            Need::Tokens(tokens) => return tokens,
            Need::Text { messages, output } => (messages, output),
        };
        let (lineage, len) = (messages.lineage(), messages.len() as u64);
        let text_len = match self.get(lineage, len) {
            Some(text_len) => text_len,
            None => {
                let text_len = messages.text_len();
                self.set(lineage, len, text_len);
                text_len
            }
        };
        text_len.div_ceil(4).saturating_add(output)
    }

    #[inline]
    fn get(&self, lineage: u64, len: u64) -> Option<u64> {
        let seq = self.seq.load(Ordering::Acquire);
        if seq & 1 == 1 {
            return None;
        }
        let found = (
            self.lineage.load(Ordering::Relaxed),
            self.len.load(Ordering::Relaxed),
            self.text_len.load(Ordering::Relaxed),
        );
        fence(Ordering::Acquire);
        let whole = self.seq.load(Ordering::Relaxed) == seq;
        (whole && found.0 == lineage && found.1 == len).then_some(found.2)
    }

    fn set(&self, lineage: u64, len: u64, text_len: u64) {
        let seq = self.seq.load(Ordering::Relaxed);
        if seq & 1 == 1
            || self
                .seq
                .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            // Another writer writes: its entry will do.
            return;
        }
        fence(Ordering::Release);
        self.lineage.store(lineage, Ordering::Relaxed);
        self.len.store(len, Ordering::Relaxed);
        self.text_len.store(text_len, Ordering::Relaxed);
        self.seq.store(seq + 2, Ordering::Release);
    }
}

/// A call's token need: a number, or the default estimate's parts, for the
/// key's [`TextMemo`] to answer under its lock.
pub(super) enum Need<'a> {
    Tokens(u64),
    Text {
        messages: &'a History,
        /// The output allowance, added to the text at four bytes a token.
        output: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Message;

    fn text(messages: &History) -> Need<'_> {
        Need::Text {
            messages,
            output: 5,
        }
    }

    #[test]
    fn the_memo_measures_a_history_again_once_it_changed() {
        let memo = TextMemo::new();
        let mut history = History::from(vec![Message::user("x".repeat(40))]);
        assert_eq!(memo.tokens(text(&history)), 10 + 5);
        let earlier = history.clone();
        assert_eq!(memo.tokens(text(&earlier)), 10 + 5);
        // Grown: measured again.
        history.push(Message::user("y".repeat(400)));
        assert_eq!(memo.tokens(text(&history)), 110 + 5);
        // Edited to the same length: a new lineage, measured again.
        history.to_mut()[1] = Message::user("z".repeat(4));
        assert_eq!(memo.tokens(text(&history)), 11 + 5);
        // The shorter state it grew from is its own.
        assert_eq!(memo.tokens(text(&earlier)), 10 + 5);
        assert_eq!(memo.tokens(Need::Tokens(7)), 7);
    }
}
