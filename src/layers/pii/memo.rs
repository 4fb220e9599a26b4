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
//! continues a thread's history scans only what was added.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Slots, indexed by the (random) lineage.
const SLOTS: usize = 64;

/// A fixed table of `(lineage, clean length)` slots, each a seqlock: readers
/// never wait and never see a torn pair; a writer that finds a slot busy
/// skips the write (it is a cache).
pub(super) struct CleanMemo {
    slots: [Slot; SLOTS],
}

#[derive(Default)]
struct Slot {
    /// Even when the slot is stable, odd while it is written.
    seq: AtomicU32,
    lineage: AtomicU64,
    /// How many leading messages of `lineage` were found clean (0: none).
    len: AtomicUsize,
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

    /// How many leading messages of `lineage` are known to hold nothing to
    /// mask (0 when unknown).
    #[inline]
    pub(super) fn clean_len(&self, lineage: u64) -> usize {
        let slot = self.slot(lineage);
        let before = slot.seq.load(Ordering::Acquire);
        if before & 1 == 1 {
            return 0;
        }
        let found = slot.lineage.load(Ordering::Relaxed);
        let len = slot.len.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if slot.seq.load(Ordering::Relaxed) != before || found != lineage {
            return 0;
        }
        len
    }

    /// Records that the first `len` messages of `lineage` hold nothing to
    /// mask.
    pub(super) fn record(&self, lineage: u64, len: usize) {
        if len == 0 || self.clean_len(lineage) >= len {
            return;
        }
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
        slot.len.store(len, Ordering::Relaxed);
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
