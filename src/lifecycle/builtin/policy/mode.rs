//! [`PermissionMode`]: what a tool policy does with the calls its rules
//! leave open, per run.

use serde::{Deserialize, Serialize};

use crate::context::RunContext;
use crate::hooks::ToolDecision;

/// What a tool policy does with a call no rule decided, and with a call
/// that would ask. Set per run in the run's state
/// (`RunContext::builder().state(PermissionMode::Auto)`, or
/// [`insert_state`](RunContext::insert_state) from a hook); a nested run
/// inherits its parent's. The policy's own mode applies to a run that sets
/// none.
///
/// | mode | a deny rule | an ask rule | an allow rule | no rule matches |
/// | --- | --- | --- | --- | --- |
/// | `default` | denied | asks | runs | the tool's own setting: asks if it requires approval, else runs |
/// | `ask` | denied | asks | runs | asks, unless a `before_tool` hook allows it |
/// | `auto` | denied | asks | runs | runs, without the tool's own approval |
/// | `dont_ask` | denied | declined | runs | runs, unless the tool requires approval: declined |
///
/// In `dont_ask` mode the policy declines, without pausing, whatever would
/// ask (its `decide_approval` answers), unless a standing approval covers
/// the call. A `before_tool` hook's *allow* skips only what the mode or the
/// tool's own setting would ask, never a deny or ask rule.
///
/// ```
/// use tower_agent::lifecycle::builtin::policy::PermissionMode;
/// use tower_agent::RunContext;
///
/// let ctx = RunContext::builder().state(PermissionMode::DontAsk).build();
/// assert_eq!(PermissionMode::of(&ctx.child()), Some(PermissionMode::DontAsk));
/// let mode: PermissionMode = serde_json::from_str(r#""dont_ask""#).unwrap();
/// assert_eq!(mode.as_str(), "dont_ask");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionMode {
    /// Rules, then the tool's own approval setting.
    #[default]
    Default,
    /// Ask for everything no rule allows.
    Ask,
    /// Approve everything no deny or ask rule stops.
    Auto,
    /// Decline, without pausing, what would ask.
    #[serde(alias = "dontAsk")]
    DontAsk,
}

impl PermissionMode {
    /// `default`, `ask`, `auto` or `dont_ask`.
    pub fn as_str(&self) -> &'static str {
        match self {
            PermissionMode::Default => "default",
            PermissionMode::Ask => "ask",
            PermissionMode::Auto => "auto",
            PermissionMode::DontAsk => "dont_ask",
        }
    }

    /// The mode set in the state of `ctx`'s run, or of the nearest run it is
    /// nested in.
    pub fn of(ctx: &RunContext) -> Option<PermissionMode> {
        let mut current = Some(ctx);
        while let Some(c) = current {
            if let Some(mode) = c.state::<PermissionMode>() {
                return Some(mode);
            }
            current = c.parent();
        }
        None
    }

    /// What the mode decides for a call no rule matched.
    pub(crate) fn unruled(self) -> ToolDecision {
        match self {
            PermissionMode::Default | PermissionMode::DontAsk => ToolDecision::Continue,
            PermissionMode::Ask => ToolDecision::AskUnlessAllowed,
            PermissionMode::Auto => ToolDecision::Allow,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_each_mode_does_with_an_open_call() {
        assert_eq!(PermissionMode::Default.unruled(), ToolDecision::Continue);
        assert_eq!(
            PermissionMode::Ask.unruled(),
            ToolDecision::AskUnlessAllowed
        );
        assert_eq!(PermissionMode::Auto.unruled(), ToolDecision::Allow);
        assert_eq!(PermissionMode::DontAsk.unruled(), ToolDecision::Continue);
    }

    #[test]
    fn the_nearest_run_sets_it() {
        let root = RunContext::builder().state(PermissionMode::Ask).build();
        let child = root.child();
        child.insert_state(PermissionMode::Auto);
        assert_eq!(
            PermissionMode::of(&child.child()),
            Some(PermissionMode::Auto)
        );
        assert_eq!(PermissionMode::of(&root), Some(PermissionMode::Ask));
        assert_eq!(PermissionMode::of(&RunContext::new()), None);
        let camel: PermissionMode = serde_json::from_str(r#""dontAsk""#).unwrap();
        assert_eq!(camel, PermissionMode::DontAsk);
    }
}
