//! Stores on Redis, shared by every worker process that points at the same
//! server: the response cache ([`RedisCacheStore`]), the rate limit's
//! quota ([`RedisQuotaStore`]), the budget ledger ([`RedisBudgetStore`])
//! and paused runs ([`RedisCheckpointStore`]).
//!
//! One [`RedisConfig`] (URL, key prefix, timeouts) makes one
//! [`RedisConnection`], a cheap `Clone` handle on redis-rs's
//! [`redis::aio::ConnectionManager`]: one multiplexed
//! connection that reconnects on its own after the server restarts or the
//! connection drops. Every store made from it puts its keys under the
//! config's prefix (default `tower-agent:`), so several deployments can share
//! one server.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_agent::stores::redis::{RedisCacheStore, RedisConfig, RedisQuotaStore};
//!
//! # fn main() -> Result<(), tower_agent::AgentError> {
//! let redis = RedisConfig::new("redis://127.0.0.1:6379")
//!     .prefix("my-app:")
//!     .response_timeout(Duration::from_millis(500))
//!     .connect()?;
//! let cache = RedisCacheStore::new(redis.clone());
//! let quota = RedisQuotaStore::new(redis);
//! # let _ = (cache, quota); Ok(()) }
//! ```
//!
//! # Faults
//!
//! A call made while the server is down, or on a connection that drops
//! mid-call, fails with that call's error after the response timeout; the
//! manager reconnects in the background and a later call goes through.
//! What a failure means is each store's policy: the cache fails *open* (a
//! miss; nothing is stored), the quota fails *closed* by default
//! ([`FailPolicy`]), the budget ledger's error goes to the budget layer's
//! fail setting, and a checkpoint that cannot be written fails the pause
//! with [`CheckpointError::Store`](crate::stores::CheckpointError::Store).

mod budget;
mod cache;
mod checkpoint;
mod quota;

pub use budget::RedisBudgetStore;
pub use cache::RedisCacheStore;
pub use checkpoint::RedisCheckpointStore;
pub use quota::RedisQuotaStore;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::error::AgentError;
pub use crate::stores::FailPolicy;

/// How to reach Redis, and where the stores' keys live.
///
/// ```
/// use std::time::Duration;
/// use tower_agent::stores::redis::RedisConfig;
///
/// let config = RedisConfig::new("redis://127.0.0.1:6379/0")
///     .prefix("staging:")
///     .connect_timeout(Duration::from_secs(1));
/// assert_eq!(config.key_prefix(), "staging:");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    url: String,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    reconnect_retries: usize,
}

impl RedisConfig {
    /// The server at `url` (`redis://[:password@]host[:port][/db]`, or
    /// `rediss://` when redis-rs is built with TLS), keys under
    /// `tower-agent:`, 1 s to connect, 1 s for each answer, 2 reconnection
    /// attempts per failed call.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            prefix: "tower-agent:".to_owned(),
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            reconnect_retries: 2,
        }
    }

    /// Every key the stores write starts with `prefix`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one connection attempt may take.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one command may wait for its answer before it fails.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How many times the manager tries to reconnect (with exponential
    /// backoff from 100 ms) before the call that found the connection
    /// broken fails.
    pub fn reconnect_retries(mut self, retries: usize) -> Self {
        self.reconnect_retries = retries;
        self
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The connection handle. It connects on first use (no server needs to
    /// be up yet), and reconnects on its own.
    ///
    /// # Errors
    ///
    /// [`AgentError::Config`] if the URL cannot be parsed.
    pub fn connect(&self) -> Result<RedisConnection, AgentError> {
        let client = redis::Client::open(self.url.as_str())
            .map_err(|e| AgentError::Config(format!("redis url: {e}")))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(self.reconnect_retries)
            .set_max_delay(Duration::from_secs(1));
        let manager = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| AgentError::Config(format!("redis: {e}")))?;
        Ok(RedisConnection {
            manager,
            prefix: Arc::from(self.prefix.as_str()),
        })
    }
}

impl fmt::Debug for RedisConfig {
    /// The URL is left out: it may hold a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("reconnect_retries", &self.reconnect_retries)
            .finish_non_exhaustive()
    }
}

/// A connection to Redis shared by the stores: a cheap `Clone` (clones share
/// one multiplexed connection) that reconnects on its own. Made by
/// [`RedisConfig::connect`].
#[derive(Clone)]
pub struct RedisConnection {
    manager: ConnectionManager,
    prefix: Arc<str>,
}

impl RedisConnection {
    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// `prefix` + `kind` + `:` + `name`.
    pub(crate) fn key(&self, kind: &str, name: &str) -> String {
        let mut key = String::with_capacity(self.prefix.len() + kind.len() + 1 + name.len());
        key.push_str(&self.prefix);
        key.push_str(kind);
        key.push(':');
        key.push_str(name);
        key
    }

    /// A handle to send commands on.
    pub(crate) fn manager(&self) -> ConnectionManager {
        self.manager.clone()
    }
}

impl fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConnection")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}
