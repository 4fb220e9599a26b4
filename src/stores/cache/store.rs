//! Where cached responses live: the [`CacheStore`] trait.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::CacheKey;
use crate::error::BoxError;
use crate::types::ModelResponse;

/// A store of cached model responses, each kept for a time to live.
///
/// Object-safe: the [`CacheLayer`](crate::layers::cache::CacheLayer) holds it as
/// `Arc<dyn CacheStore>`, so one store serves every clone of the layer and
/// every agent built with it. [`MemoryStore`](super::MemoryStore) is the
/// in-memory one; a store shared by many processes (Redis, …) keys on
/// [`CacheKey::to_hex`] and serializes the response (it is
/// `Serialize`/`Deserialize`).
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

    /// What [`get`](Self::get) would answer, when the store can answer at
    /// once without waiting (an in-memory store); `None` (the default) when
    /// it must wait. The cache layer then asks and calls the model without
    /// a boxed future.
    fn get_now(&self, key: CacheKey) -> Option<Result<Option<ModelResponse>, BoxError>> {
        let _ = key;
        None
    }

    /// Stores a copy of `response` at once, as [`put`](Self::put) would,
    /// when the store can; `None` (the default) when it must wait.
    fn put_now(
        &self,
        key: CacheKey,
        response: &ModelResponse,
        ttl: Duration,
    ) -> Option<Result<(), BoxError>> {
        let _ = (key, response, ttl);
        None
    }
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

    fn get_now(&self, key: CacheKey) -> Option<Result<Option<ModelResponse>, BoxError>> {
        (**self).get_now(key)
    }

    fn put_now(
        &self,
        key: CacheKey,
        response: &ModelResponse,
        ttl: Duration,
    ) -> Option<Result<(), BoxError>> {
        (**self).put_now(key, response, ttl)
    }
}
