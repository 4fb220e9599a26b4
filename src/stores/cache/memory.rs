//! The in-memory [`CacheStore`]: [`MemoryStore`], sharded maps with CLOCK
//! eviction.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use hashbrown::HashTable;
use tokio::time::Instant;

use super::reuse::Fill;
use super::{CacheKey, CacheStore};
use crate::error::BoxError;
use crate::types::ModelResponse;

/// Longer times to live are cut to this (a century): `Instant` arithmetic
/// must not overflow.
const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The fewest entries a shard is made for: a small store has fewer shards.
const MIN_SHARD: u64 = 32;

/// The most entries a shard's index and slots are made for up front.
const PREALLOCATED: usize = 4096;

/// The in-memory [`CacheStore`]: at most `max_entries` responses, each
/// served until its time to live has passed.
///
/// The entries are spread over shards by key, each a map behind its own
/// lock. A full shard evicts by CLOCK (second chance): the entry stored
/// longest ago leaves first, unless it was read since the eviction last
/// passed it, in which case it goes back to the end of the line once.
///
/// Expiry is checked on tokio's clock when an entry is read, so a paused test
/// clock expires entries; an expired entry is removed when it is read, or
/// evicted like any other when the store is full, so memory stays bounded by
/// `max_entries`.
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
    shards: Arc<[Mutex<Shard>]>,
}

/// A stored response and its key.
struct Slot {
    key: CacheKey,
    response: ModelResponse,
    /// On tokio's clock, so expiry follows a paused test clock too.
    expires_at: Instant,
    /// Read since the clock's hand last passed it: it gets a second chance.
    referenced: bool,
}

/// One lock's share of the entries: the slots in a ring the clock's hand
/// goes round, and where each key's slot is.
///
/// An insert into a full shard reuses the slot it evicts, in place: the
/// hand moves through the ring in order, so the memory it touches is the
/// next slot along, not one scattered anywhere. The index holds slot
/// numbers only (4 bytes each, so a shard's index stays in cache); a key is
/// compared with the key in its slot.
struct Shard {
    index: HashTable<u32>,
    /// Filled up to `capacity`; `None` where an expired entry was removed.
    slots: Vec<Option<Slot>>,
    /// The emptied slots (every `None` of `slots`), used before any is
    /// evicted.
    free: Vec<u32>,
    /// The next slot the clock's hand looks at.
    hand: usize,
    capacity: usize,
}

/// A [`CacheKey`] is a uniform hash already: its low 64 bits are the
/// index's hash as they come.
#[inline]
fn hash(key: &CacheKey) -> u64 {
    let bytes = key.as_bytes();
    u64::from_le_bytes([
        bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
    ])
}

/// The hash of the key in slot `at`, which is full.
#[inline]
fn hash_of(slots: &[Option<Slot>], at: u32) -> u64 {
    slots[at as usize]
        .as_ref()
        .map_or(0, |slot| hash(&slot.key))
}

impl Shard {
    fn new(capacity: usize) -> Self {
        // Slot numbers are `u32`: a shard holds fewer.
        let capacity = capacity.clamp(1, u32::MAX as usize);
        // Both made for the whole shard up to a size, so a filling shard
        // neither rehashes its index (each rehash reading every key) nor
        // copies its slots; the slots' pages are touched only as they fill.
        // The index has twice the room: at a third full or less, the key
        // an eviction removes mostly leaves an empty bucket, not a
        // tombstone, and a full shard seldom rehashes its tombstones away.
        let made = capacity.min(PREALLOCATED);
        Self {
            index: HashTable::with_capacity(2 * made),
            slots: Vec::with_capacity(made),
            free: Vec::new(),
            hand: 0,
            capacity,
        }
    }

    /// The number of the slot holding `key`.
    #[inline]
    fn find(&self, key: CacheKey) -> Option<u32> {
        let slots = &self.slots;
        let holds = |&at: &u32| slots[at as usize].as_ref().is_some_and(|s| s.key == key);
        self.index.find(hash(&key), holds).copied()
    }

    /// The response under `key` if it has not expired; an expired one is
    /// removed.
    #[inline]
    fn get(&mut self, key: CacheKey) -> Option<ModelResponse> {
        let at = self.find(key)?;
        let held = &mut self.slots[at as usize];
        let slot = held.as_mut()?;
        if slot.expires_at <= Instant::now() {
            *held = None;
            self.unindex(key, at);
            self.free.push(at);
            return None;
        }
        slot.referenced = true;
        Some(slot.response.clone())
    }

    /// Stores `response` under `key`, replacing what was there (which keeps
    /// its slot). An insert into a full shard copies a borrowed response
    /// into the evicted one's buffers.
    #[inline]
    fn insert(&mut self, key: CacheKey, response: impl Fill, expires_at: Instant) {
        if let Some(at) = self.find(key) {
            if let Some(slot) = &mut self.slots[at as usize] {
                response.fill(&mut slot.response);
                slot.expires_at = expires_at;
                return;
            }
        }
        let at = match self.free.pop() {
            Some(at) => at as usize,
            None if self.slots.len() < self.capacity => self.grow(),
            None => self.evict(),
        };
        match &mut self.slots[at] {
            Some(slot) => {
                response.fill(&mut slot.response);
                slot.key = key;
                slot.expires_at = expires_at;
                slot.referenced = false;
            }
            empty => {
                *empty = Some(Slot {
                    key,
                    response: response.make(),
                    expires_at,
                    referenced: false,
                });
            }
        }
        let slots = &self.slots;
        self.index
            .insert_unique(hash(&key), at as u32, |&at| hash_of(slots, at));
    }

    /// Takes slot `at`, which held `key`, out of the index.
    #[inline]
    fn unindex(&mut self, key: CacheKey, at: u32) {
        if let Ok(entry) = self.index.find_entry(hash(&key), |&held| held == at) {
            entry.remove();
        }
    }

    /// A new empty slot at the end of the ring, which grows (past what it
    /// was made for) by doubling up to `capacity` and no further.
    fn grow(&mut self) -> usize {
        let len = self.slots.len();
        if len == self.slots.capacity() {
            self.slots
                .reserve_exact(len.max(4).min(self.capacity - len));
        }
        self.slots.push(None);
        len
    }

    /// Takes the slot the clock's hand stops at (the next one not read
    /// since the hand last passed it, clearing the marks of those it
    /// passes) out of the index and returns it, its response left in place
    /// for the next to overwrite. Every slot is full: there is none free.
    fn evict(&mut self) -> usize {
        loop {
            let at = self.hand;
            self.hand = if at + 1 == self.slots.len() {
                0
            } else {
                at + 1
            };
            let held = &mut self.slots[at];
            match held {
                Some(slot) if slot.referenced => slot.referenced = false,
                Some(slot) => {
                    let key = slot.key;
                    self.unindex(key, at as u32);
                    return at;
                }
                None => return at,
            }
        }
    }

    fn clear(&mut self) {
        *self = Self::new(self.capacity);
    }
}

impl MemoryStore {
    /// A store holding at most `max_entries` responses.
    pub fn new(max_entries: u64) -> Self {
        let max_entries = max_entries.max(1);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let mut count = (cores * 4).next_power_of_two();
        while count > 1 && max_entries / count < MIN_SHARD {
            count /= 2;
        }
        // The capacity spread exactly: the shards sum to `max_entries`.
        let (each, rest) = (max_entries / count, max_entries % count);
        let shards = (0..count)
            .map(|i| {
                let capacity = each + u64::from(i < rest);
                Mutex::new(Shard::new(usize::try_from(capacity).unwrap_or(usize::MAX)))
            })
            .collect();
        Self { shards }
    }

    /// How many entries are held (expired ones not yet read or evicted
    /// included).
    pub fn entry_count(&self) -> u64 {
        (0..self.shards.len())
            .map(|i| self.lock(i).index.len() as u64)
            .sum()
    }

    /// Drops every entry.
    pub fn clear(&self) {
        for i in 0..self.shards.len() {
            let mut shard = self.lock(i);
            shard.clear();
        }
    }

    fn max_entries(&self) -> u64 {
        (0..self.shards.len())
            .map(|i| self.lock(i).capacity as u64)
            .sum()
    }

    fn lock(&self, index: usize) -> MutexGuard<'_, Shard> {
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The shard of `key`, by bits the maps' hash does not use.
    #[inline]
    fn shard(&self, key: CacheKey) -> MutexGuard<'_, Shard> {
        let high = (u128::from_le_bytes(*key.as_bytes()) >> 64) as usize;
        self.lock(high & (self.shards.len() - 1))
    }

    /// The response under `key`, if one is there that has not expired.
    #[inline]
    pub(crate) fn lookup(&self, key: CacheKey) -> Option<ModelResponse> {
        self.shard(key).get(key)
    }

    /// Stores `response` under `key` for `ttl`.
    #[inline]
    pub(crate) fn store(&self, key: CacheKey, response: impl Fill, ttl: Duration) {
        if let Some(expires_at) = expiry(ttl) {
            self.shard(key).insert(key, response, expires_at);
        }
    }
}

/// When an entry stored now for `ttl` expires; `None` for a zero `ttl`, which
/// stores nothing.
#[inline]
fn expiry(ttl: Duration) -> Option<Instant> {
    (!ttl.is_zero()).then(|| Instant::now() + ttl.min(MAX_TTL))
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
            .field("entries", &self.entry_count())
            .field("max_entries", &self.max_entries())
            .finish()
    }
}

impl CacheStore for MemoryStore {
    fn get(&self, key: CacheKey) -> BoxFuture<'_, Result<Option<ModelResponse>, BoxError>> {
        Box::pin(async move { Ok(self.lookup(key)) })
    }

    fn put(
        &self,
        key: CacheKey,
        response: ModelResponse,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<(), BoxError>> {
        Box::pin(async move {
            self.store(key, response, ttl);
            Ok(())
        })
    }

    fn get_now(&self, key: CacheKey) -> Option<Result<Option<ModelResponse>, BoxError>> {
        Some(Ok(self.lookup(key)))
    }

    fn put_now(
        &self,
        key: CacheKey,
        response: &ModelResponse,
        ttl: Duration,
    ) -> Option<Result<(), BoxError>> {
        self.store(key, response, ttl);
        Some(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Message, ModelRequest};

    fn key(n: u32) -> CacheKey {
        CacheKey::of(&ModelRequest::new("m", vec![Message::user(format!("{n}"))]))
    }

    fn response(n: u32) -> ModelResponse {
        ModelResponse::new("m", Message::assistant(format!("{n}")))
    }

    fn text(store: &MemoryStore, n: u32) -> Option<String> {
        store.lookup(key(n)).map(|r| r.message.text().into_owned())
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[tokio::test(start_paused = true)]
    async fn a_full_shard_evicts_the_oldest_unread_entry() {
        let store = MemoryStore::new(3);
        assert_eq!(store.shards.len(), 1);
        for n in 0..3 {
            store.store(key(n), response(n), HOUR);
        }
        // 0 is read: it gets a second chance, and 1 leaves instead.
        assert_eq!(text(&store, 0).as_deref(), Some("0"));
        store.store(key(3), response(3), HOUR);
        assert_eq!(store.entry_count(), 3);
        assert_eq!(text(&store, 1), None);
        // 0's chance is spent once the hand passed it: 2 is next, then 0.
        store.store(key(4), response(4), HOUR);
        assert_eq!(text(&store, 2), None);
        store.store(key(5), response(5), HOUR);
        assert_eq!(text(&store, 0), None);
        for n in [3, 4, 5] {
            assert!(text(&store, n).is_some(), "{n} is held");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_replaced_entry_keeps_its_place_and_an_expired_one_leaves() {
        let store = MemoryStore::new(2);
        store.store(key(0), response(0), HOUR);
        store.store(key(1), response(1), Duration::from_secs(1));
        store.store(key(0), response(10), HOUR);
        assert_eq!(store.entry_count(), 2);
        let held = |n| {
            let shard = store.lock(0);
            let at = shard.find(key(n))?;
            let slot = shard.slots[at as usize].as_ref()?;
            Some(slot.response.message.text().into_owned())
        };
        assert_eq!(held(0).as_deref(), Some("10"));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(text(&store, 1), None, "expired");
        assert_eq!(store.entry_count(), 1);
        // A new insert of the removed key takes the emptied slot. The
        // replaced 0 kept its slot, the first on the hand's way: it leaves
        // first.
        store.store(key(1), response(11), HOUR);
        store.store(key(2), response(2), HOUR);
        assert_eq!(store.entry_count(), 2);
        assert_eq!(held(0), None);
        assert_eq!(held(1).as_deref(), Some("11"));
        assert_eq!(held(2).as_deref(), Some("2"));
    }

    #[tokio::test(start_paused = true)]
    async fn emptied_slots_are_used_again() {
        let store = MemoryStore::new(4);
        for round in 0..100 {
            store.store(key(round % 8), response(round), Duration::from_secs(1));
            if round % 3 == 0 {
                tokio::time::advance(Duration::from_secs(1)).await;
                assert_eq!(text(&store, round % 8), None);
            }
            let shard = store.lock(0);
            assert!(shard.slots.len() <= shard.capacity);
            assert_eq!(shard.index.len() + shard.free.len(), shard.slots.len());
        }
    }

    #[test]
    fn the_shards_hold_max_entries_in_all() {
        for max in [1, 31, 32, 100, 10_000, 10_007] {
            let store = MemoryStore::new(max);
            assert_eq!(store.max_entries(), max);
            assert!(store.shards.len().is_power_of_two());
        }
        assert_eq!(MemoryStore::new(0).max_entries(), 1);
    }
}
