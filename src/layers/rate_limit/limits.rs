//! Everything the layer's setters configure (the quota's [`Rate`] and
//! [`Limits`] live with the quota stores, in `stores::quota`).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::request::ModelCall;
use crate::stores::quota::QuotaStore;
pub use crate::stores::quota::{Limits, Rate};
use crate::stores::FailPolicy;
use crate::tokens::TokenCounters;
use crate::types::ModelRequest;

/// How a call's key and token estimate are found.
pub(super) type KeyFn = dyn Fn(&ModelCall) -> String + Send + Sync;
pub(super) type EstimateFn = dyn Fn(&ModelRequest) -> u64 + Send + Sync;

/// What the setters configure.
#[derive(Clone)]
pub(super) struct Config {
    pub(super) default: Limits,
    pub(super) per_key: HashMap<String, Limits>,
    pub(super) max_wait: Duration,
    pub(super) fixed_key: Option<String>,
    pub(super) key_fn: Option<Arc<KeyFn>>,
    pub(super) estimate: Option<Arc<EstimateFn>>,
    pub(super) default_output_tokens: u64,
    pub(super) counters: Option<TokenCounters>,
    pub(super) idle_keys: usize,
    pub(super) store: Option<Arc<dyn QuotaStore>>,
    pub(super) on_store_error: FailPolicy,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            default: Limits::new(),
            per_key: HashMap::new(),
            max_wait: Duration::from_secs(30),
            fixed_key: None,
            key_fn: None,
            estimate: None,
            default_output_tokens: 1024,
            counters: None,
            idle_keys: 1024,
            store: None,
            on_store_error: FailPolicy::Closed,
        }
    }
}

impl Config {
    pub(super) fn check(&self) -> Result<(), String> {
        if !self.default.is_valid() {
            return Err("rate limit: amounts and intervals must be above zero".into());
        }
        if let Some((key, _)) = self.per_key.iter().find(|(_, l)| !l.is_valid()) {
            return Err(format!(
                "rate limit of `{key}`: amounts and intervals must be above zero"
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("default", &self.default)
            .field("per_key", &self.per_key)
            .field("max_wait", &self.max_wait)
            .field("fixed_key", &self.fixed_key)
            .field("default_output_tokens", &self.default_output_tokens)
            .field("idle_keys", &self.idle_keys)
            .field("store", &self.store.is_some())
            .field("on_store_error", &self.on_store_error)
            .finish_non_exhaustive()
    }
}
