//! Which messages marked [`untrusted`](crate::types::Message::untrusted) a
//! guard still has to scan in a run: those added since its last look (the
//! whole history again only after an edit, which
//! [`History::lineage`](crate::types::History::lineage) tells in O(1)), less
//! the ones it already handled.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use crate::context::RunContext;
use crate::types::History;

/// One guard's progress through a run's history.
#[derive(Default)]
struct Progress {
    lineage: u64,
    len: usize,
    /// Digests of the texts it handled (as they stand after handling).
    handled: HashSet<u64>,
}

/// The progress of every guard of a run, by guard name.
#[derive(Clone, Default)]
struct Scans(Arc<Mutex<HashMap<Arc<str>, Progress>>>);

fn scans(ctx: &RunContext) -> Scans {
    ctx.with_state(|state| state.get_or_insert_with(Scans::default).clone())
}

fn digest(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// The indexes of the untrusted messages of `history` that guard `name`
/// has not handled yet in `ctx`'s run.
pub(crate) fn unscanned(ctx: &RunContext, name: &Arc<str>, history: &History) -> Vec<usize> {
    let scans = scans(ctx);
    let mut all = scans.0.lock().unwrap_or_else(PoisonError::into_inner);
    let progress = all.entry(name.clone()).or_default();
    let from = if progress.lineage == history.lineage() && progress.len <= history.len() {
        progress.len
    } else {
        0
    };
    history
        .iter()
        .enumerate()
        .skip(from)
        .filter(|(_, m)| m.untrusted && !progress.handled.contains(&digest(&m.text())))
        .map(|(i, _)| i)
        .collect()
}

/// Guard `name` looked at all of `history`, and handled the messages at
/// `handled` (as they stand now).
pub(crate) fn scanned(ctx: &RunContext, name: &Arc<str>, history: &History, handled: &[usize]) {
    let scans = scans(ctx);
    let mut all = scans.0.lock().unwrap_or_else(PoisonError::into_inner);
    let progress = all.entry(name.clone()).or_default();
    progress.lineage = history.lineage();
    progress.len = history.len();
    for &i in handled {
        if let Some(m) = history.get(i) {
            progress.handled.insert(digest(&m.text()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Message;

    #[test]
    fn only_new_untrusted_messages_are_scanned_and_edits_rescan_without_repeats() {
        let ctx = RunContext::new();
        let name: Arc<str> = Arc::from("g");
        let mut h = History::from(vec![
            Message::user("a"),
            Message::user("doc one").mark_untrusted(),
        ]);
        assert_eq!(unscanned(&ctx, &name, &h), [1]);
        scanned(&ctx, &name, &h, &[1]);
        h.push(Message::user("doc two").mark_untrusted());
        h.push(Message::user("b"));
        assert_eq!(unscanned(&ctx, &name, &h), [2]);
        scanned(&ctx, &name, &h, &[2]);
        assert!(unscanned(&ctx, &name, &h).is_empty());
        h.to_mut().remove(0);
        h.push(Message::user("doc three").mark_untrusted());
        assert_eq!(
            unscanned(&ctx, &name, &h),
            [3],
            "an edit rescans, the handled stay handled"
        );
        assert_eq!(unscanned(&ctx, &Arc::from("other"), &h), [0, 1, 3]);
    }
}
