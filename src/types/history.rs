use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use super::{ContentPart, Message, MessageContent};

/// A shared, append-friendly message history.
///
/// Cloning a `History` costs one reference count, whatever its length, so a
/// [`ModelCall`](crate::ModelCall) can be cloned for a retry, a fallback or a
/// cache key in O(1). Appending is O(1) amortized while nobody else holds the
/// history; if a clone is still alive, the first append copies it
/// (clone-on-write), so holders never see each other's changes.
///
/// The history also keeps, lazily and incrementally, a stable digest and the
/// text size of every prefix. A layer that must read the whole history on each
/// turn (a cache key, a token estimate) pays only for the messages added since
/// it last asked.
///
/// ```
/// use tower_agent::types::{History, Message};
///
/// let mut history = History::from(vec![Message::system("be brief")]);
/// let shared = history.clone();
/// assert!(History::ptr_eq(&history, &shared));
/// history.push(Message::user("hi")); // copies: `shared` is still alive
/// assert_eq!(shared.len(), 1);
/// assert_eq!(history.len(), 2);
/// assert_ne!(history.digest(), shared.digest());
/// ```
#[derive(Clone, Default)]
pub struct History {
    inner: Arc<Inner>,
}

struct Inner {
    messages: Vec<Message>,
    /// `prefix[i]` describes `messages[..=i]`; computed on demand.
    prefix: Mutex<Prefixes>,
    /// How often [`History::to_mut`] handed out the messages.
    edits: u64,
    /// Shared by the states of one allocation that only grew by appends;
    /// see [`History::lineage`].
    lineage: u64,
}

fn new_lineage() -> u64 {
    rand::random()
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            messages: Vec::new(),
            prefix: Mutex::default(),
            edits: 0,
            lineage: new_lineage(),
        }
    }
}

/// Digests and sizes of the prefixes, each extended on demand.
#[derive(Clone, Default)]
struct Prefixes {
    /// `digests[i]` digests `messages[..=i]`.
    digests: Vec<[u8; 16]>,
    /// `text_lens[i]` sums the text of `messages[..=i]`.
    text_lens: Vec<u64>,
}

impl Clone for Inner {
    fn clone(&self) -> Self {
        Self {
            messages: self.messages.clone(),
            prefix: Mutex::new(self.prefixes().clone()),
            edits: self.edits,
            lineage: new_lineage(),
        }
    }
}

impl Inner {
    fn prefixes(&self) -> std::sync::MutexGuard<'_, Prefixes> {
        self.prefix.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn digest(&self) -> [u8; 16] {
        self.prefix_digest(self.messages.len())
    }

    fn prefix_digest(&self, len: usize) -> [u8; 16] {
        let len = len.min(self.messages.len());
        let mut prefix = self.prefixes();
        let digests = &mut prefix.digests;
        while digests.len() < len {
            let previous = digests.last().copied().unwrap_or([0; 16]);
            let mut hasher = Sha256::new();
            hasher.update(previous);
            feed(&mut hasher, &self.messages[digests.len()]);
            let mut digest = [0; 16];
            digest.copy_from_slice(&hasher.finalize()[..16]);
            digests.push(digest);
        }
        len.checked_sub(1).map_or([0; 16], |last| digests[last])
    }

    fn text_len(&self) -> u64 {
        let mut prefix = self.prefixes();
        let lens = &mut prefix.text_lens;
        while lens.len() < self.messages.len() {
            let previous = lens.last().copied().unwrap_or(0);
            lens.push(previous + self.messages[lens.len()].text_len() as u64);
        }
        lens.last().copied().unwrap_or(0)
    }
}

/// Feeds one message to a hasher in a fixed binary layout: every field
/// tagged or length-prefixed, so no two different messages feed the same
/// bytes. Stable across processes and versions (change it only with a new
/// layout tag).
fn feed(hasher: &mut Sha256, message: &Message) {
    fn text(hasher: &mut Sha256, text: &str) {
        hasher.update((text.len() as u64).to_le_bytes());
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
    hasher.update([1, message.role as u8]);
    match &message.content {
        None => hasher.update([0]),
        Some(MessageContent::Text(content)) => {
            hasher.update([1]);
            text(hasher, content);
        }
        Some(MessageContent::Parts(parts)) => {
            hasher.update([2]);
            hasher.update((parts.len() as u64).to_le_bytes());
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
    hasher.update((message.tool_calls.len() as u64).to_le_bytes());
    for call in &message.tool_calls {
        text(hasher, &call.id);
        text(hasher, &call.name);
        text(hasher, &call.arguments);
    }
    optional(hasher, message.tool_call_id.as_deref());
    optional(hasher, message.name.as_deref());
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// The messages, oldest first.
    pub fn as_slice(&self) -> &[Message] {
        &self.inner.messages
    }

    /// The storage, made unique first (a copy, with a new lineage, if a
    /// clone is alive).
    fn inner_mut(&mut self) -> &mut Inner {
        if Arc::get_mut(&mut self.inner).is_none() {
            self.inner = Arc::new((*self.inner).clone());
        }
        Arc::get_mut(&mut self.inner).expect("just made unique")
    }

    /// Appends a message (O(1) amortized; copies once if a clone is alive).
    pub fn push(&mut self, message: Message) {
        self.inner_mut().messages.push(message);
    }

    /// Mutable access to the messages, for arbitrary edits. Forgets the
    /// cached digests, which are recomputed when next asked for.
    pub fn to_mut(&mut self) -> &mut Vec<Message> {
        let inner = self.inner_mut();
        inner.edits += 1;
        inner.lineage = new_lineage();
        *inner
            .prefix
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner) = Prefixes::default();
        &mut inner.messages
    }

    /// Keeps the first `len` messages (all if there are fewer). The cached
    /// digests and sizes of the kept prefix stay; the lineage changes, since
    /// what follows may now differ.
    pub fn truncate(&mut self, len: usize) {
        let inner = self.inner_mut();
        if len >= inner.messages.len() {
            return;
        }
        inner.messages.truncate(len);
        inner.edits += 1;
        inner.lineage = new_lineage();
        let prefix = inner
            .prefix
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        prefix.digests.truncate(len);
        prefix.text_lens.truncate(len);
    }

    /// The messages, taken out (copied only if a clone is alive).
    pub fn into_vec(self) -> Vec<Message> {
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => inner.messages,
            Err(shared) => shared.messages.clone(),
        }
    }

    /// A stable 128-bit digest of every message, in order. Equal histories
    /// have equal digests, across processes and versions of this crate's
    /// dependencies (SHA-256 over a fixed, length-prefixed layout of each
    /// message's fields). Incremental: only messages appended since the last
    /// call are hashed.
    pub fn digest(&self) -> [u8; 16] {
        self.inner.digest()
    }

    /// The digest of the first `len` messages (of all of them if `len` is
    /// larger): equal to [`digest`](Self::digest) of a history holding just
    /// those. A layer that keeps work per prefix checks with it that the
    /// prefix it saw is still there.
    pub fn prefix_digest(&self, len: usize) -> [u8; 16] {
        self.inner.prefix_digest(len)
    }

    /// The summed [`Message::text_len`] of every message. Incremental like
    /// [`digest`](Self::digest).
    pub fn text_len(&self) -> u64 {
        self.inner.text_len()
    }

    /// How often [`to_mut`](Self::to_mut) was called on this history (and
    /// the histories it was copied from). Unchanged means only appends
    /// happened.
    pub fn edit_count(&self) -> u64 {
        self.inner.edits
    }

    /// Checks that every tool call has exactly one result after it, and that
    /// every tool result answers a call made before it. A middleware edit
    /// that breaks this would otherwise reach the provider as a 400.
    ///
    /// # Errors
    ///
    /// A description of the first violation.
    pub fn check_integrity(&self) -> Result<(), String> {
        use std::collections::HashMap;
        // call id -> answered?
        let mut open: HashMap<&str, bool> = HashMap::new();
        for message in self.as_slice() {
            match message.role {
                super::Role::Assistant => {
                    for call in &message.tool_calls {
                        if open.insert(&call.id, false).is_some() {
                            return Err(format!("tool call id `{}` is used twice", call.id));
                        }
                    }
                }
                super::Role::Tool => {
                    let id = message.tool_call_id.as_deref().unwrap_or("");
                    match open.get_mut(id) {
                        None => {
                            return Err(format!(
                                "tool result for `{id}` answers no earlier tool call"
                            ))
                        }
                        Some(true) => return Err(format!("tool call `{id}` has two results")),
                        Some(answered) => *answered = true,
                    }
                }
                _ => {}
            }
        }
        match open.into_iter().find(|(_, answered)| !answered) {
            Some((id, _)) => Err(format!("tool call `{id}` has no result")),
            None => Ok(()),
        }
    }

    /// An id of this history's line of growth: histories with the same
    /// lineage are states of one storage that only grew by appends, so the
    /// shorter is a prefix of the longer. An edit ([`to_mut`](Self::to_mut))
    /// or a copy (an append while a clone is alive) starts a new lineage.
    /// A layer that keeps work per prefix (the PII layer's masked history)
    /// checks `(lineage, len)` in O(1) instead of hashing.
    pub fn lineage(&self) -> u64 {
        self.inner.lineage
    }

    /// Whether two histories share the same storage (a clone, not a copy).
    pub fn ptr_eq(a: &History, b: &History) -> bool {
        Arc::ptr_eq(&a.inner, &b.inner)
    }
}

impl Deref for History {
    type Target = [Message];

    fn deref(&self) -> &[Message] {
        self.as_slice()
    }
}

impl fmt::Debug for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl PartialEq for History {
    fn eq(&self, other: &Self) -> bool {
        History::ptr_eq(self, other) || self.as_slice() == other.as_slice()
    }
}

impl From<Vec<Message>> for History {
    fn from(messages: Vec<Message>) -> Self {
        Self {
            inner: Arc::new(Inner {
                messages,
                prefix: Mutex::default(),
                edits: 0,
                lineage: new_lineage(),
            }),
        }
    }
}

impl FromIterator<Message> for History {
    fn from_iter<I: IntoIterator<Item = Message>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl<'a> IntoIterator for &'a History {
    type Item = &'a Message;
    type IntoIter = std::slice::Iter<'a, Message>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl Extend<Message> for History {
    fn extend<I: IntoIterator<Item = Message>>(&mut self, iter: I) {
        self.inner_mut().messages.extend(iter);
    }
}

impl Serialize for History {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.as_slice().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for History {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<Message>::deserialize(deserializer).map(History::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_in_place_when_unshared() {
        let mut history = History::from(vec![Message::user("a")]);
        let before = Arc::as_ptr(&history.inner);
        history.push(Message::user("b"));
        assert_eq!(Arc::as_ptr(&history.inner), before);
    }

    #[test]
    fn digest_is_incremental_and_matches_a_fresh_computation() {
        let mut history = History::new();
        assert_eq!(history.digest(), [0; 16]);
        history.push(Message::user("a"));
        let one = history.digest();
        history.push(Message::assistant("b"));
        let fresh = History::from(history.to_vec());
        assert_eq!(history.digest(), fresh.digest());
        assert_ne!(history.digest(), one);
        assert_eq!(history.prefix_digest(1), one);
        assert_eq!(history.prefix_digest(0), [0; 16]);
        assert_eq!(history.prefix_digest(99), history.digest());
        assert_eq!(history.text_len(), 2);
        history.to_mut()[1].set_text("changed");
        assert_ne!(history.digest(), fresh.digest());
        assert_eq!(history.text_len(), 8);
        assert_eq!(history.edit_count(), 1);
    }

    #[test]
    fn truncate_keeps_the_prefix_digests() {
        let mut history: History = (0..5).map(|i| Message::user(format!("{i}"))).collect();
        let three = History::from(history[..3].to_vec());
        history.digest();
        let lineage = history.lineage();
        history.truncate(3);
        assert_eq!(history.len(), 3);
        assert_eq!(history.digest(), three.digest());
        assert_eq!(history.text_len(), 3);
        assert_ne!(history.lineage(), lineage);
        history.truncate(10);
        assert_eq!(history.len(), 3);
    }

    #[test]
    fn lineage_follows_appends_only() {
        let mut a = History::new();
        assert_ne!(a.lineage(), History::new().lineage());
        let start = a.lineage();
        a.push(Message::user("1"));
        assert_eq!(a.lineage(), start, "an append in place keeps the lineage");
        let b = a.clone();
        a.push(Message::user("2"));
        assert_ne!(a.lineage(), b.lineage(), "a copy starts a new lineage");
        let before = a.lineage();
        a.to_mut()[0].set_text("edited");
        assert_ne!(a.lineage(), before, "an edit starts a new lineage");
    }

    #[test]
    fn integrity_finds_orphans_both_ways() {
        use crate::types::ToolCall;
        let call = Message::assistant_tool_calls(vec![ToolCall::new("a", "f", "{}")]);
        let ok = History::from(vec![call.clone(), Message::tool("a", "r")]);
        assert_eq!(ok.check_integrity(), Ok(()));
        let missing = History::from(vec![call.clone(), Message::user("?")]);
        assert!(missing
            .check_integrity()
            .unwrap_err()
            .contains("has no result"));
        let orphan = History::from(vec![Message::tool("b", "r")]);
        assert!(orphan
            .check_integrity()
            .unwrap_err()
            .contains("answers no earlier"));
        let twice = History::from(vec![call, Message::tool("a", "r"), Message::tool("a", "r")]);
        assert!(twice.check_integrity().unwrap_err().contains("two results"));
    }
}
