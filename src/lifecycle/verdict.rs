//! How the `before_tool` verdicts of several middleware merge.

use crate::hooks::{ToolDecision, ToolVerdict};

/// How strong a decision is: deny > defer > ask > allow >
/// ask-unless-allowed > continue.
pub fn decision_rank(decision: &ToolDecision) -> u8 {
    match decision {
        ToolDecision::Continue => 0,
        ToolDecision::AskUnlessAllowed => 1,
        ToolDecision::Allow => 2,
        ToolDecision::Ask => 3,
        ToolDecision::Defer => 4,
        ToolDecision::Deny { .. } => 5,
    }
}

/// Merges the verdict of a middleware (`later`) into the verdict of those
/// registered before it (`earlier`).
///
/// - The stronger decision wins: deny > defer > ask > allow >
///   ask-unless-allowed > continue (so an allow skips what a permission
///   mode asks, never what a rule or a hook asks). Of
///   two equally strong ones, the earlier stays (the first deny's reason is
///   the one the model reads), with who made it.
/// - Rewrites chain: `later` was asked with `earlier`'s arguments, so its
///   rewrite, if it made one, is the one that counts.
///
/// ```
/// use tower_agent::hooks::{ToolDecision, ToolVerdict};
/// use tower_agent::lifecycle::merge_verdicts;
/// use serde_json::json;
///
/// let first = ToolVerdict::decision(ToolDecision::Allow).with_arguments(json!({"id": 1}));
/// let second = ToolVerdict::deny("not today");
/// let merged = merge_verdicts(first, second);
/// assert_eq!(merged.decision, ToolDecision::Deny { reason: "not today".into() });
/// assert_eq!(merged.updated_arguments, Some(json!({"id": 1})));
/// ```
pub fn merge_verdicts(earlier: ToolVerdict, later: ToolVerdict) -> ToolVerdict {
    let updated_arguments = later.updated_arguments.or(earlier.updated_arguments);
    let (decision, decided_by) =
        if decision_rank(&later.decision) > decision_rank(&earlier.decision) {
            (later.decision, later.decided_by)
        } else {
            (earlier.decision, earlier.decided_by)
        };
    ToolVerdict {
        decision,
        updated_arguments,
        decided_by,
    }
}
