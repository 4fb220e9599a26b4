//! Memory across runs: each thread's messages, and memory items (facts,
//! preferences, instructions) that later runs recall.
//!
//! | piece | what it does |
//! | --- | --- |
//! | [`Memory`] | the store trait: a thread's messages, memory items with their [`Provenance`] and times |
//! | [`InProcessMemory`] | the store in this process's memory |
//! | `SqliteMemory` (feature `sqlite`) | the store in a SQLite file, created on first use, migrations versioned; shared by every process that opens it |
//! | [`Retriever`], [`KeywordRetriever`] | which items a run recalls: BM25 keyword relevance blended with recency by default |
//! | [`memory_context`] | the `<memory_context>` block recalled items go in |
//!
//! A run uses them through
//! [`MemoryMiddleware`](crate::lifecycle::builtin::MemoryMiddleware): it
//! loads the run's thread (the [`RunContext`](crate::RunContext)'s
//! `thread_id`), recalls items relevant to the input into a
//! `<memory_context>` block in front of the first turn, saves the thread
//! once the run is done, then has a model extract new items and compacts
//! a long thread.
//!
//! ```
//! use tower_agent::memory::{InProcessMemory, KeywordRetriever, Memory, MemoryItem, RecallQuery, Retriever};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::memory::MemoryError> {
//! let memory = InProcessMemory::new();
//! memory
//!     .add_items(vec![
//!         MemoryItem::new("support", "preference", "The user wants metric units", 1),
//!         MemoryItem::new("support", "fact", "The user's order 1234 shipped on Monday", 2),
//!     ])
//!     .await?;
//! let query = RecallQuery { namespace: "support", text: "Where is order 1234?", limit: 3, now: 3 };
//! let recalled = KeywordRetriever::new().retrieve(&memory, query).await?;
//! assert_eq!(recalled.len(), 1);
//! assert!(recalled[0].text.contains("1234"));
//! # Ok(()) }
//! ```

mod retrieve;
#[cfg(feature = "sqlite")]
mod sqlite;
mod store;

pub use retrieve::{
    memory_context, rank, words, AllItems, KeywordRetriever, RecallQuery, Retriever,
};
#[cfg(feature = "sqlite")]
pub use sqlite::{file_schema_version, SqliteMemory, SCHEMA_VERSION};
pub use store::{now, InProcessMemory, Memory, MemoryError, MemoryItem, Provenance, Timestamp};
