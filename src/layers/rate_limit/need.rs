//! A call's token need, and the memo of a history's text size that lets
//! the default estimate skip measuring a history it measured already.

use crate::types::History;

/// A history's text size, by the `(lineage, len)` that fix its messages.
#[derive(Clone, Copy)]
pub(super) struct TextMemo {
    lineage: u64,
    len: usize,
    text_len: u64,
}

impl TextMemo {
    pub(super) const EMPTY: Self = Self {
        lineage: 0,
        len: usize::MAX,
        text_len: 0,
    };

    /// The tokens `need` comes to, measuring the history only when it is
    /// not the one remembered.
    #[inline]
    pub(super) fn tokens(&mut self, need: Need<'_>) -> u64 {
        let (messages, output) = match need {
            Need::Tokens(tokens) => return tokens,
            Need::Text { messages, output } => (messages, output),
        };
        let (lineage, len) = (messages.lineage(), messages.len());
        if self.lineage != lineage || self.len != len {
            *self = TextMemo {
                lineage,
                len,
                text_len: messages.text_len(),
            };
        }
        self.text_len.div_ceil(4).saturating_add(output)
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
        let mut memo = TextMemo::EMPTY;
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
