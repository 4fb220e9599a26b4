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

use std::sync::atomic::{AtomicU64, Ordering};

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::pii::PiiEngine;
use crate::types::{ContentPart, History, Message, MessageContent};

/// Slots, indexed by the fingerprint.
const SLOTS: usize = 4096;

/// A fixed table of the fingerprints of messages found clean. A slot holds
/// one whole fingerprint (one atomic word), so a reader sees a fingerprint
/// some writer stored or none; a newer one replaces an older one of its
/// slot (it is a cache).
pub(super) struct CleanTexts {
    /// The hash's seed, random per table: fingerprints are not known
    /// outside the process.
    seed: u64,
    slots: Box<[AtomicU64]>,
}

impl Default for CleanTexts {
    fn default() -> Self {
        Self {
            seed: rand::random(),
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

/// What a hashed text is to its message (a tag each, so that no two
/// different messages chain the same texts).
const TEXT: u64 = 0x9e37_79b9_7f4a_7c15;
const PART: u64 = 0xc2b2_ae3d_27d4_eb4f;
const ARGUMENTS: u64 = 0x1656_67b1_9e37_79f9;

impl CleanTexts {
    fn slot(&self, fingerprint: u64) -> &AtomicU64 {
        &self.slots[(fingerprint >> 1) as usize % SLOTS]
    }

    /// The fingerprint of what masking reads of `message` (never 0, the
    /// empty slot): its texts hashed in order, each seeded with the hash so
    /// far and its tag, then their shape.
    fn fingerprint(&self, message: &Message) -> u64 {
        let mut hash = self.seed;
        let mut text = |tag: u64, text: &str| hash = xxh3_64_with_seed(text.as_bytes(), hash ^ tag);
        let (kind, parts) = match &message.content {
            None => (0u64, 0u64),
            Some(MessageContent::Text(t)) => {
                text(TEXT, t);
                (1, 0)
            }
            Some(MessageContent::Parts(parts)) => {
                let mut texts = 0;
                for part in parts {
                    if let ContentPart::Text { text: t } = part {
                        text(PART, t);
                        texts += 1;
                    }
                }
                (2, texts)
            }
        };
        for call in &message.tool_calls {
            text(ARGUMENTS, &call.arguments);
        }
        // The shape, one word (two bits of kind, then the counts), mixed in
        // by a bijection: the texts' keyed hash already differs between
        // messages.
        let calls = message.tool_calls.len() as u64;
        mix(hash ^ (kind | parts << 2 | calls << 33)) | 1
    }

    /// Whether `message` holds nothing `engine` masks: known from an earlier
    /// scan, or scanned now (and remembered when clean).
    fn is_clean(&self, engine: &PiiEngine, message: &Message) -> bool {
        match self.seen(message) {
            Ok(()) => true,
            Err(unseen) => {
                let clean = scans_clean(engine, message);
                if clean {
                    unseen.clean();
                }
                clean
            }
        }
    }

    /// `Ok` when `message` was seen clean; else what remembers it clean,
    /// for a caller that scans it itself.
    pub(super) fn seen(&self, message: &Message) -> Result<(), Unseen<'_>> {
        let fingerprint = self.fingerprint(message);
        let slot = self.slot(fingerprint);
        if slot.load(Ordering::Relaxed) == fingerprint {
            Ok(())
        } else {
            Err(Unseen { slot, fingerprint })
        }
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
        if from <= NEAR {
            self.first_of(engine, from, history.iter().skip(from))
        } else {
            // Reaching message `from` from the front costs a step per
            // message before it: from the end instead.
            let mut added: Vec<&Message> = history.iter().rev().take(len - from).collect();
            added.reverse();
            self.first_of(engine, from, added.into_iter())
        }
    }

    /// The index of the first of `messages` (the first at index `from`)
    /// that holds something to mask.
    fn first_of<'a>(
        &self,
        engine: &PiiEngine,
        from: usize,
        messages: impl Iterator<Item = &'a Message>,
    ) -> Option<usize> {
        (from..)
            .zip(messages)
            .find_map(|(i, message)| (!self.is_clean(engine, message)).then_some(i))
    }
}

/// A 64-bit finalizer (MurmurHash3's): a bijection that spreads every bit.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// How far into a history its iterator steps to the first message to check,
/// rather than gathering the messages from its end.
const NEAR: usize = 32;

/// A message not seen clean yet: [`clean`](Self::clean) remembers it.
pub(super) struct Unseen<'a> {
    slot: &'a AtomicU64,
    fingerprint: u64,
}

impl Unseen<'_> {
    /// Remembers the message clean (it was scanned and found so).
    pub(super) fn clean(self) {
        self.slot.store(self.fingerprint, Ordering::Relaxed);
    }
}

/// Whether masking leaves `message` as it is: what
/// [`mask_message`](super::service) masks, detected the same way (the
/// text, the text parts as one text, each tool call's arguments), finds
/// nothing.
fn scans_clean(engine: &PiiEngine, message: &Message) -> bool {
    let clean = |text: &str| engine.detect(text).is_empty();
    let content = match &message.content {
        None => true,
        Some(MessageContent::Text(text)) => clean(text),
        Some(MessageContent::Parts(parts)) => match text_parts(parts).as_slice() {
            [one] => clean(one),
            texts => clean(&texts.concat()),
        },
    };
    content && message.tool_calls.iter().all(|call| clean(&call.arguments))
}

/// The text parts of a message's content, in order: what the model reads
/// joined up, so what is masked and checked as one text.
pub(super) fn text_parts(parts: &[ContentPart]) -> Vec<&str> {
    parts
        .iter()
        .filter_map(|part| match part {
            ContentPart::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
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
