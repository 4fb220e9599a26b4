//! [`MiddlewareStack`]: the one ordered list of middleware, and the compiled
//! form a run uses, which learns which hooks each middleware overrides.

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::wrap::{ModelOnly, ToolOnly};
use super::{FailPolicy, HookPoint, Middleware, ModelMiddleware, ToolMiddleware};

/// One ordered list of middleware: lifecycle hooks and wrap hooks alike.
///
/// Registration order is the onion: `before_*` hooks run in it, `after_*`
/// hooks in reverse, and the first wrap hook is the outermost. Hand the
/// stack to an agent ([`AgentBuilder::middleware`](crate::AgentBuilder::middleware)),
/// a [`LifecycleLayer`](super::LifecycleLayer), a
/// [`Runtime`](super::Runtime) (every run of a runtime) or a
/// [`RunMiddleware`](super::RunMiddleware) (one run).
///
/// ```
/// use tower_agent::lifecycle::{LoggingMiddleware, MiddlewareStack};
///
/// let logging = LoggingMiddleware::named("log");
/// let stack = MiddlewareStack::new()
///     .push(logging.clone())
///     .before_model("reminder", |ctx, messages| {
///         if ctx.iteration() == 5 {
///             messages.push(tower_agent::Message::user("Wrap up soon."));
///         }
///         Ok(())
///     });
/// assert_eq!(stack.len(), 2);
/// assert_eq!(stack.names().collect::<Vec<_>>(), ["log", "reminder"]);
/// ```
///
/// # Clone
///
/// Cheap: the middleware are shared, and so is what the stack learned about
/// them.
#[derive(Clone, Default)]
pub struct MiddlewareStack {
    entries: Vec<StackEntry>,
}

impl MiddlewareStack {
    /// An empty stack.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a middleware after (inside) the ones already there.
    pub fn push(self, middleware: impl Middleware) -> Self {
        self.push_arc(Arc::new(middleware))
    }

    /// Registers a shared middleware.
    pub fn push_arc(mut self, middleware: Arc<dyn Middleware>) -> Self {
        self.entries.push(Arc::new(Registered::new(middleware)));
        self
    }

    /// Registers a middleware of the crate's own whose overridden hooks
    /// are known from how it was built (a closure's hook point, a
    /// wrap-only middleware's wrap hook): the stack knows the rest are
    /// absent from the start, delta hooks among them, which it could
    /// otherwise learn only from a delta.
    pub(crate) fn push_known(
        mut self,
        middleware: impl Middleware,
        overrides: &[HookPoint],
    ) -> Self {
        let present = overrides.iter().fold(0, |bits, hook| bits | hook.bit());
        let mut entry = Registered::new(Arc::new(middleware));
        *entry.absent.get_mut() = ALL_HOOKS & !present;
        self.entries.push(Arc::new(entry));
        self
    }

    /// Registers a wrap-only model middleware (a [`from_fn`](super::from_fn)
    /// among them) inside the ones already there.
    pub fn push_model(self, middleware: impl ModelMiddleware) -> Self {
        self.push_model_arc(Arc::new(middleware))
    }

    /// Registers a shared wrap-only model middleware.
    pub fn push_model_arc(self, middleware: Arc<dyn ModelMiddleware>) -> Self {
        self.push_known(ModelOnly(middleware), &[HookPoint::WrapModel])
    }

    /// Registers a wrap-only tool middleware inside the ones already there.
    pub fn push_tool(self, middleware: impl ToolMiddleware) -> Self {
        self.push_tool_arc(Arc::new(middleware))
    }

    /// Registers a shared wrap-only tool middleware.
    pub fn push_tool_arc(self, middleware: Arc<dyn ToolMiddleware>) -> Self {
        self.push_known(ToolOnly(middleware), &[HookPoint::WrapTool])
    }

    /// Appends every middleware of `other`, inside these.
    pub fn extend(mut self, other: MiddlewareStack) -> Self {
        self.entries.extend(other.entries);
        self
    }

    /// How many middleware.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The names, in registration order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| &*e.name)
    }

    /// The compiled form a run uses.
    pub(crate) fn compile(&self) -> Arc<CompiledStack> {
        Arc::new(CompiledStack::build(self.entries.clone()))
    }
}

impl fmt::Debug for MiddlewareStack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

/// A registered middleware, shared by every stack compiled or composed from
/// it.
pub(crate) type StackEntry = Arc<Registered>;

/// A middleware with what the stack reads once, and what it learned: the
/// hook points where it answered "not overridden".
pub(crate) struct Registered {
    pub(crate) mw: Arc<dyn Middleware>,
    pub(crate) name: Arc<str>,
    pub(crate) fail_open: bool,
    pub(crate) holds_stream: bool,
    /// One bit per [`HookPoint`]: set once the middleware answered "not
    /// overridden" there.
    absent: AtomicU32,
}

impl Registered {
    fn new(mw: Arc<dyn Middleware>) -> Self {
        Self {
            name: Arc::from(mw.name()),
            fail_open: mw.fail_policy() == FailPolicy::Open,
            holds_stream: mw.holds_stream(),
            absent: AtomicU32::new(0),
            mw,
        }
    }

    /// Whether the middleware may override `hook`: not yet seen answering
    /// "not overridden" there.
    #[inline]
    pub(crate) fn may_override(&self, hook: HookPoint) -> bool {
        self.absent.load(Ordering::Relaxed) & hook.bit() == 0
    }

    /// Records that the middleware does not override `hook`.
    #[inline]
    pub(crate) fn learn_absent(&self, hook: HookPoint) {
        if self.absent.fetch_or(hook.bit(), Ordering::Relaxed) & hook.bit() == 0 {
            // The stacks' masks are stale now: each reads them again once.
            LEARNED.fetch_add(1, Ordering::Release);
        }
    }
}

/// Every hook point's bit.
const ALL_HOOKS: u32 = (1 << HookPoint::COUNT) - 1;

/// How many times a middleware was first seen not overriding a hook point,
/// in the process: while it stands still, a stack's masks are exact.
static LEARNED: AtomicU32 = AtomicU32::new(0);

/// Where the parts of a stack's [`Masks`] sit in one `u64`: the hook
/// points any middleware may override, those two or more may, and the
/// low bits of [`LEARNED`] they were read at.
const MASK_BITS: u32 = 20;
const MASK: u64 = (1 << MASK_BITS) - 1;
const GEN_SHIFT: u32 = 2 * MASK_BITS;
const GEN_MASK: u32 = (1 << (64 - GEN_SHIFT)) - 1;
const _: () = assert!(HookPoint::COUNT <= MASK_BITS as usize);

/// What the middleware of a stack may still override, as of a count of
/// [`LEARNED`]. Read again when the count moved; a stale copy only ever
/// holds more than the truth (learning takes bits away), so a hook point it
/// still names is called and answers "not overridden" once more, never the
/// other way round.
struct Masks(AtomicU64);

impl Masks {
    /// Nothing known yet: every hook point may run.
    fn unknown() -> Self {
        Masks(AtomicU64::new(u64::MAX))
    }
}

/// A compiled stack: what one run (or one placement level) uses.
pub(crate) struct CompiledStack {
    /// In registration order; wrap chains walk it from the start.
    pub(crate) entries: Arc<[StackEntry]>,
    pub(crate) holds_stream: bool,
    /// The hook points where the middleware may run, derived once for the
    /// stack (again only after one of them learned something): a hook point
    /// no middleware overrides costs a bit test, however many there are.
    masks: Masks,
}

impl CompiledStack {
    fn build(entries: Vec<StackEntry>) -> CompiledStack {
        let holds_stream = entries.iter().any(|e| e.holds_stream);
        CompiledStack {
            entries: entries.into(),
            holds_stream,
            masks: Masks::unknown(),
        }
    }

    /// The hook points any middleware here may override, and those two or
    /// more may: exact while nothing was learned since they were read.
    #[inline]
    fn masks(&self) -> (u32, u32) {
        let gen = LEARNED.load(Ordering::Acquire) & GEN_MASK;
        let cached = self.masks.0.load(Ordering::Relaxed);
        if (cached >> GEN_SHIFT) as u32 == gen {
            return (
                (cached & MASK) as u32,
                ((cached >> MASK_BITS) & MASK) as u32,
            );
        }
        self.read_masks(gen)
    }

    #[cold]
    #[inline(never)]
    fn read_masks(&self, gen: u32) -> (u32, u32) {
        let (mut any, mut several) = (0, 0);
        for e in self.entries.iter() {
            let may = !e.absent.load(Ordering::Relaxed) & ALL_HOOKS;
            several |= any & may;
            any |= may;
        }
        let packed =
            (u64::from(gen) << GEN_SHIFT) | (u64::from(several) << MASK_BITS) | u64::from(any);
        self.masks.0.store(packed, Ordering::Relaxed);
        (any, several)
    }

    /// The hook points any middleware here may override.
    #[inline]
    fn may(&self) -> u32 {
        self.masks().0
    }

    /// The empty stack, built once and shared.
    pub(crate) fn empty() -> Arc<CompiledStack> {
        static EMPTY: OnceLock<Arc<CompiledStack>> = OnceLock::new();
        EMPTY
            .get_or_init(|| Arc::new(CompiledStack::build(Vec::new())))
            .clone()
    }

    /// The levels one after the other (the first outermost), as one stack.
    pub(crate) fn compose(levels: &[&Arc<CompiledStack>]) -> Arc<CompiledStack> {
        let mut non_empty = levels.iter().filter(|s| !s.is_empty());
        match (non_empty.next(), non_empty.next()) {
            (None, _) => CompiledStack::empty(),
            (Some(only), None) => Arc::clone(only),
            _ => Arc::new(CompiledStack::build(
                levels
                    .iter()
                    .flat_map(|s| s.entries.iter().cloned())
                    .collect(),
            )),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether no middleware here can ever do anything: none at all, or
    /// each seen leaving every hook point alone.
    pub(crate) fn inert(&self) -> bool {
        !self.holds_stream && self.may() == 0
    }

    /// Whether any middleware may run at `hook`. Exact once each has met
    /// the hook point: a middleware that does not override it answers so
    /// once, then never counts again.
    #[inline]
    pub(crate) fn has(&self, hook: HookPoint) -> bool {
        self.may() & hook.bit() != 0
    }

    /// The one middleware that may run at `hook`, if exactly one may.
    #[inline]
    pub(crate) fn sole(&self, hook: HookPoint) -> Option<&StackEntry> {
        let (any, several) = self.masks();
        if (any & !several) & hook.bit() == 0 {
            return None;
        }
        self.entries.iter().find(|e| e.may_override(hook))
    }

    /// The middleware that may run at `hook`, in the order to call them
    /// (reversed for the hooks that see what comes back).
    #[inline]
    pub(crate) fn at(&self, hook: HookPoint) -> impl Iterator<Item = &StackEntry> {
        let n = if self.has(hook) {
            self.entries.len()
        } else {
            0
        };
        let reversed = hook.is_reversed();
        (0..n)
            .map(move |i| &self.entries[if reversed { n - 1 - i } else { i }])
            .filter(move |e| e.may_override(hook))
    }

    /// Whether a model call needs this stack: wrap hooks, or delta hooks
    /// when the call `streams`.
    pub(crate) fn wraps_model(&self, streams: bool) -> bool {
        let delta = if streams {
            HookPoint::OnModelDelta.bit()
        } else {
            0
        };
        self.may() & (HookPoint::WrapModel.bit() | delta) != 0
    }

    /// Whether a call to a tool stack that `streams` its progress (or not)
    /// needs this stack.
    pub(crate) fn wraps_tool(&self, streams: bool) -> bool {
        let delta = if streams {
            HookPoint::OnToolDelta.bit()
        } else {
            0
        };
        self.may() & (HookPoint::WrapTool.bit() | delta) != 0
    }
}

impl fmt::Debug for CompiledStack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| &*e.name))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Overrides nothing.
    struct Nothing;

    impl Middleware for Nothing {
        fn name(&self) -> &str {
            "nothing"
        }
    }

    #[test]
    fn the_masks_follow_what_the_middleware_are_seen_to_leave_alone() {
        let hook = HookPoint::BeforeModel;
        let stack = MiddlewareStack::new().push(Nothing).push(Nothing).compile();
        assert!(stack.has(hook));
        assert!(stack.sole(hook).is_none(), "two may run");

        stack.entries[0].learn_absent(hook);
        assert!(stack.has(hook));
        let sole = stack.sole(hook).expect("one may run");
        assert!(Arc::ptr_eq(sole, &stack.entries[1]));

        // Another stack of the same middleware learns it too.
        let composed = CompiledStack::compose(&[&stack, &stack]);
        stack.entries[1].learn_absent(hook);
        assert!(!stack.has(hook));
        assert!(stack.sole(hook).is_none());
        assert!(!composed.has(hook));
        assert!(composed.has(HookPoint::AfterModel));

        assert!(!stack.inert());
        for e in stack.entries.iter() {
            for hook in HookPoint::ALL {
                e.learn_absent(hook);
            }
        }
        assert!(stack.inert());
        assert!(composed.inert());
    }
}
