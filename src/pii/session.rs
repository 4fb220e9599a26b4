//! [`PiiSession`]: masking and restoring with one placeholder map.

use std::{
    borrow::Cow,
    collections::HashMap,
    fmt::Write as _,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, PoisonError, RwLock, RwLockReadGuard,
    },
};

use sha2::{Digest, Sha256};

use super::{
    config::Strategy,
    engine::PiiEngine,
    kind::{Detection, PiiKind},
};

/// Masking refused a text because it holds PII whose strategy is
/// [`Strategy::Block`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("text contains PII of a blocked kind: {kind}")]
#[non_exhaustive]
pub struct PiiBlocked {
    /// The first blocked kind found in the text.
    pub kind: PiiKind,
}

/// The placeholder ↔ value map of one session.
#[derive(Debug, Default)]
pub(crate) struct Vault {
    /// label → value → placeholder.
    by_value: HashMap<Arc<str>, HashMap<Arc<str>, Arc<str>>>,
    /// placeholder → value.
    by_placeholder: HashMap<Arc<str>, Arc<str>>,
    /// label → last number handed out.
    counters: HashMap<Arc<str>, u64>,
    /// Length in bytes of the longest placeholder.
    max_len: usize,
    /// Placeholders whose value was masked from inside JSON (tool-call
    /// arguments), and so is stored escaped for a JSON string.
    escaped: std::collections::HashSet<Arc<str>>,
}

impl Vault {
    fn placeholder(&mut self, label: &str, value: &str) -> Arc<str> {
        if let Some(p) = self.by_value.get(label).and_then(|m| m.get(value)) {
            return p.clone();
        }
        let label: Arc<str> = self
            .counters
            .get_key_value(label)
            .map_or_else(|| Arc::from(label), |(k, _)| k.clone());
        let n = self.counters.entry(label.clone()).or_insert(0);
        *n += 1;
        let placeholder: Arc<str> = Arc::from(format!("<{label}_{n}>"));
        let value: Arc<str> = Arc::from(value);
        self.max_len = self.max_len.max(placeholder.len());
        self.by_placeholder
            .insert(placeholder.clone(), value.clone());
        self.by_value
            .entry(label)
            .or_default()
            .insert(value, placeholder.clone());
        placeholder
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_placeholder.is_empty()
    }

    pub(crate) fn max_len(&self) -> usize {
        self.max_len
    }

    /// Replaces the known placeholders of `text`. A placeholder is the text
    /// from a `<` to the next `>` when no other `<` comes first; it is
    /// replaced if the vault knows it, left as is otherwise.
    pub(crate) fn restore<'a>(&self, text: &'a str) -> Cow<'a, str> {
        self.restore_in(text, None)
    }

    /// As [`restore`](Self::restore); with `json`, `text` is (the next piece
    /// of) a JSON document whose scan state `json` carries, and a value
    /// restored inside a JSON string is escaped for it, unless it was masked
    /// from JSON (and so is escaped already).
    pub(crate) fn restore_in<'a>(
        &self,
        text: &'a str,
        mut json: Option<&mut JsonScan>,
    ) -> Cow<'a, str> {
        if self.is_empty() {
            if let Some(scan) = json {
                scan.advance(text.as_bytes());
            }
            return Cow::Borrowed(text);
        }
        let bytes = text.as_bytes();
        let mut out = String::new();
        let mut copied = 0;
        let mut scanned = 0;
        let mut from = 0;
        while let Some(k) = text[from..].find('<') {
            let open = from + k;
            from = open + 1;
            let limit = (open + self.max_len).min(bytes.len());
            let Some(close) = bytes[open + 1..limit]
                .iter()
                .position(|&b| b == b'<' || b == b'>')
                .map(|j| open + 1 + j)
            else {
                continue;
            };
            if bytes[close] != b'>' {
                continue;
            }
            if let Some(value) = self.by_placeholder.get(&text[open..=close]) {
                if out.is_empty() {
                    out.reserve(text.len());
                }
                out.push_str(&text[copied..open]);
                let escape = match json.as_deref_mut() {
                    Some(scan) => {
                        scan.advance(&bytes[scanned..open]);
                        scanned = open;
                        scan.in_string() && !self.escaped.contains(&text[open..=close])
                    }
                    None => false,
                };
                if escape {
                    push_json_escaped(&mut out, value);
                } else {
                    out.push_str(value);
                }
                copied = close + 1;
                from = copied;
            }
        }
        if let Some(scan) = json {
            scan.advance(&bytes[scanned..]);
        }
        if copied == 0 {
            Cow::Borrowed(text)
        } else {
            out.push_str(&text[copied..]);
            Cow::Owned(out)
        }
    }
}

/// Where a scan of a JSON text stands: inside a string or not, and after a
/// backslash or not.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct JsonScan {
    in_string: bool,
    escape: bool,
}

impl JsonScan {
    fn advance(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.escape {
                self.escape = false;
            } else if self.in_string && b == b'\\' {
                self.escape = true;
            } else if b == b'"' {
                self.in_string = !self.in_string;
            }
        }
    }

    fn in_string(&self) -> bool {
        self.in_string && !self.escape
    }
}

/// Appends `value` escaped for the inside of a JSON string.
fn push_json_escaped(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// The placeholder map for one run (one conversation, one agent
/// invocation): masks outgoing text and restores incoming text.
///
/// All methods take `&self`; the map sits behind an [`RwLock`], so share a
/// session between tasks with `Arc<PiiSession>`. Masking takes the write lock
/// only while it hands out placeholders; restoring only reads.
///
/// See the [module documentation](super) for the placeholder formats.
#[derive(Debug)]
pub struct PiiSession {
    engine: PiiEngine,
    vault: RwLock<Vault>,
    /// Set once the vault holds a placeholder: until then restoring has
    /// nothing to do and takes no lock.
    filled: AtomicBool,
}

impl PiiEngine {
    /// A new, empty session (placeholder map) using this engine.
    pub fn session(&self) -> PiiSession {
        PiiSession::new(self.clone())
    }
}

impl PiiSession {
    /// An empty session using `engine`.
    pub fn new(engine: PiiEngine) -> Self {
        PiiSession {
            engine,
            vault: RwLock::new(Vault::default()),
            filled: AtomicBool::new(false),
        }
    }

    /// The engine this session detects with.
    pub fn engine(&self) -> &PiiEngine {
        &self.engine
    }

    /// Replaces the PII in `text` according to each kind's [`Strategy`].
    ///
    /// Returns the input unchanged (borrowed, no allocation) when nothing is
    /// found. If any detection's strategy is [`Strategy::Block`], returns
    /// [`PiiBlocked`] naming the first such kind, and the session is left
    /// untouched.
    pub fn mask<'a>(&self, text: &'a str) -> Result<Cow<'a, str>, PiiBlocked> {
        self.mask_as(text, false)
    }

    /// As [`mask`](Self::mask), for a JSON text such as tool-call arguments:
    /// the values it masks are stored as they stand in the JSON (escaped),
    /// and [`restore_json`](Self::restore_json) puts them back unchanged.
    pub fn mask_json<'a>(&self, text: &'a str) -> Result<Cow<'a, str>, PiiBlocked> {
        self.mask_as(text, true)
    }

    fn mask_as<'a>(&self, text: &'a str, json: bool) -> Result<Cow<'a, str>, PiiBlocked> {
        let found = self.engine.detect(text);
        if found.is_empty() {
            return Ok(Cow::Borrowed(text));
        }
        let config = self.engine.config();
        let strategies: Vec<Strategy> =
            found.iter().map(|d| config.strategy_for(&d.kind)).collect();
        if let Some(i) = strategies.iter().position(|s| *s == Strategy::Block) {
            return Err(PiiBlocked {
                kind: found[i].kind.clone(),
            });
        }
        let mut vault = None;
        let mut out = String::with_capacity(text.len() + 16 * found.len());
        let mut last = 0;
        for (d, strategy) in found.iter().zip(strategies) {
            out.push_str(&text[last..d.range.start]);
            last = d.range.end;
            self.replace(
                &mut vault,
                &mut out,
                d,
                &text[d.range.clone()],
                strategy,
                json,
            );
        }
        out.push_str(&text[last..]);
        Ok(Cow::Owned(out))
    }

    /// Masks texts that are read as one (the text parts of a message): they
    /// are joined, masked as one text, and the result is cut back at the
    /// parts' boundaries. A value that spans parts is replaced in the part
    /// where it starts; the rest of it is taken out of the parts after.
    /// Returns `None` when nothing is found.
    pub fn mask_parts(&self, parts: &[&str]) -> Result<Option<Vec<String>>, PiiBlocked> {
        if let [one] = parts {
            return Ok(match self.mask(one)? {
                Cow::Borrowed(_) => None,
                Cow::Owned(masked) => Some(vec![masked]),
            });
        }
        let joined = parts.concat();
        let found = self.engine.detect(&joined);
        if found.is_empty() {
            return Ok(None);
        }
        let config = self.engine.config();
        let strategies: Vec<Strategy> =
            found.iter().map(|d| config.strategy_for(&d.kind)).collect();
        if let Some(i) = strategies.iter().position(|s| *s == Strategy::Block) {
            return Err(PiiBlocked {
                kind: found[i].kind.clone(),
            });
        }
        let mut starts = Vec::with_capacity(parts.len() + 1);
        let mut at = 0;
        for part in parts {
            starts.push(at);
            at += part.len();
        }
        starts.push(at);
        let mut outs: Vec<String> = parts
            .iter()
            .map(|p| String::with_capacity(p.len()))
            .collect();
        // Copies `joined[a..b]` into the parts it falls in.
        let copy = |outs: &mut Vec<String>, a: usize, b: usize| {
            for (i, out) in outs.iter_mut().enumerate() {
                let (s, e) = (starts[i].max(a), starts[i + 1].min(b));
                if s < e {
                    out.push_str(&joined[s..e]);
                }
            }
        };
        let mut vault = None;
        let mut last = 0;
        for (d, strategy) in found.iter().zip(strategies) {
            copy(&mut outs, last, d.range.start);
            last = d.range.end;
            // The part holding the value's first byte (empty parts hold none).
            let home = (0..parts.len())
                .find(|&i| starts[i] <= d.range.start && d.range.start < starts[i + 1])
                .unwrap_or(parts.len() - 1);
            self.replace(
                &mut vault,
                &mut outs[home],
                d,
                &joined[d.range.clone()],
                strategy,
                false,
            );
        }
        copy(&mut outs, last, joined.len());
        Ok(Some(outs))
    }

    /// Writes the replacement of one detected `value` to `out`.
    fn replace<'s>(
        &'s self,
        vault: &mut Option<std::sync::RwLockWriteGuard<'s, Vault>>,
        out: &mut String,
        d: &Detection,
        value: &str,
        strategy: Strategy,
        json: bool,
    ) {
        let label = d.kind.label();
        match strategy {
            Strategy::Mask => {
                let vault = vault.get_or_insert_with(|| {
                    self.vault.write().unwrap_or_else(PoisonError::into_inner)
                });
                let known = vault.by_placeholder.len();
                let placeholder = vault.placeholder(&label, value);
                self.filled.store(true, Ordering::Release);
                // A value keeps the form it was first masked in.
                if json && vault.by_placeholder.len() > known {
                    vault.escaped.insert(placeholder.clone());
                }
                out.push_str(&placeholder);
            }
            Strategy::Redact => {
                let _ = write!(out, "[REDACTED_{label}]");
            }
            Strategy::Hash => {
                let digest = Sha256::new()
                    .chain_update(self.engine.config().salt())
                    .chain_update(value.as_bytes())
                    .finalize();
                let _ = write!(out, "<{label}_");
                for b in &digest[..4] {
                    let _ = write!(out, "{b:02x}");
                }
                out.push('>');
            }
            // Blocked texts are refused before anything is replaced.
            Strategy::Block => {}
        }
    }

    /// Replaces the placeholders this session handed out with their original
    /// values. Placeholder-looking text the session does not know
    /// (`<EMAIL_99>`, hashes, redactions) is left as is. Returns the input
    /// borrowed when nothing is replaced.
    pub fn restore<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if !self.filled.load(Ordering::Acquire) {
            return Cow::Borrowed(text);
        }
        self.vault().restore(text)
    }

    /// As [`restore`](Self::restore), for a JSON text such as tool-call
    /// arguments: a value restored inside a JSON string is escaped for it
    /// (quotes, backslashes, control characters), so the JSON still parses
    /// and the string decodes to the original value. A value masked with
    /// [`mask_json`](Self::mask_json) is put back as it stood.
    pub fn restore_json<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if !self.filled.load(Ordering::Acquire) {
            return Cow::Borrowed(text);
        }
        self.vault()
            .restore_in(text, Some(&mut JsonScan::default()))
    }

    /// The original value behind `placeholder`, if this session handed it out.
    pub fn value_of(&self, placeholder: &str) -> Option<Arc<str>> {
        self.vault().by_placeholder.get(placeholder).cloned()
    }

    /// The number of placeholders handed out so far.
    pub fn len(&self) -> usize {
        self.vault().by_placeholder.len()
    }

    /// Whether no placeholder has been handed out yet.
    pub fn is_empty(&self) -> bool {
        !self.filled.load(Ordering::Acquire)
    }

    pub(crate) fn vault(&self) -> RwLockReadGuard<'_, Vault> {
        self.vault.read().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
