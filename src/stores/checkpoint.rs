//! Paused runs kept until they are resumed.
//!
//! A paused run's [`Checkpoint`] is put under its run id with a version. A
//! resumer reads it, then *takes* it with the version it read: the take
//! succeeds only if nothing changed it since, and removes it, so two resumers
//! racing for one paused run can never both continue it. The loser gets
//! [`CheckpointError::Conflict`] (or [`CheckpointError::NotFound`] once the
//! winner took it).
//!
//! ```
//! use tower_agent::stores::{CheckpointError, CheckpointStore, InMemoryCheckpointStore};
//! # use tower_agent::types::{Checkpoint, Counters, Usage};
//! # fn checkpoint() -> Checkpoint {
//! #     Checkpoint { agent: "billing".into(), run_id: "run-1".into(), thread_id: None,
//! #         messages: vec![], completed: vec![], pending: vec![], iteration: 1,
//! #         usage: Usage::default(), usage_total: Usage::default(), counters: Counters::default(),
//! #         output_attempts: 0, handoff: None, approvals: vec![] }
//! # }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = InMemoryCheckpointStore::new();
//! let version = store.put(checkpoint()).await.unwrap();
//!
//! let stored = store.get("run-1").await.unwrap().unwrap();
//! assert_eq!(stored.version, version);
//! let taken = store.take("run-1", stored.version).await.unwrap();
//! assert_eq!(taken.run_id, "run-1");
//!
//! // A second resumer with the same version loses.
//! assert!(matches!(store.take("run-1", version).await, Err(CheckpointError::NotFound { .. })));
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;

use crate::error::BoxError;
use crate::types::Checkpoint;

/// A checkpoint as stored, with the version a [`take`](CheckpointStore::take)
/// must name.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredCheckpoint {
    /// The paused run.
    pub checkpoint: Checkpoint,
    /// Its version: changes every time the run id's checkpoint is put.
    pub version: u64,
}

/// Why a checkpoint could not be read or taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// No checkpoint is stored for the run (never paused, or already taken).
    #[error("no paused run `{run_id}`")]
    NotFound {
        /// The run asked for.
        run_id: String,
    },
    /// The checkpoint changed since it was read: another resumer took it, or
    /// the run paused again.
    #[error("the paused run `{run_id}` is at version {found}, not {expected}")]
    Conflict {
        /// The run asked for.
        run_id: String,
        /// The version the caller read.
        expected: u64,
        /// The version stored now.
        found: u64,
    },
    /// The store itself failed.
    #[error("checkpoint store: {0}")]
    Store(#[source] BoxError),
}

/// Where paused runs wait for their decisions. Async and object-safe, so an
/// `Arc<dyn CheckpointStore>` can sit behind a server; see the module docs.
pub trait CheckpointStore: Send + Sync + 'static {
    /// Stores `checkpoint` under its run id, replacing what was there, and
    /// answers its new version.
    fn put(&self, checkpoint: Checkpoint) -> BoxFuture<'_, Result<u64, CheckpointError>>;

    /// The checkpoint stored for `run_id`, if any.
    fn get<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredCheckpoint>, CheckpointError>>;

    /// Removes and answers the checkpoint of `run_id` if it is still at
    /// `version`.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::NotFound`] when there is none,
    /// [`CheckpointError::Conflict`] when it is at another version.
    fn take<'a>(
        &'a self,
        run_id: &'a str,
        version: u64,
    ) -> BoxFuture<'a, Result<Checkpoint, CheckpointError>>;
}

impl<T: CheckpointStore + ?Sized> CheckpointStore for Arc<T> {
    fn put(&self, checkpoint: Checkpoint) -> BoxFuture<'_, Result<u64, CheckpointError>> {
        (**self).put(checkpoint)
    }

    fn get<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredCheckpoint>, CheckpointError>> {
        (**self).get(run_id)
    }

    fn take<'a>(
        &'a self,
        run_id: &'a str,
        version: u64,
    ) -> BoxFuture<'a, Result<Checkpoint, CheckpointError>> {
        (**self).take(run_id, version)
    }
}

#[derive(Default)]
struct Table {
    next_version: u64,
    runs: HashMap<String, StoredCheckpoint>,
}

/// A [`CheckpointStore`] in this process's memory. Paused runs are lost with
/// the process.
///
/// # Clone
///
/// Clones share the same table.
#[derive(Clone, Default)]
pub struct InMemoryCheckpointStore {
    table: Arc<Mutex<Table>>,
}

impl InMemoryCheckpointStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many paused runs it holds.
    pub fn len(&self) -> usize {
        self.lock().runs.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn put_now(&self, checkpoint: Checkpoint) -> u64 {
        let mut table = self.lock();
        table.next_version += 1;
        let version = table.next_version;
        table.runs.insert(
            checkpoint.run_id.clone(),
            StoredCheckpoint {
                checkpoint,
                version,
            },
        );
        version
    }

    fn take_now(&self, run_id: &str, version: u64) -> Result<Checkpoint, CheckpointError> {
        let mut table = self.lock();
        match table.runs.get(run_id) {
            None => Err(CheckpointError::NotFound {
                run_id: run_id.to_owned(),
            }),
            Some(stored) if stored.version != version => Err(CheckpointError::Conflict {
                run_id: run_id.to_owned(),
                expected: version,
                found: stored.version,
            }),
            Some(_) => Ok(table
                .runs
                .remove(run_id)
                .map(|stored| stored.checkpoint)
                .expect("checked above under the same lock")),
        }
    }
}

impl fmt::Debug for InMemoryCheckpointStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryCheckpointStore")
            .field("runs", &self.len())
            .finish()
    }
}

impl CheckpointStore for InMemoryCheckpointStore {
    fn put(&self, checkpoint: Checkpoint) -> BoxFuture<'_, Result<u64, CheckpointError>> {
        let version = self.put_now(checkpoint);
        Box::pin(async move { Ok(version) })
    }

    fn get<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredCheckpoint>, CheckpointError>> {
        let stored = self.lock().runs.get(run_id).cloned();
        Box::pin(async move { Ok(stored) })
    }

    fn take<'a>(
        &'a self,
        run_id: &'a str,
        version: u64,
    ) -> BoxFuture<'a, Result<Checkpoint, CheckpointError>> {
        let taken = self.take_now(run_id, version);
        Box::pin(async move { taken })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Counters, Usage};

    fn checkpoint(run_id: &str) -> Checkpoint {
        Checkpoint {
            agent: "a".into(),
            run_id: run_id.into(),
            thread_id: None,
            messages: vec![],
            completed: vec![],
            pending: vec![],
            iteration: 1,
            usage: Usage::default(),
            usage_total: Usage::default(),
            counters: Counters::default(),
            output_attempts: 0,
            handoff: None,
            approvals: Vec::new(),
        }
    }

    #[tokio::test]
    async fn of_two_resumers_with_the_same_version_exactly_one_wins() {
        let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
        let version = store.put(checkpoint("r")).await.unwrap();
        let (a, b) = tokio::join!(store.take("r", version), store.take("r", version));
        assert_eq!(a.is_ok() as u8 + b.is_ok() as u8, 1);
        let loser = if a.is_ok() { b } else { a };
        assert!(matches!(loser, Err(CheckpointError::NotFound { .. })));
    }

    #[tokio::test]
    async fn a_stale_version_is_a_conflict_and_keeps_the_checkpoint() {
        let store = InMemoryCheckpointStore::new();
        let old = store.put(checkpoint("r")).await.unwrap();
        let new = store.put(checkpoint("r")).await.unwrap();
        assert_ne!(old, new);
        let err = store.take("r", old).await.unwrap_err();
        assert!(
            matches!(err, CheckpointError::Conflict { expected, found, .. } if expected == old && found == new)
        );
        assert_eq!(store.len(), 1);
        assert_eq!(store.take("r", new).await.unwrap().run_id, "r");
        assert!(store.is_empty());
    }

    #[tokio::test]
    async fn an_unknown_run_is_not_found() {
        let store = InMemoryCheckpointStore::new();
        assert!(store.get("x").await.unwrap().is_none());
        assert!(
            matches!(store.take("x", 1).await, Err(CheckpointError::NotFound { run_id }) if run_id == "x")
        );
    }
}
