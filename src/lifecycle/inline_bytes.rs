//! [`InlineBytes`]: a short copy of some bytes kept without allocating,
//! for what the wrap chain keeps of each tool call (its name, a snapshot of
//! its arguments).

use std::fmt;
use std::io;

/// How many bytes stay inline; longer copies go to the heap.
const INLINE: usize = 80;

/// A copy of some bytes, inline while they fit.
#[derive(Clone)]
pub(crate) struct InlineBytes(Repr);

#[derive(Clone)]
enum Repr {
    Inline { buf: [u8; INLINE], len: u8 },
    Heap(Box<[u8]>),
}

impl InlineBytes {
    /// A copy of `bytes`.
    pub(crate) fn copy(bytes: &[u8]) -> Self {
        let mut builder = Builder::new();
        builder.extend(bytes);
        builder.finish()
    }

    /// The bytes.
    #[inline]
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { buf, len } => &buf[..usize::from(*len)],
            Repr::Heap(bytes) => bytes,
        }
    }

    /// The bytes as text, when they are (a copy of a `str` always is).
    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

impl fmt::Debug for InlineBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&String::from_utf8_lossy(self.as_bytes()), f)
    }
}

/// An [`InlineBytes`] as text: a copy of a `str`. Public only to name the
/// tool in the wrap chain's sealed plumbing; unreachable outside the crate.
#[allow(unreachable_pub)]
#[derive(Clone, Debug)]
pub struct InlineStr(InlineBytes);

impl InlineStr {
    pub(crate) fn copy(text: &str) -> Self {
        Self(InlineBytes::copy(text.as_bytes()))
    }

    pub(crate) fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl fmt::Display for InlineStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Collects [`InlineBytes`] piece by piece (also as an [`io::Write`]):
/// inline while they fit.
pub(crate) struct Builder {
    buf: [u8; INLINE],
    len: usize,
    heap: Option<Vec<u8>>,
}

impl Builder {
    pub(crate) fn new() -> Self {
        Self {
            buf: [0; INLINE],
            len: 0,
            heap: None,
        }
    }

    /// How many bytes so far.
    pub(crate) fn len(&self) -> usize {
        match &self.heap {
            Some(heap) => heap.len(),
            None => self.len,
        }
    }

    #[inline]
    pub(crate) fn extend(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if self.heap.is_some() || end > INLINE {
            return self.spill(bytes);
        }
        let room = &mut self.buf[self.len..end];
        if bytes.len() <= 4 {
            // What JSON writes most: a quote, a colon, a brace.
            for (to, from) in room.iter_mut().zip(bytes) {
                *to = *from;
            }
        } else {
            room.copy_from_slice(bytes);
        }
        self.len = end;
    }

    #[cold]
    fn spill(&mut self, bytes: &[u8]) {
        let heap = self.heap.get_or_insert_with(|| {
            let mut heap = Vec::with_capacity(2 * (INLINE + bytes.len()));
            heap.extend_from_slice(&self.buf[..self.len]);
            heap
        });
        heap.extend_from_slice(bytes);
    }

    pub(crate) fn finish(self) -> InlineBytes {
        InlineBytes(match self.heap {
            Some(heap) => Repr::Heap(heap.into_boxed_slice()),
            None => Repr::Inline {
                buf: self.buf,
                // At most `INLINE`.
                len: self.len as u8,
            },
        })
    }
}

impl io::Write for Builder {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.extend(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Compares what is written with `rest`, and stops at the first byte that
/// differs: whether a value writes the bytes a copy holds.
pub(crate) struct Same<'a> {
    pub(crate) rest: &'a [u8],
}

impl io::Write for Same<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self.rest.strip_prefix(bytes) {
            Some(rest) => {
                self.rest = rest;
                Ok(bytes.len())
            }
            None => Err(io::ErrorKind::InvalidData.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn short_and_long_copies_keep_their_bytes() {
        let short = InlineBytes::copy(b"lookup");
        assert_eq!(short.as_bytes(), b"lookup");
        let long = "x".repeat(3 * INLINE);
        assert_eq!(
            InlineBytes::copy(long.as_bytes()).as_bytes(),
            long.as_bytes()
        );
        assert_eq!(InlineStr::copy("search").to_string(), "search");
    }

    #[test]
    fn a_builder_spills_to_the_heap_past_the_inline_room() {
        let mut builder = Builder::new();
        let piece = [7u8; INLINE / 2 + 1];
        builder.write_all(&piece).unwrap();
        builder.write_all(&piece).unwrap();
        assert_eq!(builder.len(), 2 * piece.len());
        assert_eq!(builder.finish().as_bytes(), [7u8; INLINE + 2]);
    }

    #[test]
    fn same_stops_at_the_first_difference() {
        let mut same = Same { rest: b"{\"a\":1}" };
        assert!(serde_json::to_writer(&mut same, &serde_json::json!({"a": 1})).is_ok());
        assert!(same.rest.is_empty());
        let mut other = Same { rest: b"{\"a\":1}" };
        assert!(serde_json::to_writer(&mut other, &serde_json::json!({"a": 2})).is_err());
    }
}
