//! [`HookPoint`]: the name of every hook, as events and errors carry it.

use std::fmt;

/// One hook point of [`Middleware`](super::Middleware) or of the wrap
/// middleware. Its [`as_str`](Self::as_str) is the `hook` of
/// `MiddlewareStarted`/`MiddlewareCompleted` events and of tripwires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum HookPoint {
    /// A run starts, new or resumed.
    BeforeAgent,
    /// A new run's input, before any model call.
    BeforeRun,
    /// Before each model turn.
    BeforeModel,
    /// Each streamed delta of a model call.
    OnModelDelta,
    /// After each model answer.
    AfterModel,
    /// Before each tool call is decided.
    BeforeTool,
    /// Each streamed delta of a tool call.
    OnToolDelta,
    /// After each tool call.
    AfterTool,
    /// Every call of a step has its result.
    AfterToolBatch,
    /// The agent would stop with a final answer.
    BeforeStop,
    /// Before a compaction.
    BeforeCompaction,
    /// After a compaction.
    AfterCompaction,
    /// Before the run moves to another model.
    BeforeModelSwitch,
    /// A call asks for approval.
    DecideApproval,
    /// Something a person should know.
    OnNotification,
    /// The run failed.
    OnError,
    /// The run ended.
    AfterAgent,
    /// Around each model call.
    WrapModel,
    /// Around each tool call.
    WrapTool,
}

impl HookPoint {
    /// Every hook point, in the order a run meets them.
    pub const ALL: [HookPoint; 19] = [
        HookPoint::BeforeAgent,
        HookPoint::BeforeRun,
        HookPoint::BeforeModel,
        HookPoint::OnModelDelta,
        HookPoint::AfterModel,
        HookPoint::BeforeTool,
        HookPoint::OnToolDelta,
        HookPoint::AfterTool,
        HookPoint::AfterToolBatch,
        HookPoint::BeforeStop,
        HookPoint::BeforeCompaction,
        HookPoint::AfterCompaction,
        HookPoint::BeforeModelSwitch,
        HookPoint::DecideApproval,
        HookPoint::OnNotification,
        HookPoint::OnError,
        HookPoint::AfterAgent,
        HookPoint::WrapModel,
        HookPoint::WrapTool,
    ];

    /// How many hook points there are.
    pub const COUNT: usize = Self::ALL.len();

    /// The hook's name, e.g. `before_model`.
    pub const fn as_str(self) -> &'static str {
        match self {
            HookPoint::BeforeAgent => "before_agent",
            HookPoint::BeforeRun => "before_run",
            HookPoint::BeforeModel => "before_model",
            HookPoint::OnModelDelta => "on_model_delta",
            HookPoint::AfterModel => "after_model",
            HookPoint::BeforeTool => "before_tool",
            HookPoint::OnToolDelta => "on_tool_delta",
            HookPoint::AfterTool => "after_tool",
            HookPoint::AfterToolBatch => "after_tool_batch",
            HookPoint::BeforeStop => "before_stop",
            HookPoint::BeforeCompaction => "before_compaction",
            HookPoint::AfterCompaction => "after_compaction",
            HookPoint::BeforeModelSwitch => "before_model_switch",
            HookPoint::DecideApproval => "decide_approval",
            HookPoint::OnNotification => "on_notification",
            HookPoint::OnError => "on_error",
            HookPoint::AfterAgent => "after_agent",
            HookPoint::WrapModel => "wrap_model",
            HookPoint::WrapTool => "wrap_tool",
        }
    }

    /// Whether the stack runs this hook in reverse registration order: the
    /// hooks that see what comes back (`after_*`, the deltas, `on_error`).
    pub const fn is_reversed(self) -> bool {
        matches!(
            self,
            HookPoint::OnModelDelta
                | HookPoint::AfterModel
                | HookPoint::OnToolDelta
                | HookPoint::AfterTool
                | HookPoint::AfterToolBatch
                | HookPoint::AfterCompaction
                | HookPoint::OnError
                | HookPoint::AfterAgent
        )
    }

    pub(crate) const fn bit(self) -> u32 {
        1 << self as u32
    }
}

// One bit per hook point in a `u32` mask.
const _: () = assert!(HookPoint::COUNT <= 32);

impl fmt::Display for HookPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_fit_a_mask() {
        let names: std::collections::HashSet<_> =
            HookPoint::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(names.len(), HookPoint::COUNT);
        assert_eq!(HookPoint::AfterAgent.to_string(), "after_agent");
    }
}
