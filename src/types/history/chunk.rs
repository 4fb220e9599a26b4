//! The immutable pieces a [`History`](super::History) is made of.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use sha2::{Digest, Sha256};

use crate::types::{ContentPart, Message, MessageContent};

/// A run of messages. Mutated only while one history holds it (appends in
/// place, truncation, edits); once shared it is read-only, and every history
/// holding it has the same messages before it, so its cached digests, chained
/// from the digest of what precedes it, are valid for all of them.
pub(super) struct Chunk {
    pub(super) messages: Vec<Message>,
    /// The summed text size of a prefix, as [`TextSum`]: read and extended
    /// without a lock (every reader of a shared chunk sums the same
    /// messages, so a race stores the same value twice).
    text: AtomicU64,
    /// The chunk's digests, made the first time one is asked for (only
    /// layers that key on the conversation ask): every run holds a chunk.
    cache: OnceLock<Box<Cache>>,
}

/// The digests of a chunk.
#[derive(Default)]
struct Cache {
    /// The digest of every message, with the `base` it is chained from:
    /// read without the lock. Forgotten by every change.
    whole: OnceLock<Whole>,
    /// The digests of its prefixes, extended on demand.
    prefixes: Mutex<Option<Digests>>,
}

/// The digest of a whole chunk, chained from `base`.
#[derive(Clone, Copy)]
struct Whole {
    base: [u8; 16],
    digest: [u8; 16],
}

/// How many leading messages a chunk's text sum covers, and the sum, in one
/// word: the count in the high [`TextSum::COUNT_BITS`] bits.
#[derive(Clone, Copy)]
struct TextSum {
    summed: usize,
    text_len: u64,
}

impl TextSum {
    const COUNT_BITS: u32 = 24;
    const LEN_BITS: u32 = 64 - Self::COUNT_BITS;

    fn unpack(word: u64) -> Self {
        Self {
            summed: (word >> Self::LEN_BITS) as usize,
            text_len: word & ((1 << Self::LEN_BITS) - 1),
        }
    }

    /// The word, unless a part does not fit (a chunk of 16 million
    /// messages, or a terabyte of text): that sum is not kept.
    fn pack(self) -> Option<u64> {
        let fits =
            (self.summed as u64) < 1 << Self::COUNT_BITS && self.text_len < 1 << Self::LEN_BITS;
        fits.then_some(((self.summed as u64) << Self::LEN_BITS) | self.text_len)
    }
}

/// The digests of a chunk's prefixes.
struct Digests {
    /// The digest of everything before the chunk, `digests` is chained from.
    base: [u8; 16],
    /// `digests[i]` digests the history up to and with `messages[i]`.
    digests: Vec<[u8; 16]>,
}

impl Chunk {
    pub(super) fn new(messages: Vec<Message>) -> Self {
        Self {
            messages,
            text: AtomicU64::new(0),
            cache: OnceLock::new(),
        }
    }

    /// The digest of the history up to and with `messages[..len]`, given the
    /// digest `base` of what precedes the chunk.
    pub(super) fn digest(&self, base: [u8; 16], len: usize) -> [u8; 16] {
        let len = len.min(self.messages.len());
        let whole = len == self.messages.len();
        let cache = self.cache.get_or_init(Box::default);
        if let Some(known) = cache.whole.get().filter(|w| whole && w.base == base) {
            return known.digest;
        }
        let digest = self.prefix_digest(cache, base, len);
        if whole {
            // A chunk under another base keeps the first it was asked for.
            let _ = cache.whole.set(Whole { base, digest });
        }
        digest
    }

    /// [`digest`](Self::digest) from the prefix digests, extended as needed.
    fn prefix_digest(&self, cache: &Cache, base: [u8; 16], len: usize) -> [u8; 16] {
        let mut prefixes = cache
            .prefixes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let cached = prefixes.get_or_insert_with(|| Digests {
            base,
            digests: Vec::new(),
        });
        if cached.base != base {
            cached.base = base;
            cached.digests.clear();
        }
        let digests = &mut cached.digests;
        while digests.len() < len {
            let previous = digests.last().copied().unwrap_or(base);
            let mut hasher = Sha256::new();
            hasher.update(previous);
            feed(&mut hasher, &self.messages[digests.len()]);
            let mut digest = [0; 16];
            digest.copy_from_slice(&hasher.finalize()[..16]);
            digests.push(digest);
        }
        len.checked_sub(1).map_or(base, |last| digests[last])
    }

    /// The summed [`Message::text_len`] of every message of the chunk.
    pub(super) fn text_len(&self) -> u64 {
        let mut sum = TextSum::unpack(self.text.load(Ordering::Acquire));
        if sum.summed == self.messages.len() {
            return sum.text_len;
        }
        sum.text_len += self.messages[sum.summed..]
            .iter()
            .map(|m| m.text_len() as u64)
            .sum::<u64>();
        sum.summed = self.messages.len();
        if let Some(word) = sum.pack() {
            self.text.store(word, Ordering::Release);
        }
        sum.text_len
    }

    /// Mutable messages (the chunk is held by one history only); the cache
    /// is forgotten, since the caller may edit anything.
    pub(super) fn edit(&mut self) -> &mut Vec<Message> {
        self.cache.take();
        *self.text.get_mut() = 0;
        &mut self.messages
    }

    /// Appends in place (the chunk is held by one history only).
    pub(super) fn push(&mut self, message: Message) {
        if let Some(cache) = self.cache.get_mut() {
            cache.whole.take();
        }
        self.messages.push(message);
    }

    /// Keeps the first `len` messages, their cached digests and their
    /// summed text size (what was cut is taken off the sum, not summed
    /// again: a caller that truncates a long thread each run pays for what
    /// it cut only).
    pub(super) fn truncate(&mut self, len: usize) {
        let text = self.text.get_mut();
        let mut sum = TextSum::unpack(*text);
        if sum.summed > len {
            let cut: u64 = self.messages[len..sum.summed]
                .iter()
                .map(|m| m.text_len() as u64)
                .sum();
            sum.summed = len;
            sum.text_len -= cut;
            *text = sum.pack().unwrap_or(0);
        }
        if let Some(cache) = self.cache.get_mut() {
            let prefixes = cache.prefixes.get_mut();
            if let Some(cached) = prefixes.unwrap_or_else(PoisonError::into_inner) {
                cached.digests.truncate(len);
            }
            if len < self.messages.len() {
                cache.whole.take();
            }
        }
        self.messages.truncate(len);
    }
}

/// The tag of [`feed`]'s layout: a message's bytes start with it. 1 was
/// the layout with 8-byte lengths and counts.
const LAYOUT: u8 = 2;

/// Feeds one message to a hasher in a fixed binary layout: every field
/// tagged or length-prefixed, so no two different messages feed the same
/// bytes. Lengths and counts are LEB128 varints (prefix-free, so the layout
/// stays unambiguous): a short message with its 16-byte chained digest fits
/// one SHA-256 block, and a one-call assistant turn too. Stable across
/// processes and versions (change it only with a new [`LAYOUT`] tag).
fn feed(hasher: &mut Sha256, message: &Message) {
    fn length(hasher: &mut Sha256, mut n: u64) {
        let mut bytes = [0u8; 10];
        let mut len = 0;
        loop {
            let low = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                bytes[len] = low;
                len += 1;
                break;
            }
            bytes[len] = low | 0x80;
            len += 1;
        }
        hasher.update(&bytes[..len]);
    }
    fn text(hasher: &mut Sha256, text: &str) {
        length(hasher, text.len() as u64);
        hasher.update(text.as_bytes());
    }
    fn optional(hasher: &mut Sha256, value: Option<&str>) {
        match value {
            None => hasher.update([0]),
            Some(value) => {
                hasher.update([1]);
                text(hasher, value);
            }
        }
    }
    hasher.update([LAYOUT, message.role as u8]);
    match &message.content {
        None => hasher.update([0]),
        Some(MessageContent::Text(content)) => {
            hasher.update([1]);
            text(hasher, content);
        }
        Some(MessageContent::Parts(parts)) => {
            hasher.update([2]);
            length(hasher, parts.len() as u64);
            for part in parts {
                match part {
                    ContentPart::Text { text: content } => {
                        hasher.update([0]);
                        text(hasher, content);
                    }
                    ContentPart::ImageUrl { image_url } => {
                        hasher.update([1]);
                        text(hasher, &image_url.url);
                        optional(hasher, image_url.detail.as_deref());
                    }
                }
            }
        }
    }
    length(hasher, message.tool_calls.len() as u64);
    for call in &message.tool_calls {
        text(hasher, &call.id);
        text(hasher, &call.name);
        text(hasher, &call.arguments);
    }
    optional(hasher, message.tool_call_id.as_deref());
    optional(hasher, message.name.as_deref());
}
