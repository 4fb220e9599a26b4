//! The cache key: a stable SHA-256 of what decides a model's answer.

use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use sha2::{Digest, Sha256};

use crate::types::{ModelRequest, ModelSettings, ToolSpec};

/// Changes when the key's layout changes, so old entries of a shared store
/// are never read as new ones.
const VERSION: &[u8] = b"tower-agent/cache/v1\0";

/// The key a response is cached under: a SHA-256 of the request's model
/// name, messages, tools and settings. See the [cache layer](crate::layers::cache).
///
/// Equal requests have equal keys, in every process and across restarts (the
/// parts are hashed as their wire JSON), so a shared store (Redis, …) can be
/// keyed on [`to_hex`](Self::to_hex). A change in any part gives another key.
///
/// Computing it costs O(messages added since the history's digest was last
/// asked for), not O(history): [`History::digest`](crate::types::History::digest)
/// is an incremental prefix chain.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheKey([u8; 32]);

impl CacheKey {
    /// The key of `request`.
    pub fn of(request: &ModelRequest) -> CacheKey {
        compose(request, &tools_digest(&request.tools))
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The key as 64 lowercase hex digits, for stores keyed on strings.
    pub fn to_hex(&self) -> String {
        use fmt::Write;
        let mut hex = String::with_capacity(64);
        for byte in self.0 {
            let _ = write!(hex, "{byte:02x}");
        }
        hex
    }
}

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CacheKey({})", &self.to_hex()[..16])
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Feeds serde_json's output straight into a hasher: no buffer.
struct HashWriter<'a>(&'a mut Sha256);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn tools_digest(tools: &[ToolSpec]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    // Serializing plain data into a hasher cannot fail.
    let _ = serde_json::to_writer(HashWriter(&mut hasher), tools);
    hasher.finalize().into()
}

fn settings_digest(hasher: &mut Sha256, settings: &ModelSettings) {
    let _ = serde_json::to_writer(HashWriter(hasher), settings);
}

/// Every part is length-prefixed or fixed-size, so no two different requests
/// feed the hasher the same bytes.
fn compose(request: &ModelRequest, tools: &[u8; 32]) -> CacheKey {
    let mut hasher = Sha256::new();
    hasher.update(VERSION);
    hasher.update((request.model.len() as u64).to_le_bytes());
    hasher.update(request.model.as_bytes());
    hasher.update((request.messages.len() as u64).to_le_bytes());
    hasher.update(request.messages.digest());
    hasher.update(tools);
    // Last, so its length needs no prefix.
    settings_digest(&mut hasher, &request.settings);
    CacheKey(hasher.finalize().into())
}

/// A tool list and its digest.
type SeenTools = (Arc<[ToolSpec]>, [u8; 32]);

/// Computes keys for one cache layer, remembering the digest of the last
/// tool list it saw: an agent sends the same `Arc<[ToolSpec]>` every turn,
/// so its schemas are hashed once, not once per turn.
#[derive(Default)]
pub(crate) struct Keyer {
    /// Holding the `Arc` keeps its address from being reused by another list.
    last_tools: Mutex<Option<SeenTools>>,
}

impl Keyer {
    pub(crate) fn key(&self, request: &ModelRequest) -> CacheKey {
        if request.tools.is_empty() {
            // Requests without tools each bring their own empty list.
            static NONE: LazyLock<[u8; 32]> = LazyLock::new(|| tools_digest(&[]));
            return compose(request, &NONE);
        }
        let tools = {
            let mut last = self
                .last_tools
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match &*last {
                Some((seen, digest)) if Arc::ptr_eq(seen, &request.tools) => *digest,
                _ => {
                    let digest = tools_digest(&request.tools);
                    *last = Some((request.tools.clone(), digest));
                    digest
                }
            }
        };
        compose(request, &tools)
    }
}

impl fmt::Debug for Keyer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyer").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Message;

    #[test]
    fn the_remembered_tool_digest_gives_the_same_key() {
        let tools: Arc<[ToolSpec]> = Arc::from(vec![ToolSpec::new(
            "add",
            "Adds",
            serde_json::json!({"type": "object"}),
        )]);
        let mut request = ModelRequest::new("m", vec![Message::user("hi")]);
        request.tools = tools.clone();
        let keyer = Keyer::default();
        assert_eq!(keyer.key(&request), CacheKey::of(&request));
        assert_eq!(keyer.key(&request), CacheKey::of(&request));
        // Another list with equal content: equal key; other content: another.
        request.tools = Arc::from(tools.to_vec());
        assert_eq!(keyer.key(&request), CacheKey::of(&request));
        request.tools = Arc::from([]);
        assert_eq!(keyer.key(&request), CacheKey::of(&request));
        assert_ne!(keyer.key(&request), {
            let mut with = request.clone();
            with.tools = tools;
            CacheKey::of(&with)
        });
    }

    #[test]
    fn hex_is_the_bytes() {
        let key = CacheKey::of(&ModelRequest::default());
        let hex = key.to_hex();
        assert_eq!(hex.len(), 64);
        assert_eq!(format!("{key}"), hex);
        assert_eq!(&hex[..2], format!("{:02x}", key.as_bytes()[0]));
    }
}
