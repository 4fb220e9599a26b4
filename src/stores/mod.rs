//! Where shared state lives: the store traits the layers draw on, their
//! in-memory implementations, and (feature `redis`) Redis implementations
//! shared by many worker processes.
//!
//! - [`cache`]: the response cache's [`CacheStore`](cache::CacheStore).
//! - [`quota`]: the rate limit's shared quota, [`QuotaStore`](quota::QuotaStore).
//! - `redis` (feature `redis`): one [`RedisConfig`](redis::RedisConfig)
//!   and a Redis store for each of the above.

pub mod cache;
pub mod quota;
#[cfg(feature = "redis")]
pub mod redis;

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
