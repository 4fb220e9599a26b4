use std::borrow::Cow;
use std::fmt;
use std::ops::Index;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Message;

mod chunk;
mod iter;

use chunk::Chunk;
pub use iter::Iter;

/// A shared, append-friendly message history.
///
/// Cloning a `History` costs one reference count, whatever its length, so a
/// [`ModelCall`](crate::ModelCall) can be cloned for a retry, a fallback or a
/// cache key in O(1). Appending is O(1) amortized, whether or not a clone is
/// alive: the messages live in immutable shared chunks plus a tail, and an
/// append to a history whose tail is shared starts a new tail instead of
/// copying, so holders never see each other's changes and never pay for
/// them. Small trailing chunks are merged, so a history has O(log n) chunks.
///
/// The history also keeps, lazily and incrementally, a stable digest and the
/// text size of every prefix, cached in the chunks themselves. A layer that
/// must read the whole history on each turn (a cache key, a token estimate)
/// pays only for the messages added since it last asked, even through
/// clones.
///
/// The messages are not one contiguous slice: read them with
/// [`iter`](Self::iter), [`get`](Self::get), indexing, [`first`](Self::first)
/// and [`last`](Self::last), or [`to_contiguous`](Self::to_contiguous) where
/// a slice is truly needed.
///
/// ```
/// use tower_agent::types::{History, Message};
///
/// let mut history = History::from(vec![Message::system("be brief")]);
/// let shared = history.clone();
/// assert!(History::ptr_eq(&history, &shared));
/// history.push(Message::user("hi")); // `shared` is alive, and unchanged
/// assert_eq!(shared.len(), 1);
/// assert_eq!(history.len(), 2);
/// assert_eq!(history[1].text(), "hi");
/// assert_ne!(history.digest(), shared.digest());
/// ```
#[derive(Clone, Default)]
pub struct History {
    inner: Arc<Inner>,
}

struct Inner {
    /// The messages, oldest first. Only the last chunk is ever appended to,
    /// and only while this `Inner` is its one holder.
    chunks: Vec<Arc<Chunk>>,
    /// How often [`History::to_mut`] handed out the messages.
    edits: u64,
    /// See [`History::lineage`].
    lineage: u64,
    /// Set once a history grew from this state under its lineage; any other
    /// growth from it starts a new lineage, so one lineage is one line.
    extended: AtomicBool,
    /// How many leading chunks appends never merge: a prefix shared by many
    /// histories (an agent's system prompt, see [`History::continuing`])
    /// stays one chunk, held by all of them.
    pinned: u8,
}

fn new_lineage() -> u64 {
    rand::random()
}

impl Default for Inner {
    fn default() -> Self {
        Self::with_chunks(Vec::new(), 0, new_lineage())
    }
}

impl Inner {
    fn with_chunks(chunks: Vec<Arc<Chunk>>, edits: u64, lineage: u64) -> Self {
        Self {
            chunks,
            edits,
            lineage,
            extended: AtomicBool::new(false),
            pinned: 0,
        }
    }

    fn len(&self) -> usize {
        self.chunks.iter().map(|chunk| chunk.messages.len()).sum()
    }

    /// Appends, in place if the last chunk is this history's alone, or in a
    /// new last chunk, into which trailing chunks not more than twice its
    /// size are merged (each chunk stays over twice the size of the next).
    fn push(&mut self, message: Message) {
        if let Some(last) = self.chunks.last_mut().and_then(Arc::get_mut) {
            reserve_one(&mut last.messages);
            last.push(message);
            return;
        }
        let mut merged = 1;
        let mut from = self.chunks.len();
        let pinned = usize::from(self.pinned);
        while from > pinned && self.chunks[from - 1].messages.len() <= 2 * merged {
            from -= 1;
            merged += self.chunks[from].messages.len();
        }
        let mut messages = Vec::with_capacity(merged.max(4));
        for chunk in self.chunks.drain(from..) {
            match Arc::try_unwrap(chunk) {
                Ok(chunk) => messages.extend(chunk.messages),
                Err(chunk) => messages.extend(chunk.messages.iter().cloned()),
            }
        }
        messages.push(message);
        self.chunks.push(Arc::new(Chunk::new(messages)));
    }

    /// Gathers the messages into one chunk held by this history alone.
    fn unique_chunk(&mut self) -> &mut Chunk {
        let unique = self.chunks.len() == 1 && Arc::get_mut(&mut self.chunks[0]).is_some();
        if !unique {
            let messages: Vec<Message> = Iter::new(&self.chunks, self.len()).cloned().collect();
            self.chunks = vec![Arc::new(Chunk::new(messages))];
        }
        self.pinned = 0;
        Arc::get_mut(&mut self.chunks[0]).expect("just made unique")
    }
}

/// Makes room for one more message in a short chunk, by moving the
/// messages to a room twice as large rather than by `realloc`: a room that
/// small is usually in the allocator's per-thread cache, which a `realloc`
/// that cannot grow in place passes by to search its bins (several times
/// the cost of the move, in a run's appends). A long chunk grows as a
/// `Vec` does, where `realloc` may remap its pages instead of copying them.
fn reserve_one(messages: &mut Vec<Message>) {
    const SHORT: usize = 64;
    if messages.len() == messages.capacity() && messages.capacity() < SHORT {
        let mut grown = Vec::with_capacity((2 * messages.capacity()).max(4));
        grown.append(messages);
        *messages = grown;
    }
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// The state, made this history's alone first: if a clone is alive, a
    /// new state holding the same chunks (copying no message). `grow` says
    /// the caller appends, which keeps the lineage if no other history grew
    /// from this state yet.
    fn inner_mut(&mut self, grow: bool) -> &mut Inner {
        // No `Weak` of the state is ever made, so one strong count means
        // this history holds it alone: read with a plain load, and the
        // one atomic exchange left is `get_mut`'s below.
        if Arc::strong_count(&self.inner) != 1 {
            let shared = &*self.inner;
            let lineage = if grow && !shared.extended.swap(true, Ordering::AcqRel) {
                shared.lineage
            } else {
                new_lineage()
            };
            let mut inner = Inner::with_chunks(shared.chunks.clone(), shared.edits, lineage);
            inner.pinned = shared.pinned;
            self.inner = Arc::new(inner);
        }
        let inner = Arc::get_mut(&mut self.inner).expect("just made unique");
        if grow && std::mem::take(inner.extended.get_mut()) {
            // A clone grew from this state under the lineage and is gone:
            // this growth must not share the lineage with it.
            inner.lineage = new_lineage();
        }
        inner
    }

    /// A history that continues `prefix`, sharing its chunks, with
    /// `messages` (whose spare capacity is kept) after them. Appends never
    /// merge the prefix into this history's own chunks: the histories that
    /// continue one prefix all hold the same storage for it (the system
    /// prompt of an agent's runs, one for all of them).
    pub(crate) fn continuing(prefix: &History, messages: Vec<Message>) -> Self {
        let shared = &prefix.inner.chunks;
        let mut chunks = Vec::with_capacity(shared.len() + 1);
        chunks.extend(shared.iter().cloned());
        let pinned = u8::try_from(chunks.len()).unwrap_or(u8::MAX);
        chunks.push(Arc::new(Chunk::new(messages)));
        let mut inner = Inner::with_chunks(chunks, 0, new_lineage());
        inner.pinned = pinned;
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Appends a message: O(1) amortized, and no message is copied even if
    /// a clone is alive.
    pub fn push(&mut self, message: Message) {
        self.inner_mut(true).push(message);
    }

    /// Mutable access to the messages, for arbitrary edits. Gathers them
    /// into one vector first (a copy, if they are shared or in several
    /// chunks), starts a new lineage and forgets the cached digests, which
    /// are recomputed when next asked for.
    pub fn to_mut(&mut self) -> &mut Vec<Message> {
        let inner = self.inner_mut(false);
        inner.edits += 1;
        inner.lineage = new_lineage();
        *inner.extended.get_mut() = false;
        inner.unique_chunk().edit()
    }

    /// Keeps the first `len` messages (all if there are fewer). The cached
    /// digests and sizes of the kept prefix stay; the lineage changes, since
    /// what follows may now differ. Chunks wholly kept are not copied.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len() {
            return;
        }
        let inner = self.inner_mut(false);
        inner.edits += 1;
        inner.lineage = new_lineage();
        *inner.extended.get_mut() = false;
        let mut kept = 0;
        let mut keep_chunks = 0;
        while kept < len {
            kept += inner.chunks[keep_chunks].messages.len();
            keep_chunks += 1;
        }
        inner.chunks.truncate(keep_chunks);
        inner.pinned = inner
            .pinned
            .min(u8::try_from(keep_chunks).unwrap_or(u8::MAX));
        if kept > len {
            let last = inner.chunks.last_mut().expect("kept > len > 0");
            let last_len = last.messages.len() - (kept - len);
            match Arc::get_mut(last) {
                Some(chunk) => chunk.truncate(last_len),
                None => {
                    *last = Arc::new(Chunk::new(last.messages[..last_len].to_vec()));
                }
            }
        }
    }

    /// The number of messages (O(log n): a sum over the chunks).
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether there is no message.
    pub fn is_empty(&self) -> bool {
        self.inner
            .chunks
            .iter()
            .all(|chunk| chunk.messages.is_empty())
    }

    /// The messages, oldest first (double-ended: `.rev()` for newest first).
    pub fn iter(&self) -> Iter<'_> {
        Iter::new(&self.inner.chunks, self.len())
    }

    /// The message at `index`, if there is one.
    pub fn get(&self, mut index: usize) -> Option<&Message> {
        for chunk in &self.inner.chunks {
            match chunk.messages.get(index) {
                Some(message) => return Some(message),
                None => index -= chunk.messages.len(),
            }
        }
        None
    }

    /// The oldest message.
    pub fn first(&self) -> Option<&Message> {
        self.inner
            .chunks
            .iter()
            .find_map(|chunk| chunk.messages.first())
    }

    /// The newest message.
    pub fn last(&self) -> Option<&Message> {
        self.inner
            .chunks
            .iter()
            .rev()
            .find_map(|chunk| chunk.messages.last())
    }

    /// The messages, copied into a vector.
    pub fn to_vec(&self) -> Vec<Message> {
        self.iter().cloned().collect()
    }

    /// The messages as one slice: borrowed if they are in one chunk, copied
    /// otherwise. Prefer [`iter`](Self::iter).
    pub fn to_contiguous(&self) -> Cow<'_, [Message]> {
        match self.inner.chunks.as_slice() {
            [] => Cow::Borrowed(&[]),
            [chunk] => Cow::Borrowed(&chunk.messages),
            _ => Cow::Owned(self.to_vec()),
        }
    }

    /// The messages, taken out (copied only where they are shared).
    pub fn into_vec(self) -> Vec<Message> {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) if inner.chunks.len() == 1 => {
                match Arc::try_unwrap(inner.chunks.pop().expect("one chunk")) {
                    Ok(chunk) => chunk.messages,
                    Err(chunk) => chunk.messages.clone(),
                }
            }
            Ok(inner) => Iter::new(&inner.chunks, inner.len()).cloned().collect(),
            Err(shared) => Iter::new(&shared.chunks, shared.len()).cloned().collect(),
        }
    }

    /// A stable 128-bit digest of every message, in order. Equal histories
    /// have equal digests, across processes and versions of this crate's
    /// dependencies (SHA-256 over a fixed, length-prefixed layout of each
    /// message's fields). Incremental: only messages appended since the last
    /// call are hashed.
    pub fn digest(&self) -> [u8; 16] {
        self.prefix_digest(usize::MAX)
    }

    /// The digest of the first `len` messages (of all of them if `len` is
    /// larger): equal to [`digest`](Self::digest) of a history holding just
    /// those. A layer that keeps work per prefix checks with it that the
    /// prefix it saw is still there.
    pub fn prefix_digest(&self, len: usize) -> [u8; 16] {
        let mut digest = [0; 16];
        let mut remaining = len;
        for chunk in &self.inner.chunks {
            if remaining == 0 {
                break;
            }
            let take = remaining.min(chunk.messages.len());
            digest = chunk.digest(digest, take);
            remaining -= take;
        }
        digest
    }

    /// The summed [`Message::text_len`] of every message. Incremental like
    /// [`digest`](Self::digest).
    pub fn text_len(&self) -> u64 {
        self.inner.chunks.iter().map(|chunk| chunk.text_len()).sum()
    }

    /// How often [`to_mut`](Self::to_mut) or a shortening
    /// [`truncate`](Self::truncate) was called on this history (and the
    /// histories it grew from). Unchanged means only appends happened.
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
        for message in self.iter() {
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
    /// lineage are states of one line that only grew by appends, so the
    /// shorter is a prefix of the longer. An append keeps the lineage, even
    /// to a history a clone of which is alive, unless another history already
    /// grew from that same state (then the histories have forked, and the
    /// later one starts a new lineage). An edit ([`to_mut`](Self::to_mut),
    /// [`truncate`](Self::truncate)) starts a new lineage. A layer that keeps
    /// work per prefix (the PII layer's masked history) checks
    /// `(lineage, len)` in O(1) instead of hashing.
    pub fn lineage(&self) -> u64 {
        self.inner.lineage
    }

    /// Whether two histories share the same state (a clone, not a copy).
    pub fn ptr_eq(a: &History, b: &History) -> bool {
        Arc::ptr_eq(&a.inner, &b.inner)
    }

    /// Whether `other`'s messages are a prefix of this history's, held in
    /// the same storage: every chunk of `other` is a chunk of this history,
    /// in the same place. True after appends to a clone of `other` (which
    /// copy nothing, but for trailing chunks of `other` smaller than twice
    /// the appended messages, which are merged). O(log n), no message is
    /// compared.
    pub fn shares_prefix_with(&self, other: &History) -> bool {
        let (mine, theirs) = (&self.inner.chunks, &other.inner.chunks);
        mine.len() >= theirs.len() && theirs.iter().zip(mine).all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

impl Index<usize> for History {
    type Output = Message;

    fn index(&self, index: usize) -> &Message {
        match self.get(index) {
            Some(message) => message,
            None => panic!(
                "index out of bounds: the history has {} messages but the index is {index}",
                self.len()
            ),
        }
    }
}

impl fmt::Debug for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for History {
    fn eq(&self, other: &Self) -> bool {
        History::ptr_eq(self, other) || self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl From<Vec<Message>> for History {
    fn from(messages: Vec<Message>) -> Self {
        let chunks = if messages.is_empty() {
            Vec::new()
        } else {
            vec![Arc::new(Chunk::new(messages))]
        };
        Self {
            inner: Arc::new(Inner::with_chunks(chunks, 0, new_lineage())),
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
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl Extend<Message> for History {
    fn extend<I: IntoIterator<Item = Message>>(&mut self, iter: I) {
        let mut iter = iter.into_iter().peekable();
        if iter.peek().is_none() {
            return;
        }
        let inner = self.inner_mut(true);
        for message in iter {
            inner.push(message);
        }
    }
}

impl Serialize for History {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
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
        let three: History = history.iter().take(3).cloned().collect();
        history.digest();
        assert_eq!(history.text_len(), 5);
        let lineage = history.lineage();
        history.truncate(3);
        assert_eq!(history.len(), 3);
        assert_eq!(history.digest(), three.digest());
        assert_eq!(history.text_len(), 3);
        assert_ne!(history.lineage(), lineage);
        history.truncate(10);
        assert_eq!(history.len(), 3);
        // Cut and grown back to the same length: the whole digest is new.
        history.truncate(2);
        history.push(Message::user("other"));
        let fresh = History::from(history.to_vec());
        assert_eq!(history.digest(), fresh.digest());
        assert_ne!(history.digest(), three.digest());
    }

    #[test]
    fn lineage_follows_appends_only() {
        let mut a = History::new();
        assert_ne!(a.lineage(), History::new().lineage());
        let start = a.lineage();
        a.push(Message::user("1"));
        assert_eq!(a.lineage(), start, "an append in place keeps the lineage");
        let mut b = a.clone();
        a.push(Message::user("2"));
        assert_eq!(
            a.lineage(),
            start,
            "an append to a shared history copies nothing and keeps it"
        );
        b.push(Message::user("other"));
        assert_ne!(
            b.lineage(),
            start,
            "a second growth from one state is a fork"
        );
        let mut c = b.clone();
        c.push(Message::user("3"));
        drop(c);
        b.push(Message::user("4"));
        assert_ne!(b.lineage(), start, "growth after a gone fork still forks");
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

    #[test]
    fn appending_to_a_shared_history_copies_nothing() {
        let kept: History = (0..100_000)
            .map(|i| Message::user(format!("{i}")))
            .collect();
        let digest = kept.digest();
        let mut run = kept.clone();
        run.push(Message::user("new"));
        run.push(Message::assistant("answer"));
        assert!(run.shares_prefix_with(&kept));
        assert!(Arc::ptr_eq(&run.inner.chunks[0], &kept.inner.chunks[0]));
        assert_eq!(run.inner.chunks.len(), 2);
        assert_eq!(kept.len(), 100_000);
        assert_eq!(run.len(), 100_002);
        assert_eq!(run.lineage(), kept.lineage());
        assert_eq!(run.prefix_digest(100_000), digest);
        assert_eq!(run[100_001].text().as_ref(), "answer");
        assert_eq!(
            run.last().map(|m| m.text().to_string()).as_deref(),
            Some("answer")
        );
        let fresh = History::from(run.to_vec());
        assert_eq!(run.digest(), fresh.digest());
        assert_eq!(run.text_len(), fresh.text_len());
        assert_eq!(run, fresh);
    }

    /// Histories that continue one prefix hold it, one chunk for all of
    /// them, however they grow; an edit gathers the messages as before.
    #[test]
    fn a_continued_prefix_stays_shared() {
        let prompt = History::from(vec![Message::system("be brief")]);
        let mut run = History::continuing(&prompt, Vec::with_capacity(1));
        run.push(Message::user("hi"));
        assert_eq!(
            run.inner.chunks[1].messages.capacity(),
            1,
            "room for the input"
        );
        for i in 0..40 {
            // A clone alive at each append: the tail is shared every time.
            let held = run.clone();
            run.push(Message::assistant(format!("{i}")));
            assert!(run.shares_prefix_with(&prompt));
            drop(held);
        }
        assert!(Arc::ptr_eq(&run.inner.chunks[0], &prompt.inner.chunks[0]));
        assert_eq!(run.len(), 42);
        assert_eq!(
            run.first().map(|m| m.role),
            Some(super::super::Role::System)
        );
        let fresh = History::from(run.to_vec());
        assert_eq!(run.digest(), fresh.digest());
        assert_eq!(run.text_len(), fresh.text_len());
        assert_eq!(run, fresh);
        assert_eq!(prompt.len(), 1);

        run.truncate(1);
        assert_eq!(run.to_vec(), prompt.to_vec());
        run.push(Message::user("again"));
        assert!(run.shares_prefix_with(&prompt));
        run.to_mut().push(Message::assistant("edited"));
        assert_eq!(run.inner.chunks.len(), 1);
        assert_eq!(run.len(), 3);
        assert_eq!(prompt.len(), 1);
    }

    #[test]
    fn trailing_chunks_merge_and_iteration_crosses_them() {
        let mut history = History::from(vec![Message::user("0")]);
        let mut holders = Vec::new();
        for i in 1..1_000 {
            holders.push(history.clone());
            history.push(Message::user(format!("{i}")));
        }
        assert!(
            history.inner.chunks.len() <= 12,
            "{}",
            history.inner.chunks.len()
        );
        let texts: Vec<String> = history.iter().map(|m| m.text().to_string()).collect();
        let expected: Vec<String> = (0..1_000).map(|i| i.to_string()).collect();
        assert_eq!(texts, expected);
        let back: Vec<String> = history.iter().rev().map(|m| m.text().to_string()).collect();
        assert_eq!(back.first().map(String::as_str), Some("999"));
        assert_eq!(back.len(), 1_000);
        let mut iter = history.iter();
        assert_eq!(iter.len(), 1_000);
        iter.next();
        iter.next_back();
        assert_eq!(iter.len(), 998);
        assert_eq!(
            history.get(500).map(|m| m.text().to_string()).as_deref(),
            Some("500")
        );
        assert!(history.get(1_000).is_none());
        assert_eq!(history.digest(), History::from(history.to_vec()).digest());
        assert_eq!(holders[499].len(), 500);
        assert_eq!(holders[499].digest(), history.prefix_digest(500));
        let mut cut = history.clone();
        cut.truncate(700);
        assert_eq!(cut.len(), 700);
        assert_eq!(cut.digest(), history.prefix_digest(700));
        assert_eq!(history.len(), 1_000);
    }

    /// The digest keys shared caches: it must not move between builds, runs
    /// or machines (only with the layout's tag). Lengths of 128 bytes and
    /// more take two varint bytes.
    #[test]
    fn the_digest_is_the_same_in_every_process() {
        use crate::types::ToolCall;
        let history = History::from(vec![
            Message::user("Capital of France?"),
            Message::assistant_tool_calls(vec![ToolCall::new("c1", "lookup", r#"{"id": 7}"#)]),
            Message::tool("c1", "x".repeat(300)),
        ]);
        let hex: String = history
            .digest()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hex, "dee2f6a23c636ff4014a4179b3c69574");
    }

    #[test]
    fn serializes_as_a_plain_array() {
        let mut history = History::from(vec![Message::user("a")]);
        let _kept = history.clone();
        history.push(Message::assistant("b"));
        let json = serde_json::to_value(&history).unwrap();
        assert_eq!(json, serde_json::to_value(history.to_vec()).unwrap());
        let back: History = serde_json::from_value(json).unwrap();
        assert_eq!(back, history);
        assert_eq!(back.digest(), history.digest());
    }
}
