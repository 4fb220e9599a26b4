//! The gate literals' Aho-Corasick automaton as a dense table, stepped by
//! hand: per byte, one load for its class, one for the next state, and one
//! compare that says whether a literal ends there (the match states are
//! numbered last). The [`Matcher`](super::matcher::Matcher) runs it once
//! over a text, with a second byte machine stepped in the same loop, so the
//! text is read once for both.
//!
//! The automaton is the `aho-corasick` crate's DFA (ASCII
//! case-insensitive, every literal reported where it ends), read out state
//! by state: its own search has more to check per byte (special states of
//! several kinds, a prefilter, bounds), none of which a gate pass needs.

use std::collections::HashMap;

use aho_corasick::automaton::{Automaton, StateID};
use aho_corasick::dfa::DFA;
use aho_corasick::{Anchored, MatchKind, StartKind};

/// Set in a transition into a match state.
const MATCHES: u32 = 1 << 31;

/// The automaton over a set of literals.
#[derive(Debug)]
pub(crate) struct Literals {
    /// The class of each byte: bytes every state treats alike share one.
    classes: [u8; 256],
    /// The next state, at `state + class`; states are premultiplied by the
    /// stride. Padded to a power of two, so that a masked index needs no
    /// bounds check.
    next: Box<[u32]>,
    /// Where a search starts.
    start: u32,
    /// The index of the first match state (the states where literals
    /// end, numbered last).
    first_match: u32,
    /// `log2` of the stride (the classes, rounded up to a power of two).
    stride2: u32,
    /// For each match state, in order: the literals that end there, with
    /// their lengths.
    ends: Vec<Vec<(u16, u16)>>,
}

impl Literals {
    /// The automaton over `literals`, matched ASCII case-insensitively.
    ///
    /// # Panics
    ///
    /// If there are 65536 literals or more, or one is that long: the
    /// literals are the crate's own.
    pub(crate) fn new(literals: &[Vec<u8>]) -> Self {
        assert!(literals.len() < usize::from(u16::MAX), "too many literals");
        let dfa = DFA::builder()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::Standard)
            .start_kind(StartKind::Unanchored)
            .prefilter(false)
            .build(literals)
            .expect("the literals compile");
        let start = dfa
            .start_state(Anchored::No)
            .expect("the automaton searches unanchored");

        // Every state reachable from the start, and where each byte leads.
        let mut order: Vec<StateID> = vec![start];
        let mut index: HashMap<StateID, usize> = HashMap::from([(start, 0)]);
        let mut rows: Vec<[usize; 256]> = Vec::new();
        let mut i = 0;
        while i < order.len() {
            let sid = order[i];
            let mut row = [0usize; 256];
            for (b, slot) in row.iter_mut().enumerate() {
                let to = dfa.next_state(Anchored::No, sid, b as u8);
                *slot = *index.entry(to).or_insert_with(|| {
                    order.push(to);
                    order.len() - 1
                });
            }
            rows.push(row);
            i += 1;
        }

        // Bytes whose column is the same in every state share a class.
        let mut classes = [0u8; 256];
        let mut columns: HashMap<Vec<usize>, u8> = HashMap::new();
        for (b, class) in classes.iter_mut().enumerate() {
            let column: Vec<usize> = rows.iter().map(|row| row[b]).collect();
            let next = columns.len();
            *class = *columns
                .entry(column)
                .or_insert_with(|| u8::try_from(next).expect("at most 256 classes"));
        }
        let mut representative = vec![0usize; columns.len()];
        for b in (0..256).rev() {
            representative[usize::from(classes[b])] = b;
        }
        let stride2 = columns.len().next_power_of_two().trailing_zeros();

        // Non-match states first (the start among them), then match states;
        // a transition into a match state has MATCHES set, above every index
        // (the mask drops it), so the states of several bytes are or'ed and
        // tested at once.
        let is_match = |s: usize| dfa.is_match(order[s]);
        let plain = order.iter().filter(|&&s| !dfa.is_match(s)).count();
        let mut renumber = vec![0usize; order.len()];
        let mut next_id = [0, plain];
        for (s, slot) in renumber.iter_mut().enumerate() {
            let kind = usize::from(is_match(s));
            *slot = next_id[kind];
            next_id[kind] += 1;
        }
        let len = (order.len() << stride2).next_power_of_two();
        assert!(len <= MATCHES as usize, "a small table");
        let mut next = vec![0u32; len].into_boxed_slice();
        let target = |s: usize| {
            let id = (renumber[s] << stride2) as u32;
            if is_match(s) {
                id | MATCHES
            } else {
                id
            }
        };
        for (s, row) in rows.iter().enumerate() {
            let base = renumber[s] << stride2;
            for (class, &b) in representative.iter().enumerate() {
                next[base + class] = target(row[b]);
            }
        }
        let mut ends = vec![Vec::new(); order.len() - plain];
        for (s, &sid) in order.iter().enumerate() {
            if !dfa.is_match(sid) {
                continue;
            }
            ends[renumber[s] - plain] = (0..dfa.match_len(sid))
                .map(|k| {
                    let pid = dfa.match_pattern(sid, k);
                    let len = u16::try_from(dfa.pattern_len(pid)).expect("a short literal");
                    (pid.as_usize() as u16, len)
                })
                .collect();
        }
        Literals {
            classes,
            next,
            start: target(0),
            first_match: plain as u32,
            stride2,
            ends,
        }
    }

    /// How many match states there are: [`next_matches`](Self::next_matches)
    /// reports them by their index below this.
    pub(crate) fn match_states(&self) -> usize {
        self.ends.len()
    }

    /// The literals (and their lengths) that end at match state `m`.
    pub(crate) fn ends(&self, m: usize) -> &[(u16, u16)] {
        &self.ends[m]
    }

    /// Where a scan of `text` starts, with `side` stepped beside it.
    pub(crate) fn cursor<S: Side>(&self, side: S) -> Cursor<S> {
        Cursor {
            at: 0,
            state: self.start,
            side,
        }
    }

    /// Steps `cursor` on through `text` (and its side machine with it),
    /// writing where literals end to `out`: the byte's offset and the match
    /// state (see [`ends`](Self::ends)). Returns how many it wrote; fewer
    /// than [`BATCH`] once the text is done.
    #[inline(never)]
    pub(crate) fn next_matches<S: Side>(
        &self,
        text: &[u8],
        cursor: &mut Cursor<S>,
        out: &mut [(usize, usize); BATCH],
    ) -> usize {
        let next = &*self.next;
        let mask = next.len() - 1;
        let classes = &self.classes;
        let step =
            |sid: u32, b: u8| next[(sid as usize + usize::from(classes[usize::from(b)])) & mask];
        let index =
            |sid: u32| ((sid & !MATCHES) >> self.stride2) as usize - self.first_match as usize;
        let mut n = 0;
        let mut at = cursor.at;
        let mut sid = cursor.state;
        let mut side = cursor.side;
        // Four bytes at a time, with one test for all four states.
        let mut quads = text.get(at..).unwrap_or_default().chunks_exact(4);
        while n + 4 <= BATCH {
            let Some(&[b0, b1, b2, b3]) = quads.next() else {
                break;
            };
            side.step(b0);
            let s0 = step(sid, b0);
            side.step(b1);
            let s1 = step(s0, b1);
            side.step(b2);
            let s2 = step(s1, b2);
            side.step(b3);
            let s3 = step(s2, b3);
            if (s0 | s1 | s2 | s3) & MATCHES != 0 {
                for (k, s) in [s0, s1, s2, s3].into_iter().enumerate() {
                    if s & MATCHES != 0 {
                        out[n] = (at + k, index(s));
                        n += 1;
                    }
                }
            }
            sid = s3;
            at += 4;
        }
        while n < BATCH {
            let Some(&b) = text.get(at) else {
                break;
            };
            side.step(b);
            sid = step(sid, b);
            if sid & MATCHES != 0 {
                out[n] = (at, index(sid));
                n += 1;
            }
            at += 1;
        }
        *cursor = Cursor {
            at,
            state: sid,
            side,
        };
        n
    }
}

/// How many matches [`Literals::next_matches`] reports at most at once.
pub(crate) const BATCH: usize = 16;

/// A byte machine stepped beside the automaton, in the same loop.
pub(crate) trait Side: Copy {
    /// Steps over `b`, the next byte of the text.
    fn step(&mut self, b: u8);
}

impl Side for () {
    #[inline(always)]
    fn step(&mut self, _: u8) {}
}

/// Where a scan is: the next byte, the automaton's state, the side
/// machine's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cursor<S> {
    at: usize,
    state: u32,
    /// The side machine, stepped over the bytes before `at`.
    pub(crate) side: S,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (end, literal) the automaton reports in `text`.
    fn found(lits: &Literals, text: &str) -> Vec<(usize, u16)> {
        let mut out = Vec::new();
        let mut cursor = lits.cursor(());
        let mut batch = [(0, 0); BATCH];
        loop {
            let n = lits.next_matches(text.as_bytes(), &mut cursor, &mut batch);
            for &(at, m) in &batch[..n] {
                out.extend(lits.ends(m).iter().map(|&(l, _)| (at, l)));
            }
            if n < BATCH {
                break;
            }
        }
        out.sort_unstable();
        out
    }

    #[test]
    fn every_occurrence_of_every_literal_is_reported_where_it_ends() {
        let words = ["he", "she", "hers", "his", "ignore", "GNOR", "\\u"];
        let lits = Literals::new(&words.map(|w| w.as_bytes().to_vec()));
        let text = "Ushers said: IGNORE his \\u0041, she ignored hers. ".repeat(9);
        let text = text.as_str();
        let mut want = Vec::new();
        let lower = text.to_ascii_lowercase();
        for (l, w) in words.iter().enumerate() {
            let w = w.to_ascii_lowercase();
            for (at, _) in lower.match_indices(&w) {
                want.push((at + w.len() - 1, l as u16));
            }
            // Overlapping occurrences too.
            let mut from = 0;
            while let Some(at) = lower[from..].find(&w) {
                let end = from + at + w.len() - 1;
                if !want.contains(&(end, l as u16)) {
                    want.push((end, l as u16));
                }
                from += at + 1;
            }
        }
        want.sort_unstable();
        assert_eq!(found(&lits, text), want);
        assert!(lits.match_states() > 0);
    }

    #[derive(Clone, Copy, Default)]
    struct Sum(u64);

    impl Side for Sum {
        fn step(&mut self, b: u8) {
            self.0 = self.0.wrapping_mul(31).wrapping_add(u64::from(b));
        }
    }

    #[test]
    fn the_side_machine_sees_every_byte_in_order() {
        let lits = Literals::new(&[b"abc".to_vec()]);
        let text = b"xabcxabc!".repeat(20);
        let mut cursor = lits.cursor(Sum::default());
        let mut ends = Vec::new();
        let mut batch = [(0, 0); BATCH];
        loop {
            let n = lits.next_matches(&text, &mut cursor, &mut batch);
            ends.extend(batch[..n].iter().map(|&(at, _)| at));
            if n < BATCH {
                break;
            }
        }
        let want: Vec<usize> = (0..20).flat_map(|k| [k * 9 + 3, k * 9 + 7]).collect();
        assert_eq!(ends, want);
        let mut want = Sum::default();
        text.iter().for_each(|&b| want.step(b));
        assert_eq!(cursor.side.0, want.0);
    }
}
