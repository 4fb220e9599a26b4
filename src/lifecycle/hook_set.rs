//! [`HookPoint`] names every hook; a [`HookSet`] is a set of them: what a
//! middleware declares it overrides.

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

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
    /// Around each model call ([`ModelMiddleware`](super::ModelMiddleware)).
    WrapModel,
    /// Around each tool call ([`ToolMiddleware`](super::ToolMiddleware)).
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

    const fn bit(self) -> u32 {
        1 << self as u32
    }
}

impl fmt::Display for HookPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of [`HookPoint`]s: what a middleware overrides.
///
/// The stack calls a middleware only at the hook points its
/// [`hooks`](super::Middleware::hooks) declares, so a no-op default costs
/// nothing: no call, no allocation, no boxed future.
///
/// ```
/// use tower_agent::lifecycle::{HookPoint, HookSet};
///
/// let set = HookSet::BEFORE_MODEL | HookSet::AFTER_MODEL;
/// assert!(set.contains(HookPoint::AfterModel));
/// assert!(!set.contains(HookPoint::BeforeTool));
/// assert_eq!(set.iter().count(), 2);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HookSet(u32);

macro_rules! hook_consts {
    ($($name:ident = $point:ident),* $(,)?) => {
        impl HookSet {
            $(
                #[doc = concat!("Just [`HookPoint::", stringify!($point), "`].")]
                pub const $name: HookSet = HookSet(HookPoint::$point.bit());
            )*
        }
    };
}

hook_consts! {
    BEFORE_AGENT = BeforeAgent,
    BEFORE_RUN = BeforeRun,
    BEFORE_MODEL = BeforeModel,
    ON_MODEL_DELTA = OnModelDelta,
    AFTER_MODEL = AfterModel,
    BEFORE_TOOL = BeforeTool,
    ON_TOOL_DELTA = OnToolDelta,
    AFTER_TOOL = AfterTool,
    AFTER_TOOL_BATCH = AfterToolBatch,
    BEFORE_STOP = BeforeStop,
    BEFORE_COMPACTION = BeforeCompaction,
    AFTER_COMPACTION = AfterCompaction,
    BEFORE_MODEL_SWITCH = BeforeModelSwitch,
    DECIDE_APPROVAL = DecideApproval,
    ON_NOTIFICATION = OnNotification,
    ON_ERROR = OnError,
    AFTER_AGENT = AfterAgent,
}

impl HookSet {
    /// No hook.
    pub const EMPTY: HookSet = HookSet(0);

    /// Every lifecycle hook (the default of
    /// [`Middleware::hooks`](super::Middleware::hooks)).
    pub const ALL: HookSet = {
        let mut bits = 0;
        let mut i = 0;
        while i < HookPoint::COUNT {
            let point = HookPoint::ALL[i];
            if !matches!(point, HookPoint::WrapModel | HookPoint::WrapTool) {
                bits |= point.bit();
            }
            i += 1;
        }
        HookSet(bits)
    };

    /// The set holding just `point`.
    pub const fn of(point: HookPoint) -> HookSet {
        HookSet(point.bit())
    }

    /// Whether `point` is in the set.
    pub const fn contains(self, point: HookPoint) -> bool {
        self.0 & point.bit() != 0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Both sets.
    pub const fn union(self, other: HookSet) -> HookSet {
        HookSet(self.0 | other.0)
    }

    /// The hook points in the set, in [`HookPoint::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = HookPoint> {
        HookPoint::ALL
            .into_iter()
            .filter(move |p| self.contains(*p))
    }
}

impl BitOr for HookSet {
    type Output = HookSet;

    fn bitor(self, rhs: HookSet) -> HookSet {
        self.union(rhs)
    }
}

impl BitOrAssign for HookSet {
    fn bitor_assign(&mut self, rhs: HookSet) {
        *self = self.union(rhs);
    }
}

impl From<HookPoint> for HookSet {
    fn from(point: HookPoint) -> Self {
        HookSet::of(point)
    }
}

impl FromIterator<HookPoint> for HookSet {
    fn from_iter<I: IntoIterator<Item = HookPoint>>(iter: I) -> Self {
        iter.into_iter()
            .fold(HookSet::EMPTY, |set, p| set | p.into())
    }
}

impl fmt::Debug for HookSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.iter().map(HookPoint::as_str))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_all_excludes_wraps() {
        let names: std::collections::HashSet<_> =
            HookPoint::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(names.len(), HookPoint::COUNT);
        assert!(!HookSet::ALL.contains(HookPoint::WrapModel));
        assert!(HookSet::ALL.contains(HookPoint::AfterAgent));
        assert_eq!(HookSet::ALL.iter().count(), HookPoint::COUNT - 2);
        let set: HookSet = [HookPoint::BeforeTool, HookPoint::AfterTool]
            .into_iter()
            .collect();
        assert_eq!(format!("{set:?}"), r#"{"before_tool", "after_tool"}"#);
    }
}
