//! Stores for state a run keeps outside its process: one trait per kind of
//! state, each with an in-memory implementation that needs nothing else;
//! other implementations of the same trait share it across processes (with
//! the feature `redis`, on Redis: see [`redis`](self#redis)).
//!
//! | store | what it keeps | in memory |
//! | --- | --- | --- |
//! | [`CheckpointStore`] | paused runs, until one resumer takes each | [`InMemoryCheckpointStore`] |
//! | [`BudgetStore`](budget::BudgetStore) | spend reserved and settled per budget line and window | [`MemoryBudgetStore`](budget::MemoryBudgetStore) |
//! | [`CacheStore`](cache::CacheStore) | the response cache's entries, each with a time to live | [`MemoryStore`](cache::MemoryStore) |
//! | [`QuotaStore`](quota::QuotaStore) | the rate limit's requests and tokens per key | [`MemoryQuotaStore`](quota::MemoryQuotaStore) |
//!
//! # Redis
//!
//! With the feature `redis`, the `redis` module has one
//! `RedisConfig` (URL, key prefix, timeouts) and a Redis store for each
//! trait above, shared by every worker process on the same server.

pub mod budget;
pub mod cache;
mod checkpoint;
pub mod quota;
#[cfg(feature = "redis")]
pub mod redis;

use crate::context::RunContext;
use crate::event::AgentEvent;

pub use checkpoint::{CheckpointError, CheckpointStore, InMemoryCheckpointStore, StoredCheckpoint};

/// What a store-backed layer does when its store cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailPolicy {
    /// Refuse: the call fails with the store's error (the default for a
    /// quota: an unreachable quota must not let every worker spend freely).
    #[default]
    Closed,
    /// Let the call through as if the store had said yes (logged with
    /// `tracing` at `warn`).
    Open,
}

/// Reports that a store failed: a `tracing` warning and an
/// [`AgentEvent::StoreFailed`] in the run's events, from one place.
pub(crate) fn report_failure(
    ctx: &RunContext,
    store: &'static str,
    operation: &'static str,
    error: &dyn std::fmt::Display,
    failed_open: bool,
) {
    let outcome = if failed_open {
        "going on without it (fail open)"
    } else {
        "failing the call (fail closed)"
    };
    tracing::warn!(run_id = %ctx.run_id(), store, operation, %error, "{store} store failed to {operation}; {outcome}");
    ctx.emit(|| AgentEvent::StoreFailed {
        run_id: ctx.run_id().clone(),
        store,
        operation,
        error: error.to_string(),
        failed_open,
    });
}
