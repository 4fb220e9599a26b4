//! [`InlineBytes`]: a short copy of some bytes kept without allocating,
//! for what the wrap chain keeps of each tool call (its name and id, a
//! snapshot of its arguments).

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
    #[cfg(test)]
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
}

impl fmt::Debug for InlineBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&String::from_utf8_lossy(self.as_bytes()), f)
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
        let n = bytes.len();
        // Short pieces (a quote, a tag and a length, a name) in a few fixed
        // moves, without a call: two overlapping words from the front and
        // from the back cover them.
        match n {
            0..=3 => {
                for (to, from) in room.iter_mut().zip(bytes) {
                    *to = *from;
                }
            }
            4..=7 => {
                room[..4].copy_from_slice(&bytes[..4]);
                room[n - 4..].copy_from_slice(&bytes[n - 4..]);
            }
            8..=16 => {
                room[..8].copy_from_slice(&bytes[..8]);
                room[n - 8..].copy_from_slice(&bytes[n - 8..]);
            }
            _ => room.copy_from_slice(bytes),
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

/// Whether `a` and `b` hold the same bytes: short ones (what tool names
/// and arguments mostly are) compared in a few loads, without a call.
#[inline]
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    // Two overlapping words, from the front and from the back, cover it all.
    fn word<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
        let mut word = [0; N];
        word.copy_from_slice(&bytes[at..at + N]);
        word
    }
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => word::<4>(a, 0) == word::<4>(b, 0) && word::<4>(a, n - 4) == word::<4>(b, n - 4),
        8..=16 => word::<8>(a, 0) == word::<8>(b, 0) && word::<8>(a, n - 8) == word::<8>(b, n - 8),
        _ => a == b,
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
    }

    #[test]
    fn a_builder_keeps_pieces_of_every_length() {
        let bytes: Vec<u8> = (1..=INLINE as u8).collect();
        for n in 0..=20 {
            let mut builder = Builder::new();
            let mut expected = Vec::new();
            while expected.len() + n <= INLINE {
                let piece = &bytes[expected.len()..expected.len() + n];
                builder.extend(piece);
                expected.extend_from_slice(piece);
                if n == 0 {
                    break;
                }
            }
            assert_eq!(builder.finish().as_bytes(), &expected[..], "pieces of {n}");
        }
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
    fn same_bytes_compares_every_byte_at_every_length() {
        for n in 0..40 {
            let a: Vec<u8> = (0..n as u8).collect();
            assert!(same_bytes(&a, &a.clone()));
            for i in 0..n {
                let mut b = a.clone();
                b[i] ^= 0x55;
                assert!(!same_bytes(&a, &b), "length {n}, byte {i}");
            }
            assert!(!same_bytes(&a, &a[..n.saturating_sub(1)]) || n == 0);
        }
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
