//! Iterating a [`History`](super::History) across its chunks.

use std::iter::FusedIterator;
use std::sync::Arc;

use super::chunk::Chunk;
use crate::types::Message;

/// The messages of a [`History`](super::History), oldest first; see
/// [`History::iter`](super::History::iter). Double-ended and exact-size.
#[derive(Clone)]
pub struct Iter<'a> {
    chunks: std::slice::Iter<'a, Arc<Chunk>>,
    front: std::slice::Iter<'a, Message>,
    back: std::slice::Iter<'a, Message>,
    remaining: usize,
}

impl<'a> Iter<'a> {
    pub(super) fn new(chunks: &'a [Arc<Chunk>], len: usize) -> Self {
        Self {
            chunks: chunks.iter(),
            front: [].iter(),
            back: [].iter(),
            remaining: len,
        }
    }
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a Message;

    fn next(&mut self) -> Option<&'a Message> {
        loop {
            if let Some(message) = self.front.next() {
                self.remaining -= 1;
                return Some(message);
            }
            match self.chunks.next() {
                Some(chunk) => self.front = chunk.messages.iter(),
                None => {
                    let message = self.back.next()?;
                    self.remaining -= 1;
                    return Some(message);
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(message) = self.back.next_back() {
                self.remaining -= 1;
                return Some(message);
            }
            match self.chunks.next_back() {
                Some(chunk) => self.back = chunk.messages.iter(),
                None => {
                    let message = self.front.next_back()?;
                    self.remaining -= 1;
                    return Some(message);
                }
            }
        }
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl FusedIterator for Iter<'_> {}

impl std::fmt::Debug for Iter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Iter")
            .field("remaining", &self.remaining)
            .finish_non_exhaustive()
    }
}
