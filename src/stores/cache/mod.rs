//! The response cache's store: the [`CacheKey`] a response is kept under,
//! the [`CacheStore`] trait and the in-memory [`MemoryStore`]. The layer that
//! uses them is [`CacheLayer`](crate::layers::cache::CacheLayer), which
//! re-exports all three.

mod key;
mod memory;
mod reuse;
mod store;

pub use key::CacheKey;
pub(crate) use key::Keyer;
pub use memory::MemoryStore;
pub use store::CacheStore;
