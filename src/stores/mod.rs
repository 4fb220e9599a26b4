//! Stores for state a run keeps outside its process: one trait per kind of
//! state, each with an in-memory implementation that needs nothing else.
//!
//! | store | what it keeps | in memory |
//! | --- | --- | --- |
//! | [`CheckpointStore`] | paused runs, until one resumer takes each | [`InMemoryCheckpointStore`] |

mod checkpoint;

pub use checkpoint::{CheckpointError, CheckpointStore, InMemoryCheckpointStore, StoredCheckpoint};
