//! [`StreamGuard`]: checks a streamed answer as it arrives and releases it
//! segment by segment, holding back only the segment a guard has not
//! checked yet.
//!
//! The text is cut into segments at sentence ends (`.`, `!` or `?` before
//! whitespace; a newline, `。`, `！`, `？`), and a segment never exceeds
//! `max_hold` bytes (it is cut after its last space before that, or at
//! that byte). The cuts depend only on the text, never on how it was
//! chunked, so the guarantee holds for any chunking:
//!
//! * the concatenation of what [`push`](StreamGuard::push) and
//!   [`finish`](StreamGuard::finish) released equals [`guard_text`] of the
//!   full text (each segment as the guard passed or rewrote it);
//! * when the guard blocks a segment, nothing from that segment on is
//!   released: what was released is exactly the guarded segments before it.

use serde_json::Value;

/// What a guard answers about a piece of text.
#[derive(Debug, Clone, PartialEq)]
pub enum GuardVerdict {
    /// Let it through unchanged.
    Pass,
    /// Stop: nothing more of the text is released.
    Block {
        /// Why.
        reason: String,
        /// Details for the caller.
        info: Option<Value>,
    },
    /// Release this text instead.
    Rewrite(String),
}

/// A segment was blocked.
#[derive(Debug, Clone, PartialEq)]
pub struct Blocked {
    /// Why.
    pub reason: String,
    /// Details for the caller.
    pub info: Option<Value>,
    /// How many bytes of the original text had been released (as their
    /// guarded form) before the blocked segment.
    pub at: usize,
}

/// What one [`StreamGuard::push`] or [`finish`](StreamGuard::finish)
/// released: the text to send on, and whether the guard blocked after it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Released {
    /// Send this on (maybe empty). Checked segments before a block are
    /// released too.
    pub text: String,
    /// The guard blocked: nothing more will be released.
    pub blocked: Option<Blocked>,
}

/// The default longest segment: 1 KiB.
pub const DEFAULT_MAX_HOLD: usize = 1024;

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Where the first segment of `seg` ends, if that is known yet. `complete`:
/// no more text follows.
fn next_cut(seg: &str, max_hold: usize, complete: bool) -> Option<usize> {
    for (i, c) in seg.char_indices() {
        let end = i + c.len_utf8();
        if end > max_hold {
            break;
        }
        match c {
            '\n' | '。' | '！' | '？' => return Some(end),
            '.' | '!' | '?' => match seg[end..].chars().next() {
                Some(next) if next.is_whitespace() => return Some(end),
                Some(_) => {}
                None if complete => return None,
                None => return None,
            },
            _ => {}
        }
    }
    if seg.len() > max_hold {
        let head = &seg[..floor_char_boundary(seg, max_hold)];
        let cut = head
            .char_indices()
            .rev()
            .find(|(_, c)| c.is_whitespace())
            .map(|(i, c)| i + c.len_utf8())
            .filter(|&i| i > 0)
            .unwrap_or(head.len());
        return Some(cut.max(seg.chars().next().map_or(1, char::len_utf8)));
    }
    None
}

/// Applies `check` to each segment of `text`: the guarded full text a
/// [`StreamGuard`] releases, or where it blocked with what it released
/// before.
pub fn guard_text(
    text: &str,
    max_hold: usize,
    mut check: impl FnMut(&str) -> GuardVerdict,
) -> Result<String, (String, Blocked)> {
    let mut guard = StreamGuard::new(&mut check).max_hold(max_hold);
    let blocked = guard.push(text).blocked.or_else(|| guard.finish().blocked);
    match blocked {
        None => Ok(guard.released_text().to_owned()),
        Some(b) => Err((guard.released_text().to_owned(), b)),
    }
}

/// Cuts a streamed text into the segments a [`StreamGuard`] checks, at the
/// same cuts for any chunking (see the [module docs](self)). For a guard
/// whose check is async: push chunks, take each complete segment, check
/// it, release it.
///
/// ```
/// use tower_agent::lifecycle::builtin::guards::stream::Segmenter;
///
/// let mut s = Segmenter::new(1024);
/// s.push("One. Tw");
/// assert_eq!(s.next_segment(false).as_deref(), Some("One."));
/// assert_eq!(s.next_segment(false), None);
/// s.push("o");
/// assert_eq!(s.next_segment(true).as_deref(), Some(" Two"));
/// ```
#[derive(Debug, Clone)]
pub struct Segmenter {
    max_hold: usize,
    pending: String,
}

impl Segmenter {
    /// Segments of at most `max_hold` bytes (at least 1).
    pub fn new(max_hold: usize) -> Self {
        Self {
            max_hold: max_hold.max(1),
            pending: String::new(),
        }
    }

    /// Takes a chunk of the text.
    pub fn push(&mut self, chunk: &str) {
        self.pending.push_str(chunk);
    }

    /// The next complete segment, if there is one; `complete`: no more
    /// text follows, so what is held is a segment too.
    pub fn next_segment(&mut self, complete: bool) -> Option<String> {
        let cut = match next_cut(&self.pending, self.max_hold, complete) {
            Some(cut) => cut,
            None if complete && !self.pending.is_empty() => self.pending.len(),
            None => return None,
        };
        Some(self.pending.drain(..cut).collect())
    }

    /// What is held back, not cut yet.
    pub fn held(&self) -> &str {
        &self.pending
    }

    /// Drops what is held.
    pub fn clear(&mut self) {
        self.pending.clear();
    }
}

/// The streaming output guard's release window; see the [module docs](self).
#[derive(Debug)]
pub struct StreamGuard<F> {
    check: F,
    segments: Segmenter,
    released: String,
    consumed: usize,
    blocked: Option<Blocked>,
}

impl<F: FnMut(&str) -> GuardVerdict> StreamGuard<F> {
    /// A window checking each segment with `check`.
    pub fn new(check: F) -> Self {
        Self {
            check,
            segments: Segmenter::new(DEFAULT_MAX_HOLD),
            released: String::new(),
            consumed: 0,
            blocked: None,
        }
    }

    /// The longest segment, in bytes (at least 1).
    pub fn max_hold(mut self, bytes: usize) -> Self {
        self.segments.max_hold = bytes.max(1);
        self
    }

    /// Everything released so far.
    pub fn released_text(&self) -> &str {
        &self.released
    }

    /// What is held back, not yet checked.
    pub fn held(&self) -> &str {
        self.segments.held()
    }

    /// Takes a chunk; returns what is now released. After a block, every
    /// call releases nothing and repeats the [`Blocked`].
    pub fn push(&mut self, chunk: &str) -> Released {
        if self.blocked.is_none() {
            self.segments.push(chunk);
        }
        self.drain(false)
    }

    /// The stream ended: checks and releases what was held.
    pub fn finish(&mut self) -> Released {
        self.drain(true)
    }

    fn drain(&mut self, complete: bool) -> Released {
        if let Some(b) = &self.blocked {
            return Released {
                text: String::new(),
                blocked: Some(b.clone()),
            };
        }
        let mut out = String::new();
        while let Some(segment) = self.segments.next_segment(complete) {
            let text = match (self.check)(&segment) {
                GuardVerdict::Pass => segment.clone(),
                GuardVerdict::Rewrite(text) => text,
                GuardVerdict::Block { reason, info } => {
                    let b = Blocked {
                        reason,
                        info,
                        at: self.consumed,
                    };
                    self.segments.clear();
                    self.blocked = Some(b.clone());
                    return Released {
                        text: out,
                        blocked: Some(b),
                    };
                }
            };
            self.consumed += segment.len();
            out.push_str(&text);
            self.released.push_str(&text);
        }
        Released {
            text: out,
            blocked: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redact(seg: &str) -> GuardVerdict {
        if seg.contains("secret") {
            GuardVerdict::Rewrite(seg.replace("secret", "[hidden]"))
        } else {
            GuardVerdict::Pass
        }
    }

    #[test]
    fn text_is_released_at_sentence_ends_and_held_in_between() {
        let mut g = StreamGuard::new(redact);
        assert_eq!(g.push("The sec").text, "");
        assert_eq!(g.push("ret is out. Next").text, "The [hidden] is out.");
        assert_eq!(g.held(), " Next");
        assert_eq!(g.finish().text, " Next");
    }

    #[test]
    fn a_block_releases_nothing_from_the_blocked_segment_on() {
        let mut g = StreamGuard::new(|s: &str| {
            if s.contains("bomb") {
                GuardVerdict::Block {
                    reason: "no".into(),
                    info: None,
                }
            } else {
                GuardVerdict::Pass
            }
        });
        assert_eq!(g.push("Fine. How to build a bo").text, "Fine.");
        let step = g.push("mb. More.");
        assert_eq!((step.text.as_str(), step.blocked.unwrap().at), ("", 5));
        assert_eq!(g.released_text(), "Fine.");
        assert!(g.push("x").blocked.is_some() && g.finish().blocked.is_some());
    }

    #[test]
    fn a_segment_never_exceeds_the_hold() {
        let mut g = StreamGuard::new(|_: &str| GuardVerdict::Pass).max_hold(8);
        assert_eq!(g.push("aaaa bbbb cccc").text, "aaaa bbbb ");
        assert_eq!(g.held(), "cccc");
    }
}
