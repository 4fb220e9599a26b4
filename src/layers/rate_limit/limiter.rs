//! The configuration and the keys every clone of a layer and of its
//! services shares: each key's quota ([`KeyShared`]) is found once per
//! call, and held by the call's `Waiter`, `Ticket` or `Settlement`, so
//! settling, releasing and leaving go straight to it. The first key a layer
//! sees (the only one, for a layer bound to one model) is found without the
//! map.
//!
//! A key nobody holds whose buckets are full is what a fresh key would be:
//! such idle keys leave the map when it grows past its sweep mark, so the
//! map holds the keys in use plus at most about `idle_keys` others.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::key::KeyShared;
use super::limits::{Config, EstimateFn, KeyFn, Limits};
use super::need::Need;
use super::pool::Drawn;
use super::remote::Remote;
use crate::request::ModelCall;
use crate::tokens::{request_tokens, TokenCounters};
use crate::types::ModelName;

/// The configuration and the state every clone of a layer and of its
/// services shares.
pub(super) struct Limiter {
    pub(super) default: Limits,
    pub(super) per_key: HashMap<String, Limits>,
    pub(super) max_wait: Duration,
    pub(super) fixed_key: Option<String>,
    pub(super) key_fn: Option<Arc<KeyFn>>,
    pub(super) estimate: Option<Arc<EstimateFn>>,
    pub(super) default_output_tokens: u64,
    counters: Option<TokenCounters>,
    idle_keys: usize,
    /// The quota behind a store, when the layer was given one: then the
    /// in-memory keys below are not used.
    pub(super) remote: Option<Arc<Remote>>,
    /// The first key seen, read without a lock. Set only under `keys`'
    /// lock, and never also in `keys`.
    first: OnceLock<Arc<KeyShared>>,
    /// The model name the first key was found by, when keyed by model: a
    /// call whose name shares its storage (a clone of it, as the calls of a
    /// run or of an agent have) is of the first key, with no string
    /// compared. Held, so its storage cannot be reused by another name.
    first_name: OnceLock<ModelName>,
    /// Every other key.
    keys: Mutex<Keys>,
}

/// The keys after the first, and when to sweep the idle ones out.
#[derive(Default)]
struct Keys {
    map: HashMap<Arc<str>, Arc<KeyShared>>,
    /// Sweep when the map reaches this many keys.
    sweep_at: usize,
}

impl Keys {
    /// Drops every key that only the map holds and that is idle. The next
    /// sweep comes once the map has doubled (or grown by `idle_keys`), so
    /// sweeping costs O(1) per new key.
    fn sweep(&mut self, idle_keys: usize, now: Instant) {
        self.map
            .retain(|_, shared| Arc::strong_count(shared) > 1 || !shared.is_idle(now));
        self.sweep_at = self.map.len() + self.map.len().max(idle_keys);
    }
}

impl Limiter {
    pub(super) fn new(config: Config) -> Self {
        Self {
            idle_keys: config.idle_keys.max(1),
            remote: config
                .store
                .map(|store| Arc::new(Remote::new(store, config.on_store_error, config.idle_keys))),
            default: config.default,
            per_key: config.per_key,
            max_wait: config.max_wait,
            fixed_key: config.fixed_key,
            key_fn: config.key_fn,
            estimate: config.estimate,
            default_output_tokens: config.default_output_tokens,
            counters: config.counters,
            first: OnceLock::new(),
            first_name: OnceLock::new(),
            keys: Mutex::new(Keys {
                map: HashMap::new(),
                sweep_at: config.idle_keys.max(1),
            }),
        }
    }

    /// How many keys the limiter holds, the first included.
    #[cfg(test)]
    pub(super) fn key_count(&self) -> usize {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.map.len() + usize::from(self.first.get().is_some())
    }

    /// The state of `key`, created (with full buckets) on first use.
    pub(super) fn key(&self, key: &str) -> Arc<KeyShared> {
        match self.first.get() {
            Some(first) if *first.key == *key => first.clone(),
            _ => self.key_locked(key),
        }
    }

    fn key_locked(&self, key: &str) -> Arc<KeyShared> {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        // Another thread may have set `first` since it was read.
        if let Some(first) = self.first.get().filter(|first| *first.key == *key) {
            return first.clone();
        }
        if let Some(shared) = keys.map.get(key) {
            return shared.clone();
        }
        let now = Instant::now();
        let limits = self.per_key.get(key).copied().unwrap_or(self.default);
        let shared = Arc::new(KeyShared::new(Arc::from(key), limits, now));
        if let Err(shared) = self.first.set(shared.clone()) {
            if keys.map.len() >= keys.sweep_at {
                keys.sweep(self.idle_keys, now);
            }
            keys.map.insert(shared.key.clone(), shared);
        }
        shared
    }

    /// Admits `call` from its key's lock-free pool: its key and what it
    /// drew. Otherwise its key and its tokens, for the lock to decide.
    #[inline]
    pub(super) fn draw(
        &self,
        call: &ModelCall,
    ) -> Result<(Arc<KeyShared>, Drawn), (Arc<KeyShared>, u64)> {
        let key = self.key_of(call);
        let tokens = key.tokens(self.need(call));
        match key.draw(tokens) {
            Some(drawn) => Ok((key, drawn)),
            None => Err((key, tokens)),
        }
    }

    /// The state of `call`'s key: the fixed key, the key function's, or the
    /// model.
    #[inline]
    pub(super) fn key_of(&self, call: &ModelCall) -> Arc<KeyShared> {
        if let (None, None, Some(first)) = (&self.fixed_key, &self.key_fn, self.first_of(call)) {
            return first.clone();
        }
        self.key_of_any(call)
    }

    /// The first key, if `call`'s model name shares its storage.
    #[inline]
    fn first_of(&self, call: &ModelCall) -> Option<&Arc<KeyShared>> {
        let name = self.first_name.get()?;
        let (a, b) = (name.as_str(), call.request.model.as_str());
        if std::ptr::eq(a, b) {
            self.first.get()
        } else {
            None
        }
    }

    #[inline(never)]
    fn key_of_any(&self, call: &ModelCall) -> Arc<KeyShared> {
        if let Some(key) = &self.fixed_key {
            return self.key(key);
        }
        match &self.key_fn {
            Some(f) => self.key(&f(call)),
            None => self.key_of_model(&call.request.model),
        }
    }

    /// The state of the key `model`.
    fn key_of_model(&self, model: &ModelName) -> Arc<KeyShared> {
        let key = self.key(model);
        if self.first_name.get().is_none()
            && self
                .first
                .get()
                .is_some_and(|first| Arc::ptr_eq(first, &key))
        {
            let _ = self.first_name.set(model.clone());
        }
        key
    }

    /// The name of `call`'s key, and its limits (for a store-backed quota).
    pub(super) fn name_of(&self, call: &ModelCall) -> (String, Limits) {
        let key = match (&self.fixed_key, &self.key_fn) {
            (Some(key), _) => key.clone(),
            (None, Some(f)) => f(call),
            (None, None) => call.request.model.to_string(),
        };
        let limits = self.per_key.get(&key).copied().unwrap_or(self.default);
        (key, limits)
    }

    /// The tokens `call` is expected to take: its input (counted by the
    /// model's counter, or its text at four bytes a token) plus
    /// `max_tokens` (or the default output estimate).
    pub(super) fn estimate(&self, call: &ModelCall) -> u64 {
        match self.need(call) {
            Need::Tokens(tokens) => tokens,
            Need::Text { messages, output } => {
                messages.text_len().div_ceil(4).saturating_add(output)
            }
        }
    }

    /// What [`estimate`](Self::estimate) says, or its parts when the text
    /// is to be measured.
    #[inline]
    pub(super) fn need<'a>(&self, call: &'a ModelCall) -> Need<'a> {
        let request = &call.request;
        if let Some(f) = &self.estimate {
            return Need::Tokens(f(request));
        }
        let output = request
            .settings
            .max_tokens
            .map_or(self.default_output_tokens, u64::from);
        match &self.counters {
            Some(counters) => Need::Tokens(
                request_tokens(&call.context, counters, request).saturating_add(output),
            ),
            None => Need::Text {
                messages: &request.messages,
                output,
            },
        }
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("default", &self.default)
            .field("per_key", &self.per_key)
            .field("max_wait", &self.max_wait)
            .field("fixed_key", &self.fixed_key)
            .field("default_output_tokens", &self.default_output_tokens)
            .finish_non_exhaustive()
    }
}
