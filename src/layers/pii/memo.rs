//! [`CleanMemo`]: which histories an engine already found clean, shared by
//! every clone of one [`MaskPii`](super::MaskPii) service and by every run
//! through it.
//!
//! A [`History`](crate::types::History)'s lineage names one line of growth
//! by appends: two histories of one lineage are states of that line, the
//! shorter a prefix of the longer. So "the first `n` messages of lineage `L`
//! hold nothing to mask" is true of every history of lineage `L`, in any
//! run, and a call whose history is such a prefix sends it unchanged and has
//! nothing to restore, without a look at the run's state. A new run that
//! continues a thread's history scans only what was added. The memo also
//! marks where a lineage first holds something to mask: a call past that
//! mark goes to the run's masking state at once.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Slots, indexed by the (random) lineage.
const SLOTS: usize = 64;

/// A fixed table of `(lineage, what is known)` slots, each a seqlock:
/// readers never wait and never see a torn pair; a writer that finds a slot
/// busy skips the write (it is a cache).
pub(super) struct CleanMemo {
    slots: [Slot; SLOTS],
}

#[derive(Default)]
struct Slot {
    /// Even when the slot is stable, odd while it is written.
    seq: AtomicU32,
    lineage: AtomicU64,
    /// What is known of `lineage`, [`Known::encode`]d (0: nothing).
    known: AtomicUsize,
}

/// What the memo knows of a lineage's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Known {
    /// Nothing.
    Unknown,
    /// The first `n` messages hold nothing to mask (`n > 0`).
    Clean(usize),
    /// The first `n` messages hold nothing to mask, and the next one does:
    /// the run's masking state is needed from there on.
    Dirty(usize),
}

impl Known {
    fn encode(self) -> usize {
        match self {
            Known::Unknown => 0,
            Known::Clean(n) => n << 1,
            Known::Dirty(n) => (n << 1) | 1,
        }
    }

    fn decode(raw: usize) -> Self {
        match (raw >> 1, raw & 1) {
            (0, 0) => Known::Unknown,
            (n, 0) => Known::Clean(n),
            (n, _) => Known::Dirty(n),
        }
    }

    /// How many leading messages are known to hold nothing to mask.
    pub(super) fn clean_len(self) -> usize {
        match self {
            Known::Unknown => 0,
            Known::Clean(n) | Known::Dirty(n) => n,
        }
    }
}

impl Default for CleanMemo {
    fn default() -> Self {
        Self {
            slots: std::array::from_fn(|_| Slot::default()),
        }
    }
}

impl CleanMemo {
    fn slot(&self, lineage: u64) -> &Slot {
        &self.slots[(lineage % SLOTS as u64) as usize]
    }

    /// What is known of `lineage`'s leading messages.
    #[inline]
    pub(super) fn known(&self, lineage: u64) -> Known {
        let slot = self.slot(lineage);
        let before = slot.seq.load(Ordering::Acquire);
        if before & 1 == 1 {
            return Known::Unknown;
        }
        let found = slot.lineage.load(Ordering::Relaxed);
        let known = slot.known.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if slot.seq.load(Ordering::Relaxed) != before || found != lineage {
            return Known::Unknown;
        }
        Known::decode(known)
    }

    /// How many leading messages of `lineage` are known to hold nothing to
    /// mask (0 when unknown).
    #[cfg(test)]
    fn clean_len(&self, lineage: u64) -> usize {
        self.known(lineage).clean_len()
    }

    /// Records that the first `len` messages of `lineage` hold nothing to
    /// mask.
    pub(super) fn record(&self, lineage: u64, len: usize) {
        match self.known(lineage) {
            _ if len == 0 => {}
            Known::Clean(n) if n >= len => {}
            // The next message holds something: no longer prefix is clean.
            Known::Dirty(_) => {}
            _ => self.write(lineage, Known::Clean(len)),
        }
    }

    /// Records that the first `len` messages of `lineage` hold nothing to
    /// mask and the next one does.
    pub(super) fn record_dirty(&self, lineage: u64, len: usize) {
        if !matches!(self.known(lineage), Known::Dirty(_)) {
            self.write(lineage, Known::Dirty(len));
        }
    }

    fn write(&self, lineage: u64, known: Known) {
        let slot = self.slot(lineage);
        let seq = slot.seq.load(Ordering::Relaxed);
        if seq & 1 == 1
            || slot
                .seq
                .compare_exchange(
                    seq,
                    seq.wrapping_add(1),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        fence(Ordering::Release);
        slot.lineage.store(lineage, Ordering::Relaxed);
        slot.known.store(known.encode(), Ordering::Relaxed);
        slot.seq.store(seq.wrapping_add(2), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_the_longest_clean_prefix_per_lineage() {
        let memo = CleanMemo::default();
        assert_eq!(memo.clean_len(7), 0);
        memo.record(7, 3);
        assert_eq!(memo.clean_len(7), 3);
        memo.record(7, 2);
        assert_eq!(memo.clean_len(7), 3, "a shorter prefix changes nothing");
        memo.record(7, 5);
        assert_eq!(memo.clean_len(7), 5);
        // Another lineage in the same slot replaces it; never mixes them.
        memo.record(7 + SLOTS as u64, 1);
        assert_eq!(memo.clean_len(7 + SLOTS as u64), 1);
        assert_eq!(memo.clean_len(7), 0);
        assert_eq!(memo.clean_len(8), 0);
    }

    #[test]
    fn a_dirty_mark_is_final_for_its_lineage() {
        let memo = CleanMemo::default();
        memo.record(9, 2);
        memo.record_dirty(9, 2);
        assert_eq!(memo.known(9), Known::Dirty(2));
        memo.record(9, 4);
        memo.record_dirty(9, 3);
        assert_eq!(memo.known(9), Known::Dirty(2));
        memo.record_dirty(11, 0);
        assert_eq!(memo.known(11), Known::Dirty(0));
        assert_eq!(memo.known(12), Known::Unknown);
    }

    #[test]
    fn concurrent_writers_never_pair_one_lineage_with_anothers_length() {
        let memo = std::sync::Arc::new(CleanMemo::default());
        // Lineages of one slot, each written only with its own length.
        let lineage = |k: u64| 5 + k * SLOTS as u64;
        let writers: Vec<_> = (1..=4u64)
            .map(|k| {
                let memo = memo.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        memo.record(lineage(k), k as usize * 10);
                        // Make room for the next write.
                        memo.record(lineage(k + 10), 1);
                    }
                })
            })
            .collect();
        for _ in 0..50_000 {
            for k in 1..=4u64 {
                let len = memo.clean_len(lineage(k));
                assert!(len == 0 || len == k as usize * 10, "lineage {k} read {len}");
            }
        }
        for w in writers {
            w.join().unwrap();
        }
    }
}
