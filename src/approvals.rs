//! [`StickyApprovals`]: the standing approvals of a run.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::context::RunContext;
use crate::types::{StickyApproval, ToolCall};

/// The standing approvals of a run tree ("always allow this tool", "always
/// allow these arguments"): a shared handle in the root run's state.
///
/// An [`ApprovalDecision`](crate::types::ApprovalDecision) whose
/// [`scope`](crate::types::ApprovalDecision::scope) is not `Once` (from a
/// person at resume, from the agent's approver or from a `decide_approval`
/// hook) leaves a [`StickyApproval`] behind. From then on the run approves a
/// call it covers without asking anyone, whether the call asks (a rule, a
/// permission mode, the tool's own setting) or is deferred. A standing
/// approval never overrides a deny.
///
/// The approvals live in the root run's state, so nested runs share them; a
/// paused run's [`Checkpoint`](crate::types::Checkpoint) carries them, so
/// they survive pause and resume in another process. The tool policy
/// middleware keeps them per thread as well, for the next runs of it.
///
/// ```
/// use tower_agent::hooks::StickyApprovals;
/// use tower_agent::types::{ApprovalDecision, StickyApproval, ToolCall};
/// use tower_agent::RunContext;
///
/// let ctx = RunContext::new();
/// let call = ToolCall::new("c1", "pay", r#"{"id": 7}"#);
/// let always = ApprovalDecision::approve(&call).always_for_arguments();
/// StickyApprovals::of(&ctx).remember(StickyApproval::from_decision(&call, &always).unwrap());
///
/// // A nested run sees it; other arguments are not covered.
/// let nested = StickyApprovals::find(&ctx.child()).unwrap();
/// assert!(nested.covers(&ToolCall::new("c2", "pay", r#"{"id": 7}"#)));
/// assert!(!nested.covers(&ToolCall::new("c3", "pay", r#"{"id": 8}"#)));
/// ```
///
/// # Clone
///
/// Clones share the approvals.
#[derive(Clone, Default)]
pub struct StickyApprovals(Arc<Mutex<Vec<StickyApproval>>>);

impl StickyApprovals {
    /// An empty set, not yet installed in any run.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<StickyApproval>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The set of `ctx`'s run: its own, or the nearest enclosing run's.
    pub fn find(ctx: &RunContext) -> Option<Self> {
        let mut current = Some(ctx);
        while let Some(c) = current {
            if let Some(found) = c.state::<StickyApprovals>() {
                return Some(found);
            }
            current = c.parent();
        }
        None
    }

    /// The set of `ctx`'s run, or a new one installed in its root run.
    pub fn of(ctx: &RunContext) -> Self {
        if let Some(found) = Self::find(ctx) {
            return found;
        }
        ctx.root()
            .with_state(|s| s.get_or_insert_with(StickyApprovals::new).clone())
    }

    /// Installs `self` in `ctx`'s run, unless its run tree has a set: then
    /// the two are merged into that one, which stays.
    pub fn install(&self, ctx: &RunContext) {
        match Self::find(ctx) {
            Some(found) if Arc::ptr_eq(&found.0, &self.0) => {}
            Some(found) => {
                found.extend(self.to_vec());
                self.extend(found.to_vec());
            }
            None => {
                ctx.insert_state(self.clone());
            }
        }
    }

    /// Whether a standing approval covers `call`.
    pub fn covers(&self, call: &ToolCall) -> bool {
        self.lock().iter().any(|a| a.covers(call))
    }

    /// Adds `approval`; `false` if it was there already.
    pub fn remember(&self, approval: StickyApproval) -> bool {
        let mut approvals = self.lock();
        if approvals.contains(&approval) {
            return false;
        }
        approvals.push(approval);
        true
    }

    /// Adds every approval of `approvals` not there yet.
    pub fn extend(&self, approvals: impl IntoIterator<Item = StickyApproval>) {
        for approval in approvals {
            self.remember(approval);
        }
    }

    /// The approvals, in the order they were given.
    pub fn to_vec(&self) -> Vec<StickyApproval> {
        self.lock().clone()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

impl fmt::Debug for StickyApprovals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.lock().iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval(tool: &str) -> StickyApproval {
        StickyApproval {
            tool: tool.into(),
            arguments_hash: None,
        }
    }

    #[test]
    fn one_set_per_run_tree_and_install_merges() {
        let root = RunContext::new();
        let child = root.child();
        assert!(StickyApprovals::find(&child).is_none());
        // Made from a nested run, the set lands in the root.
        StickyApprovals::of(&child).remember(approval("a"));
        assert!(StickyApprovals::find(&root)
            .unwrap()
            .covers(&ToolCall::new("1", "a", "{}")));

        let thread = StickyApprovals::new();
        thread.remember(approval("b"));
        thread.install(&root);
        let set = StickyApprovals::of(&root);
        assert_eq!(set.to_vec(), [approval("a"), approval("b")]);
        assert_eq!(thread.to_vec(), [approval("b"), approval("a")]);
        assert!(!set.remember(approval("a")), "no duplicates");

        let fresh = RunContext::new();
        thread.install(&fresh);
        assert!(StickyApprovals::find(&fresh)
            .unwrap()
            .covers(&ToolCall::new("2", "b", "{}")));
    }
}
