//! [`StreamRestorer`]: restoring placeholders in text that arrives in chunks.

use std::{fmt, sync::Arc};

use super::session::{JsonScan, PiiSession};

/// Restores placeholders in a text that arrives in arbitrary chunks, such as
/// a streamed model response, holding back as little as possible.
///
/// Only a possible placeholder prefix is held back: from the last `<` of the
/// text seen so far, when what follows it is still shorter than the longest
/// placeholder of the session and made of placeholder characters
/// (`A-Z`, `0-9`, `_`). Everything before it is restored and returned.
///
/// **Invariant:** for any split of a text into chunks (at `char`
/// boundaries), the concatenation of every [`push`](Self::push) result and
/// the [`finish`](Self::finish) result equals
/// [`PiiSession::restore`] of the whole text — provided the session's map
/// does not change in between (the session may of course have been used to
/// mask text before the stream started).
///
/// ```
/// use std::sync::Arc;
/// use tower_agent::layers::pii::PiiConfig;
///
/// let session = Arc::new(PiiConfig::new().build().session());
/// let masked = session.mask("write to ann@example.com").unwrap();
/// assert_eq!(masked, "write to <EMAIL_1>");
///
/// let mut restorer = session.stream_restorer();
/// let mut out = String::new();
/// for chunk in ["Sent to <EM", "AIL_", "1> and <", "b>."] {
///     out += &restorer.push(chunk);
/// }
/// out += &restorer.finish();
/// assert_eq!(out, "Sent to ann@example.com and <b>.");
/// ```
pub struct StreamRestorer {
    session: Arc<PiiSession>,
    pending: String,
    /// For a JSON stream (tool-call arguments), where its scan stands.
    json: Option<JsonScan>,
}

impl PiiSession {
    /// A restorer for text arriving in chunks (a streamed model response).
    pub fn stream_restorer(self: &Arc<Self>) -> StreamRestorer {
        StreamRestorer::new(self.clone())
    }

    /// A restorer for JSON arriving in chunks (streamed tool-call
    /// arguments): as [`restore_json`](PiiSession::restore_json).
    pub fn json_stream_restorer(self: &Arc<Self>) -> StreamRestorer {
        StreamRestorer {
            json: Some(JsonScan::default()),
            ..StreamRestorer::new(self.clone())
        }
    }
}

impl StreamRestorer {
    /// A restorer for `session`, with nothing pending.
    pub fn new(session: Arc<PiiSession>) -> Self {
        StreamRestorer {
            session,
            pending: String::new(),
            json: None,
        }
    }

    /// Takes the next chunk; returns the restored text that can be emitted
    /// now (possibly empty).
    pub fn push(&mut self, delta: &str) -> String {
        let vault = self.session.vault();
        if self.pending.is_empty() {
            // Fast path: restore the delta directly unless its end might
            // start a placeholder.
            let cut = holdback(delta, vault.max_len());
            let out = vault
                .restore_in(&delta[..cut], self.json.as_mut())
                .into_owned();
            self.pending.push_str(&delta[cut..]);
            return out;
        }
        self.pending.push_str(delta);
        let cut = holdback(&self.pending, vault.max_len());
        let out = vault
            .restore_in(&self.pending[..cut], self.json.as_mut())
            .into_owned();
        self.pending.drain(..cut);
        out
    }

    /// Ends the stream: returns whatever was held back, restored.
    pub fn finish(mut self) -> String {
        let vault = self.session.vault();
        vault
            .restore_in(&self.pending, self.json.as_mut())
            .into_owned()
    }

    /// The text currently held back (an unfinished placeholder candidate).
    pub fn pending(&self) -> &str {
        &self.pending
    }
}

/// Where to cut `text` so that the tail can still become a placeholder of at
/// most `max_len` bytes; `text.len()` when nothing needs holding back.
fn holdback(text: &str, max_len: usize) -> usize {
    let Some(open) = text.rfind('<') else {
        return text.len();
    };
    let tail = &text.as_bytes()[open + 1..];
    let viable = tail.len() + 1 < max_len
        && tail
            .iter()
            .all(|&b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if viable {
        open
    } else {
        text.len()
    }
}

impl fmt::Debug for StreamRestorer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamRestorer")
            .field("pending_bytes", &self.pending.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::pii::PiiConfig;

    fn session() -> Arc<PiiSession> {
        let s = Arc::new(PiiConfig::new().build().session());
        s.mask("a@example.com b@example.com +44 20 7946 0958")
            .unwrap();
        s
    }

    fn run(session: &Arc<PiiSession>, chunks: &[&str]) -> String {
        let mut r = session.stream_restorer();
        let mut out: String = chunks.iter().map(|c| r.push(c)).collect();
        out += &r.finish();
        out
    }

    #[test]
    fn holds_back_only_placeholder_prefixes() {
        let s = session();
        let mut r = s.stream_restorer();
        assert_eq!(r.push("x < y"), "x < y");
        assert_eq!(r.push("a <EMA"), "a ");
        assert_eq!(r.pending(), "<EMA");
        assert_eq!(r.push("IL_2"), "");
        assert_eq!(r.push(">!"), "b@example.com!");
        assert_eq!(r.push("<em>"), "<em>");
        assert_eq!(r.push("<PHONE_123456789"), "<PHONE_123456789");
        assert_eq!(r.push("<"), "");
        assert_eq!(r.finish(), "<");
    }

    #[test]
    fn every_split_matches_restore() {
        let s = session();
        let text = "<<EMAIL_1> é <PHONE_1><EMAIL_2 <EMAIL_3> <EMAIL_2>> <PHONE_1";
        let want = s.restore(text);
        for i in 0..=text.len() {
            for j in i..=text.len() {
                if ![i, j].iter().all(|&k| text.is_char_boundary(k)) {
                    continue;
                }
                let got = run(&s, &[&text[..i], &text[i..j], &text[j..]]);
                assert_eq!(got, want, "split at {i}, {j}");
            }
        }
    }

    #[test]
    fn empty_session_passes_through() {
        let s = Arc::new(PiiConfig::new().build().session());
        assert_eq!(run(&s, &["<EMAIL_1", ">"]), "<EMAIL_1>");
        assert!(format!("{:?}", s.stream_restorer()).contains("StreamRestorer"));
    }
}
