//! [`CleanTexts`]: which messages an engine already found clean, by what
//! masking reads of them, shared by every clone of one
//! [`MaskPii`](super::MaskPii) service and by every run through it.
//!
//! Whether masking changes a message depends on its texts alone (the text,
//! the text parts, each tool call's arguments), not on where it stands nor
//! on the run: a message found clean once is clean in any history. So a
//! history that is new to the [`CleanMemo`](super::memo::CleanMemo) (an
//! edited one, a copy, another run's) is checked message by message with a
//! keyed hash of those texts, and only a message never seen clean is
//! scanned.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::pii::PiiEngine;
use crate::types::{ContentPart, History, Message, MessageContent, ToolCall};

/// Slots, indexed by the fingerprint.
const SLOTS: usize = 4096;

/// A fixed table of the fingerprints of messages found clean. A slot holds
/// one whole fingerprint (one atomic word), so a reader sees a fingerprint
/// some writer stored or none; a newer one replaces an older one of its
/// slot (it is a cache).
pub(super) struct CleanTexts {
    /// SipHash keys, random per table: a fingerprint cannot be aimed at
    /// another from outside the process.
    keys: std::collections::hash_map::RandomState,
    slots: Box<[AtomicU64]>,
}

impl Default for CleanTexts {
    fn default() -> Self {
        Self {
            keys: std::collections::hash_map::RandomState::new(),
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl CleanTexts {
    fn slot(&self, fingerprint: u64) -> &AtomicU64 {
        &self.slots[(fingerprint >> 1) as usize % SLOTS]
    }

    /// The fingerprint of what masking reads of `message` (never 0, the
    /// empty slot).
    fn fingerprint(&self, message: &Message) -> u64 {
        fn text(hasher: &mut impl Hasher, text: &str) {
            hasher.write_usize(text.len());
            hasher.write(text.as_bytes());
        }
        let mut hasher = self.keys.build_hasher();
        match &message.content {
            None => hasher.write_u8(0),
            Some(MessageContent::Text(t)) => {
                hasher.write_u8(1);
                text(&mut hasher, t);
            }
            Some(MessageContent::Parts(parts)) => {
                hasher.write_u8(2);
                for part in parts {
                    if let ContentPart::Text { text: t } = part {
                        hasher.write_u8(1);
                        text(&mut hasher, t);
                    }
                }
                hasher.write_u8(0);
            }
        }
        hasher.write_usize(message.tool_calls.len());
        for ToolCall { arguments, .. } in &message.tool_calls {
            text(&mut hasher, arguments);
        }
        hasher.finish() | 1
    }

    /// Whether `message` holds nothing `engine` masks: known from an earlier
    /// scan, or scanned now (and remembered when clean).
    fn is_clean(&self, engine: &PiiEngine, message: &Message) -> bool {
        let fingerprint = self.fingerprint(message);
        let slot = self.slot(fingerprint);
        if slot.load(Ordering::Relaxed) == fingerprint {
            return true;
        }
        let clean = scans_clean(engine, message);
        if clean {
            slot.store(fingerprint, Ordering::Relaxed);
        }
        clean
    }

    /// The index of the first message of `history` after the first `from`
    /// that holds something to mask, if any.
    pub(super) fn first_dirty(
        &self,
        engine: &PiiEngine,
        history: &History,
        from: usize,
    ) -> Option<usize> {
        let len = history.len();
        let first = |messages: &mut dyn Iterator<Item = &Message>| {
            (from..len)
                .zip(messages)
                .find_map(|(i, message)| (!self.is_clean(engine, message)).then_some(i))
        };
        if from <= NEAR {
            first(&mut history.iter().skip(from))
        } else {
            // Reaching message `from` from the front costs a step per
            // message before it: from the end instead.
            let mut added: Vec<&Message> = history.iter().rev().take(len - from).collect();
            added.reverse();
            first(&mut added.into_iter())
        }
    }
}

/// How far into a history its iterator steps to the first message to check,
/// rather than gathering the messages from its end.
const NEAR: usize = 32;

/// Whether masking leaves `message` as it is: what
/// [`mask_message`](super::service) masks, detected the same way (the
/// text, the text parts as one text, each tool call's arguments), finds
/// nothing.
fn scans_clean(engine: &PiiEngine, message: &Message) -> bool {
    let clean = |text: &str| engine.detect(text).is_empty();
    let content = match &message.content {
        None => true,
        Some(MessageContent::Text(text)) => clean(text),
        Some(MessageContent::Parts(parts)) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter_map(|part| match part {
                    ContentPart::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect();
            match texts.as_slice() {
                [one] => clean(one),
                texts => clean(&texts.concat()),
            }
        }
    };
    content && message.tool_calls.iter().all(|call| clean(&call.arguments))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pii::PiiConfig;
    use crate::types::ToolCall;

    #[test]
    fn a_message_is_clean_by_its_texts_and_scanned_once() {
        let engine = PiiConfig::new().build();
        let texts = CleanTexts::default();
        let history = History::from(vec![
            Message::user("hello"),
            Message::assistant_tool_calls(vec![ToolCall::new("c", "f", r#"{"to":"a@b.example"}"#)]),
            Message::user("bye"),
        ]);
        assert_eq!(texts.first_dirty(&engine, &history, 0), Some(1));
        assert_eq!(texts.first_dirty(&engine, &history, 2), None);
        // Far into a long history: checked from its end, found in order.
        let mut long: Vec<Message> = (0..40).map(|i| Message::user(format!("m{i}"))).collect();
        long[37] = Message::user("mail a@b.example");
        long[39] = Message::user("or c@d.example");
        let long = History::from(long);
        assert_eq!(texts.first_dirty(&engine, &long, 35), Some(37));
        assert_eq!(texts.first_dirty(&engine, &long, 38), Some(39));
        assert_eq!(texts.first_dirty(&engine, &long, 40), None);
        let hello = Message::user("hello");
        assert!(
            texts
                .slot(texts.fingerprint(&hello))
                .load(Ordering::Relaxed)
                != 0
        );
        // The role and the place do not matter; the texts do.
        assert_eq!(
            texts.fingerprint(&hello),
            texts.fingerprint(&Message::assistant("hello"))
        );
        assert_ne!(
            texts.fingerprint(&hello),
            texts.fingerprint(&Message::user("hello!"))
        );
    }
}
