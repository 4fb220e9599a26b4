//! [`RedisCacheStore`]: the response cache on Redis.

use std::time::Duration;

use futures::future::BoxFuture;
use redis::AsyncCommands;

use super::RedisConnection;
use crate::error::BoxError;
use crate::stores::cache::{CacheKey, CacheStore};
use crate::types::ModelResponse;

/// The response cache on Redis: each response under
/// `{prefix}cache:{key hex}` as compact JSON, with its time to live set on
/// the key (`SET … PX`), so Redis expires it and every process sharing the
/// server shares the hits.
///
/// A store that waits: it answers through [`CacheStore::get`] and
/// [`CacheStore::put`] (one round trip each), never `get_now`.
///
/// # Errors
///
/// Fails *open*, as the cache layer treats every store: a `get` that fails
/// (server down, connection dropped, timeout, an entry that does not
/// decode) is a miss, a failed `put` is logged and the response returned.
/// A hit counts no usage, as with the in-memory store.
///
/// ```no_run
/// use tower_agent::layers::cache::CacheLayer;
/// use tower_agent::stores::redis::{RedisCacheStore, RedisConfig};
///
/// # fn main() -> Result<(), tower_agent::AgentError> {
/// let redis = RedisConfig::new("redis://127.0.0.1:6379").connect()?;
/// let layer = CacheLayer::new().store(RedisCacheStore::new(redis));
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisCacheStore {
    redis: RedisConnection,
}

impl RedisCacheStore {
    /// A cache on `redis`.
    pub fn new(redis: RedisConnection) -> Self {
        Self { redis }
    }

    fn key(&self, key: CacheKey) -> String {
        self.redis.key("cache", &key.to_hex())
    }
}

impl CacheStore for RedisCacheStore {
    fn get(&self, key: CacheKey) -> BoxFuture<'_, Result<Option<ModelResponse>, BoxError>> {
        Box::pin(async move {
            let mut conn = self.redis.manager();
            let bytes: Option<Vec<u8>> = conn.get(self.key(key)).await?;
            match bytes {
                Some(bytes) => Ok(Some(serde_json::from_slice(&bytes)?)),
                None => Ok(None),
            }
        })
    }

    fn put(
        &self,
        key: CacheKey,
        response: ModelResponse,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<(), BoxError>> {
        Box::pin(async move {
            // Redis takes whole milliseconds; a TTL under 1 ms stores nothing.
            let millis = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
            if millis == 0 {
                return Ok(());
            }
            let bytes = serde_json::to_vec(&response)?;
            let mut conn = self.redis.manager();
            let () = conn.pset_ex(self.key(key), bytes, millis).await?;
            Ok(())
        })
    }
}
