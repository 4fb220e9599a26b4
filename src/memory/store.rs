//! The [`Memory`] store trait, what it keeps, and [`InProcessMemory`].

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::error::BoxError;
use crate::types::Message;

/// A point in time, in milliseconds since the Unix epoch.
pub type Timestamp = u64;

/// The current time as a [`Timestamp`] (the system clock).
pub fn now() -> Timestamp {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Where a memory item came from: the run, its thread, and the message of
/// the run's transcript it was taken from.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Provenance {
    /// The run that wrote it.
    pub run_id: String,
    /// The thread of that run, if it had one.
    pub thread_id: Option<String>,
    /// The position of the message in the run's transcript
    /// ([`AgentRun::messages`](crate::types::AgentRun::messages)), when the
    /// item names one.
    pub message: Option<u32>,
}

/// One thing remembered across runs: a fact, a preference, an instruction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryItem {
    /// The store's id for it (what [`Memory::add_items`] answered; `0`
    /// before it is stored).
    pub id: u64,
    /// Whose memory it is (an agent, a user): recall reads one namespace.
    pub namespace: String,
    /// What is remembered, as the model will read it.
    pub text: String,
    /// What kind of thing it is (`fact`, `preference`, `instruction`, ...).
    pub kind: String,
    /// Where it came from.
    pub provenance: Provenance,
    /// When it was written.
    pub created_at: Timestamp,
    /// When a recall last handed it to a run (its creation until then).
    pub last_used_at: Timestamp,
}

impl MemoryItem {
    /// An item of `kind` saying `text`, in `namespace`, written at
    /// `created_at`, not stored yet.
    pub fn new(
        namespace: impl Into<String>,
        kind: impl Into<String>,
        text: impl Into<String>,
        created_at: Timestamp,
    ) -> Self {
        Self {
            id: 0,
            namespace: namespace.into(),
            text: text.into(),
            kind: kind.into(),
            provenance: Provenance::default(),
            created_at,
            last_used_at: created_at,
        }
    }

    /// Where it came from.
    pub fn provenance(mut self, provenance: Provenance) -> Self {
        self.provenance = provenance;
        self
    }

    /// When it was last used (recency is measured from the later of this and
    /// its creation).
    pub fn last_used(&self) -> Timestamp {
        self.last_used_at.max(self.created_at)
    }
}

/// Why a memory store could not answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// The store's backend failed (the file cannot be opened, the disk is
    /// full, ...).
    #[error("the memory store failed: {0}")]
    Store(#[source] BoxError),
    /// Something stored cannot be read back (a message that is not JSON).
    #[error("the memory store holds a value it cannot read: {0}")]
    Corrupt(String),
    /// The store's file was written by a newer version of this crate.
    #[error(
        "the memory file has schema version {found}, newer than the {supported} this version reads"
    )]
    NewerSchema {
        /// The version in the file.
        found: u32,
        /// The newest version this crate knows.
        supported: u32,
    },
}

/// Memory kept across runs: each thread's messages, and memory items.
///
/// Two implementations ship: [`InProcessMemory`] (lost with the process)
/// and, with the feature `sqlite`, `SqliteMemory` (a file, shared by every
/// process that opens it). See the [module docs](super) for how a run uses
/// it.
///
/// One run per thread at a time: two runs saving the same thread at once
/// leave whichever saved last.
pub trait Memory: Send + Sync + 'static {
    /// The thread's messages, oldest first (empty for a thread never saved).
    fn load_thread<'a>(
        &'a self,
        thread: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Message>, MemoryError>>;

    /// Keeps the first `keep` messages of the thread as they are and puts
    /// `tail` after them, in place of whatever followed. `keep` larger than
    /// the thread keeps all of it.
    fn save_thread<'a>(
        &'a self,
        thread: &'a str,
        keep: usize,
        tail: &'a [Message],
    ) -> BoxFuture<'a, Result<(), MemoryError>>;

    /// Stores `items` (their `id` is ignored) and answers their new ids, in
    /// order.
    fn add_items(&self, items: Vec<MemoryItem>) -> BoxFuture<'_, Result<Vec<u64>, MemoryError>>;

    /// Every item of `namespace`, oldest first.
    fn items<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<MemoryItem>, MemoryError>>;

    /// Sets the items' `last_used_at` to `at`; unknown ids are ignored.
    fn touch<'a>(&'a self, ids: &'a [u64], at: Timestamp)
        -> BoxFuture<'a, Result<(), MemoryError>>;

    /// Removes an item; `false` if there was none with that id.
    fn remove_item(&self, id: u64) -> BoxFuture<'_, Result<bool, MemoryError>>;
}

impl<M: Memory + ?Sized> Memory for Arc<M> {
    fn load_thread<'a>(
        &'a self,
        thread: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Message>, MemoryError>> {
        (**self).load_thread(thread)
    }

    fn save_thread<'a>(
        &'a self,
        thread: &'a str,
        keep: usize,
        tail: &'a [Message],
    ) -> BoxFuture<'a, Result<(), MemoryError>> {
        (**self).save_thread(thread, keep, tail)
    }

    fn add_items(&self, items: Vec<MemoryItem>) -> BoxFuture<'_, Result<Vec<u64>, MemoryError>> {
        (**self).add_items(items)
    }

    fn items<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<MemoryItem>, MemoryError>> {
        (**self).items(namespace)
    }

    fn touch<'a>(
        &'a self,
        ids: &'a [u64],
        at: Timestamp,
    ) -> BoxFuture<'a, Result<(), MemoryError>> {
        (**self).touch(ids, at)
    }

    fn remove_item(&self, id: u64) -> BoxFuture<'_, Result<bool, MemoryError>> {
        (**self).remove_item(id)
    }
}

#[derive(Default)]
struct State {
    threads: HashMap<String, Vec<Message>>,
    items: Vec<MemoryItem>,
    next_id: u64,
}

/// A [`Memory`] in this process's memory: what tests and single-process
/// programs use. Answers at once and never fails.
///
/// ```
/// use tower_agent::memory::{InProcessMemory, Memory, MemoryItem};
/// use tower_agent::Message;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::memory::MemoryError> {
/// let memory = InProcessMemory::new();
/// memory.save_thread("t-1", 0, &[Message::user("hi"), Message::assistant("hello")]).await?;
/// memory.save_thread("t-1", 1, &[Message::assistant("hello there")]).await?;
/// assert_eq!(memory.load_thread("t-1").await?[1].text(), "hello there");
///
/// let ids = memory.add_items(vec![MemoryItem::new("support", "preference", "Metric units", 1)]).await?;
/// assert_eq!(memory.items("support").await?[0].id, ids[0]);
/// # Ok(()) }
/// ```
///
/// # Clone
///
/// Clones share the same memory.
#[derive(Clone, Default)]
pub struct InProcessMemory {
    state: Arc<Mutex<State>>,
}

impl InProcessMemory {
    /// An empty memory.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl fmt::Debug for InProcessMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with(|s| {
            f.debug_struct("InProcessMemory")
                .field("threads", &s.threads.len())
                .field("items", &s.items.len())
                .finish()
        })
    }
}

fn ready<'a, T: Send + 'a>(value: T) -> BoxFuture<'a, Result<T, MemoryError>> {
    Box::pin(std::future::ready(Ok(value)))
}

impl Memory for InProcessMemory {
    fn load_thread<'a>(
        &'a self,
        thread: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Message>, MemoryError>> {
        ready(self.with(|s| s.threads.get(thread).cloned().unwrap_or_default()))
    }

    fn save_thread<'a>(
        &'a self,
        thread: &'a str,
        keep: usize,
        tail: &'a [Message],
    ) -> BoxFuture<'a, Result<(), MemoryError>> {
        self.with(|s| {
            let messages = s.threads.entry(thread.to_owned()).or_default();
            messages.truncate(keep);
            messages.extend_from_slice(tail);
        });
        ready(())
    }

    fn add_items(&self, items: Vec<MemoryItem>) -> BoxFuture<'_, Result<Vec<u64>, MemoryError>> {
        ready(self.with(|s| {
            items
                .into_iter()
                .map(|mut item| {
                    s.next_id += 1;
                    item.id = s.next_id;
                    s.items.push(item);
                    s.next_id
                })
                .collect()
        }))
    }

    fn items<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<MemoryItem>, MemoryError>> {
        ready(self.with(|s| {
            s.items
                .iter()
                .filter(|item| item.namespace == namespace)
                .cloned()
                .collect()
        }))
    }

    fn touch<'a>(
        &'a self,
        ids: &'a [u64],
        at: Timestamp,
    ) -> BoxFuture<'a, Result<(), MemoryError>> {
        self.with(|s| {
            for item in s.items.iter_mut().filter(|item| ids.contains(&item.id)) {
                item.last_used_at = at;
            }
        });
        ready(())
    }

    fn remove_item(&self, id: u64) -> BoxFuture<'_, Result<bool, MemoryError>> {
        ready(self.with(|s| {
            let before = s.items.len();
            s.items.retain(|item| item.id != id);
            s.items.len() != before
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_thread_keeps_its_prefix_and_takes_a_new_tail() {
        let memory = InProcessMemory::new();
        assert!(memory.load_thread("t").await.unwrap().is_empty());
        let first = [
            Message::system("s"),
            Message::user("a"),
            Message::assistant("b"),
        ];
        memory.save_thread("t", 0, &first).await.unwrap();
        memory
            .save_thread("t", 2, &[Message::assistant("c"), Message::user("d")])
            .await
            .unwrap();
        let texts: Vec<String> = memory
            .load_thread("t")
            .await
            .unwrap()
            .iter()
            .map(|m| m.text().into_owned())
            .collect();
        assert_eq!(texts, ["s", "a", "c", "d"]);
        // `keep` past the end keeps everything.
        memory
            .save_thread("t", 99, &[Message::user("e")])
            .await
            .unwrap();
        assert_eq!(memory.load_thread("t").await.unwrap().len(), 5);
        assert!(memory.load_thread("other").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn items_get_ids_are_touched_and_removed_per_namespace() {
        let memory = InProcessMemory::new();
        let ids = memory
            .add_items(vec![
                MemoryItem::new("a", "fact", "one", 10),
                MemoryItem::new("b", "fact", "two", 11),
                MemoryItem::new("a", "preference", "three", 12),
            ])
            .await
            .unwrap();
        assert_eq!(ids, [1, 2, 3]);
        let a = memory.items("a").await.unwrap();
        assert_eq!(a.iter().map(|i| i.id).collect::<Vec<_>>(), [1, 3]);
        memory.touch(&[3, 42], 99).await.unwrap();
        let a = memory.items("a").await.unwrap();
        assert_eq!((a[0].last_used_at, a[1].last_used_at), (10, 99));
        assert!(memory.remove_item(1).await.unwrap());
        assert!(!memory.remove_item(1).await.unwrap());
        assert_eq!(memory.items("a").await.unwrap().len(), 1);
    }
}
