//! Where cached responses live: the [`CacheStore`] trait and the in-memory
//! [`MemoryStore`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::CacheKey;
use crate::error::BoxError;
use crate::types::ModelResponse;

/// A store of cached model responses, each kept for a time to live.
///
/// Object-safe: the [`CacheLayer`](super::CacheLayer) holds it as
/// `Arc<dyn CacheStore>`, so one store serves every clone of the layer and
/// every agent built with it. [`MemoryStore`] is the in-memory one; a store
/// shared by many processes (Redis, …) keys on [`CacheKey::to_hex`] and
/// serializes the response (it is `Serialize`/`Deserialize`).
///
/// # Errors
///
/// A store may fail (a network store is down). The cache layer is
/// *fail-open*: a failed `get` is a miss, a failed `put` is logged with
/// `tracing` and the response is returned all the same.
///
/// ```
/// use std::time::Duration;
/// use futures::future::BoxFuture;
/// use tower_agent::layers::cache::{CacheKey, CacheStore};
/// use tower_agent::types::ModelResponse;
/// use tower_agent::BoxError;
///
/// /// A store that keeps nothing: every call is a miss.
/// struct Nowhere;
///
/// impl CacheStore for Nowhere {
///     fn get(&self, _key: CacheKey) -> BoxFuture<'_, Result<Option<ModelResponse>, BoxError>> {
///         Box::pin(async { Ok(None) })
///     }
///
///     fn put(&self, _key: CacheKey, _response: ModelResponse, _ttl: Duration)
///         -> BoxFuture<'_, Result<(), BoxError>> {
///         Box::pin(async { Ok(()) })
///     }
/// }
/// ```
pub trait CacheStore: Send + Sync + 'static {
    /// The response stored under `key`, if there is one that has not
    /// expired.
    fn get(&self, key: CacheKey) -> BoxFuture<'_, Result<Option<ModelResponse>, BoxError>>;

    /// Stores `response` under `key` for `ttl`, replacing what was there.
    fn put(
        &self,
        key: CacheKey,
        response: ModelResponse,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<(), BoxError>>;
}

impl<T: CacheStore + ?Sized> CacheStore for Arc<T> {
    fn get(&self, key: CacheKey) -> BoxFuture<'_, Result<Option<ModelResponse>, BoxError>> {
        (**self).get(key)
    }

    fn put(
        &self,
        key: CacheKey,
        response: ModelResponse,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<(), BoxError>> {
        (**self).put(key, response, ttl)
    }
}

/// Longer times to live are cut to this (a century): `Instant` arithmetic
/// must not overflow.
const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 86_400);

struct Entry {
    response: ModelResponse,
    ttl: Duration,
    /// On tokio's clock, so expiry follows a paused test clock too.
    expires_at: Instant,
}

/// Lets moka drop each entry when its own time to live has passed.
struct PerEntryTtl;

impl moka::Expiry<CacheKey, Arc<Entry>> for PerEntryTtl {
    fn expire_after_create(
        &self,
        _key: &CacheKey,
        entry: &Arc<Entry>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(entry.ttl)
    }

    fn expire_after_update(
        &self,
        _key: &CacheKey,
        entry: &Arc<Entry>,
        _updated_at: std::time::Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(entry.ttl)
    }
}

/// The in-memory [`CacheStore`]: at most `max_entries` responses, each
/// dropped after its time to live, on a
/// [`moka::future::Cache`](https://docs.rs/moka) (TinyLFU admission, LRU
/// eviction).
///
/// Expiry is checked on tokio's clock when an entry is read, so a paused test
/// clock expires entries; moka also drops expired entries on its own to free
/// memory.
///
/// # Clone
///
/// Clones share the same entries.
///
/// ```
/// use std::time::Duration;
/// use tower_agent::layers::cache::{CacheKey, CacheStore, MemoryStore};
/// use tower_agent::types::{Message, ModelRequest, ModelResponse};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryStore::new(1_000);
/// let key = CacheKey::of(&ModelRequest::new("m", vec![Message::user("hi")]));
/// let response = ModelResponse::new("m", Message::assistant("hello"));
/// store.put(key, response.clone(), Duration::from_secs(60)).await.unwrap();
/// assert_eq!(store.get(key).await.unwrap(), Some(response));
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    entries: moka::future::Cache<CacheKey, Arc<Entry>>,
}

impl MemoryStore {
    /// A store holding at most `max_entries` responses.
    pub fn new(max_entries: u64) -> Self {
        Self {
            entries: moka::future::Cache::builder()
                .max_capacity(max_entries)
                .expire_after(PerEntryTtl)
                .build(),
        }
    }

    /// How many entries are held. Approximate until
    /// [`run_pending_tasks`](Self::run_pending_tasks) has applied pending
    /// evictions.
    pub fn entry_count(&self) -> u64 {
        self.entries.entry_count()
    }

    /// Applies pending evictions and expirations now (moka otherwise does
    /// it in the background of later calls).
    pub async fn run_pending_tasks(&self) {
        self.entries.run_pending_tasks().await;
    }

    /// Drops every entry.
    pub fn clear(&self) {
        self.entries.invalidate_all();
    }
}

impl Default for MemoryStore {
    /// A store of 10,000 entries.
    fn default() -> Self {
        Self::new(10_000)
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("entries", &self.entries.entry_count())
            .field("max_entries", &self.entries.policy().max_capacity())
            .finish()
    }
}

impl CacheStore for MemoryStore {
    fn get(&self, key: CacheKey) -> BoxFuture<'_, Result<Option<ModelResponse>, BoxError>> {
        Box::pin(async move {
            let Some(entry) = self.entries.get(&key).await else {
                return Ok(None);
            };
            if entry.expires_at <= Instant::now() {
                self.entries.invalidate(&key).await;
                return Ok(None);
            }
            Ok(Some(entry.response.clone()))
        })
    }

    fn put(
        &self,
        key: CacheKey,
        response: ModelResponse,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<(), BoxError>> {
        Box::pin(async move {
            if ttl.is_zero() {
                return Ok(());
            }
            let ttl = ttl.min(MAX_TTL);
            let expires_at = Instant::now() + ttl;
            let entry = Entry {
                response,
                ttl,
                expires_at,
            };
            self.entries.insert(key, Arc::new(entry)).await;
            Ok(())
        })
    }
}
