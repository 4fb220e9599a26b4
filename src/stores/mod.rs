//! Stores for state a run keeps outside its process: one trait per kind of
//! state, each with an in-memory implementation that needs nothing else;
//! other implementations of the same trait share it across processes.
//!
//! | store | what it keeps | in memory |
//! | --- | --- | --- |
//! | [`CheckpointStore`] | paused runs, until one resumer takes each | [`InMemoryCheckpointStore`] |
//! | [`BudgetStore`](budget::BudgetStore) | spend reserved and settled per budget line and window | [`MemoryBudgetStore`](budget::MemoryBudgetStore) |

pub mod budget;
mod checkpoint;

pub use checkpoint::{CheckpointError, CheckpointStore, InMemoryCheckpointStore, StoredCheckpoint};
