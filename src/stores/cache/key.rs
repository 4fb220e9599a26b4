//! The cache key: a stable 128-bit hash of what decides a model's answer.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use xxhash_rust::xxh3::{xxh3_128_with_seed, Xxh3};

use crate::types::{ModelRequest, ModelSettings, ResponseFormat, ToolChoice, ToolSpec};

/// The hash's seed. Changes when the key's layout changes, so old entries of
/// a shared store are never read as new ones.
const SEED: u64 = u64::from_le_bytes(*b"ta.key/4");

/// The key a response is cached under: a 128-bit XXH3 hash of the request's
/// model name, messages, tools and settings. See the [cache layer](crate::layers::cache).
///
/// Equal requests have equal keys, in every process and across restarts
/// (every part is hashed in a fixed binary layout, the tools and a
/// `response_format` as their wire JSON), so a shared store (Redis, …) can
/// be keyed on [`to_hex`](Self::to_hex). A change in any part gives another
/// key.
///
/// The messages enter through [`History::digest`](crate::types::History::digest),
/// a SHA-256 prefix chain, so computing a key costs O(messages added since
/// the history's digest was last asked for), not O(history), and what a
/// user writes passes through SHA-256 before it reaches the key. XXH3 itself
/// is fast, not collision-resistant: settings or tools written by someone
/// who wants to collide with another request's key are not defended against
/// (give such requests a cache of their own).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CacheKey([u8; 16]);

impl CacheKey {
    /// The key of `request`.
    pub fn of(request: &ModelRequest) -> CacheKey {
        compose(request, tools_digest(&request.tools))
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The key as 32 lowercase hex digits, for stores keyed on strings.
    pub fn to_hex(&self) -> String {
        format!("{:032x}", u128::from_be_bytes(self.0))
    }
}

impl Hash for CacheKey {
    /// The key is a hash already: its bytes are fed as one integer.
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u128(u128::from_le_bytes(self.0));
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

/// The hasher's input, every part length-prefixed or of a fixed size, so no
/// two different requests feed it the same bytes. A request's input
/// usually fits on the stack and is hashed in one go; a longer one streams
/// into an XXH3 state (which hashes the same bytes to the same value).
struct Input {
    buf: [u8; INLINE],
    len: usize,
    stream: Option<Box<Xxh3>>,
}

/// What fits on the stack: a request with default settings and a model
/// name of up to 60 bytes.
const INLINE: usize = 128;

impl Input {
    fn new() -> Self {
        Input {
            buf: [0; INLINE],
            len: 0,
            stream: None,
        }
    }

    #[inline(always)]
    fn bytes(&mut self, bytes: &[u8]) {
        if let Some(stream) = &mut self.stream {
            stream.update(bytes);
        } else if let Some(room) = self.buf.get_mut(self.len..self.len + bytes.len()) {
            room.copy_from_slice(bytes);
            self.len += bytes.len();
        } else {
            let mut stream = Box::new(Xxh3::with_seed(SEED));
            stream.update(&self.buf[..self.len]);
            stream.update(bytes);
            self.stream = Some(stream);
        }
    }

    #[inline]
    fn len(&mut self, len: usize) {
        self.bytes(&(len as u64).to_le_bytes());
    }

    #[inline]
    fn str(&mut self, text: &str) {
        self.len(text.len());
        self.bytes(text.as_bytes());
    }

    /// A tag byte: `0` for `None`, else `1` and what `write` feeds.
    #[inline]
    fn option<T>(&mut self, value: Option<&T>, write: impl FnOnce(&mut Self, &T)) {
        match value {
            None => self.bytes(&[0]),
            Some(value) => {
                self.bytes(&[1]);
                write(self, value);
            }
        }
    }

    /// `value` as its JSON, which ends where its own syntax says: no
    /// length prefix needed.
    fn json<T: serde::Serialize + ?Sized>(&mut self, value: &T) {
        // Serializing plain data into the input cannot fail.
        let _ = serde_json::to_writer(self, value);
    }

    fn finish(&self) -> [u8; 16] {
        let hash = match &self.stream {
            Some(stream) => stream.digest128(),
            None => xxh3_128_with_seed(&self.buf[..self.len], SEED),
        };
        hash.to_le_bytes()
    }
}

/// serde_json writes straight into the input: no buffer of its own.
impl std::io::Write for &mut Input {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn tools_digest(tools: &[ToolSpec]) -> [u8; 16] {
    let mut input = Input::new();
    input.json(tools);
    input.finish()
}

/// What a request's settings feed: a `0` for the default settings (the
/// common case), else a `1` and every field.
fn settings(input: &mut Input, settings: &ModelSettings) {
    if is_default(settings) {
        input.bytes(&[0]);
        return;
    }
    input.bytes(&[1]);
    all_settings(input, settings);
}

/// Whether `settings` are [`ModelSettings::default`], without building the
/// default to compare with. Every field is named, so a field added to the
/// settings cannot be left out unnoticed.
fn is_default(settings: &ModelSettings) -> bool {
    let ModelSettings {
        temperature,
        max_tokens,
        stop,
        response_format,
        parallel_tool_calls,
        tool_choice,
    } = settings;
    temperature.is_none()
        && max_tokens.is_none()
        && stop.is_empty()
        && response_format.is_none()
        && parallel_tool_calls.is_none()
        && tool_choice.is_none()
}

/// What [`settings`] feeds, field by field. Every field is named, so a
/// field added to the settings cannot be left out of the key unnoticed.
fn all_settings(input: &mut Input, settings: &ModelSettings) {
    let ModelSettings {
        temperature,
        max_tokens,
        stop,
        response_format,
        parallel_tool_calls,
        tool_choice,
    } = settings;
    input.option(temperature.as_ref(), |input, t| {
        input.bytes(&t.to_bits().to_le_bytes())
    });
    input.option(max_tokens.as_ref(), |input, n| {
        input.bytes(&n.to_le_bytes())
    });
    input.len(stop.len());
    for stop in stop {
        input.str(stop);
    }
    input.option(response_format.as_ref(), |input, format| match format {
        ResponseFormat::Text => input.bytes(&[0]),
        ResponseFormat::JsonObject => input.bytes(&[1]),
        ResponseFormat::JsonSchema { json_schema } => {
            input.bytes(&[2]);
            input.json(json_schema);
        }
    });
    input.option(parallel_tool_calls.as_ref(), |input, p| {
        input.bytes(&[u8::from(*p)])
    });
    input.option(tool_choice.as_ref(), |input, choice| match choice {
        ToolChoice::Auto => input.bytes(&[0]),
        ToolChoice::None => input.bytes(&[1]),
        ToolChoice::Required => input.bytes(&[2]),
        ToolChoice::Tool(name) => {
            input.bytes(&[3]);
            input.str(name);
        }
    });
}

fn compose(request: &ModelRequest, tools: [u8; 16]) -> CacheKey {
    // The message count, the history's digest and the tools', in one write.
    let mut fixed = [0; 40];
    fixed[..8].copy_from_slice(&(request.messages.len() as u64).to_le_bytes());
    fixed[8..24].copy_from_slice(&request.messages.digest());
    fixed[24..].copy_from_slice(&tools);
    if let Some(key) = compose_short(request, &fixed) {
        return key;
    }
    let mut input = Input::new();
    input.str(&request.model);
    input.bytes(&fixed);
    settings(&mut input, &request.settings);
    CacheKey(input.finish())
}

/// [`compose`] of the common request, with default settings and a short
/// model name: the same bytes laid out at fixed places in one buffer, with
/// none of [`Input`]'s checks per write.
#[inline]
fn compose_short(request: &ModelRequest, fixed: &[u8; 40]) -> Option<CacheKey> {
    const HEAD: usize = 8;
    // The fixed part, and the default settings' `0`.
    const TAIL: usize = 40 + 1;
    let name = request.model.as_bytes();
    if name.len() > INLINE - HEAD - TAIL || !is_default(&request.settings) {
        return None;
    }
    let mut buf = [0; INLINE];
    buf[..HEAD].copy_from_slice(&(name.len() as u64).to_le_bytes());
    let (_, rest) = buf.split_at_mut(HEAD);
    let (named, rest) = rest.split_at_mut(name.len());
    named.copy_from_slice(name);
    rest[..40].copy_from_slice(fixed);
    // The default settings feed a zero: the buffer holds it already.
    let len = HEAD + name.len() + TAIL;
    Some(CacheKey(
        xxh3_128_with_seed(&buf[..len], SEED).to_le_bytes(),
    ))
}

/// A tool list and its digest.
type SeenTools = (Arc<[ToolSpec]>, [u8; 16]);

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
            static NONE: LazyLock<[u8; 16]> = LazyLock::new(|| tools_digest(&[]));
            return compose(request, *NONE);
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
        compose(request, tools)
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
    fn every_setting_is_part_of_the_key() {
        use crate::types::{ResponseFormat, ToolChoice};
        let base = ModelRequest::new("m", vec![Message::user("hi")]);
        let changes: Vec<fn(&mut ModelSettings)> = vec![
            |s| s.temperature = Some(0.0),
            |s| s.temperature = Some(-0.0),
            |s| s.max_tokens = Some(0),
            |s| s.max_tokens = Some(1),
            |s| s.stop = vec![String::new()],
            |s| s.stop = vec!["ab".into()],
            |s| s.stop = vec!["a".into(), "b".into()],
            |s| s.response_format = Some(ResponseFormat::Text),
            |s| s.response_format = Some(ResponseFormat::JsonObject),
            |s| {
                s.response_format = Some(ResponseFormat::json_schema(
                    "answer",
                    serde_json::json!({"type": "object"}),
                ))
            },
            |s| s.parallel_tool_calls = Some(false),
            |s| s.parallel_tool_calls = Some(true),
            |s| s.tool_choice = Some(ToolChoice::Auto),
            |s| s.tool_choice = Some(ToolChoice::None),
            |s| s.tool_choice = Some(ToolChoice::Required),
            |s| s.tool_choice = Some(ToolChoice::tool("")),
            |s| s.tool_choice = Some(ToolChoice::tool("search")),
        ];
        let mut keys = vec![CacheKey::of(&base)];
        for change in changes {
            let mut request = base.clone();
            change(request.settings_mut());
            keys.push(CacheKey::of(&request));
        }
        let mut model = base.clone();
        model.model = "m2".into();
        keys.push(CacheKey::of(&model));
        let mut messages = base.clone();
        messages.messages = vec![Message::user("hi!")].into();
        keys.push(CacheKey::of(&messages));
        let count = keys.len();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), count, "every change gives another key");
    }

    #[test]
    fn the_key_is_the_same_in_every_process() {
        // A shared store finds entries by this value: it must not move
        // between builds, runs or machines (only with `SEED`).
        let mut request = ModelRequest::new("gpt-4o", vec![Message::user("Capital of France?")]);
        request.settings_mut().max_tokens = Some(64);
        assert_eq!(
            CacheKey::of(&request).to_hex(),
            "70b8827159584e891144559ac8672d0f"
        );
    }

    #[test]
    fn a_long_input_streams_to_what_one_pass_gives() {
        let long = "x".repeat(3 * INLINE);
        for split in [0, 1, INLINE - 1, INLINE, INLINE + 1, 2 * INLINE] {
            let mut input = Input::new();
            input.bytes(&long.as_bytes()[..split]);
            input.bytes(&long.as_bytes()[split..]);
            assert_eq!(input.stream.is_some(), long.len() > INLINE);
            assert_eq!(
                input.finish(),
                xxh3_128_with_seed(long.as_bytes(), SEED).to_le_bytes(),
                "split at {split}"
            );
        }
        let mut request = ModelRequest::new(long.as_str(), vec![Message::user("hi")]);
        request.settings_mut().stop = vec![long.clone()];
        assert_ne!(CacheKey::of(&request), {
            request.settings_mut().stop = vec![long[1..].to_owned()];
            CacheKey::of(&request)
        });
    }

    #[test]
    fn the_default_settings_feed_one_byte_others_every_field() {
        let mut default = Input::new();
        settings(&mut default, &ModelSettings::default());
        assert_eq!(&default.buf[..default.len], &[0]);
        let set = ModelSettings {
            max_tokens: Some(1),
            ..ModelSettings::default()
        };
        let (mut tagged, mut fields) = (Input::new(), Input::new());
        settings(&mut tagged, &set);
        all_settings(&mut fields, &set);
        assert_eq!(tagged.buf[0], 1);
        assert_eq!(&tagged.buf[1..tagged.len], &fields.buf[..fields.len]);
    }

    #[test]
    fn the_short_layout_feeds_what_the_input_would() {
        let fixed = [7; 40];
        let room = INLINE - 8 - 40 - 1;
        for len in [0, 1, room - 1, room] {
            let request = ModelRequest::new("m".repeat(len).as_str(), vec![Message::user("hi")]);
            let mut input = Input::new();
            input.str(&request.model);
            input.bytes(&fixed);
            settings(&mut input, &request.settings);
            assert!(input.stream.is_none());
            assert_eq!(
                compose_short(&request, &fixed),
                Some(CacheKey(input.finish())),
                "a name of {len} bytes"
            );
        }
        let long = ModelRequest::new("m".repeat(room + 1).as_str(), vec![]);
        assert_eq!(compose_short(&long, &fixed), None);
        let mut set = ModelRequest::new("m", vec![]);
        set.settings_mut().max_tokens = Some(1);
        assert_eq!(compose_short(&set, &fixed), None);
    }

    #[test]
    fn hex_is_the_bytes() {
        let key = CacheKey::of(&ModelRequest::default());
        let hex = key.to_hex();
        assert_eq!(hex.len(), 32);
        assert_eq!(format!("{key}"), hex);
        assert_eq!(&hex[..2], format!("{:02x}", key.as_bytes()[0]));
    }
}
