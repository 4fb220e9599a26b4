//! [`EditWatch`]: tells whoever watches a run's messages (a prompt-cache
//! guard) which middleware changed them. Costs one atomic load per hook
//! point in a run nobody watches.

use std::sync::Arc;

use crate::context::RunContext;
use crate::types::History;

/// Something that wants to know who changed a run's messages: the stack
/// calls it after each `before_model` edit, the wrap chain after each
/// `wrap_model` that hands on other messages.
pub(crate) trait EditWatch: Send + Sync + 'static {
    /// `by` changed the messages from `before` to `after`. Called only
    /// when they differ.
    fn record(&self, by: &Arc<str>, before: History, after: &History);
}

/// The run's watcher, in its typed state.
#[derive(Clone)]
struct Watcher(Arc<dyn EditWatch>);

/// The run's watcher, if something watches its messages.
pub(crate) fn watcher(ctx: &RunContext) -> Option<Arc<dyn EditWatch>> {
    if !ctx.maybe_watched() {
        return None;
    }
    ctx.with_state(|s| s.get::<Watcher>().map(|w| w.0.clone()))
}

/// Starts watching `ctx`'s run with `make()`, unless something already
/// watches it; returns the watcher.
pub(crate) fn watch(
    ctx: &RunContext,
    make: impl FnOnce() -> Arc<dyn EditWatch>,
) -> Arc<dyn EditWatch> {
    ctx.set_watched();
    ctx.with_state(|s| s.get_or_insert_with(|| Watcher(make())).0.clone())
}
