//! [`MiddlewareStack`]: the ordered lists of middleware, and their compiled
//! form the run uses.

use std::fmt;
use std::sync::{Arc, OnceLock};

use super::invoke::Entry;
use super::wrap::{Link, ModelLink, ToolLink};
use super::{HookPoint, Middleware, ModelMiddleware, ToolMiddleware};
use crate::request::{ModelCall, ToolInvocation};

/// Three ordered lists: lifecycle [`Middleware`], [`ModelMiddleware`] and
/// [`ToolMiddleware`].
///
/// Registration order is the onion: `before_*` hooks run in it, `after_*`
/// hooks in reverse, and the first wrap middleware is the outermost. Hand
/// the stack to a [`LifecycleLayer`](super::LifecycleLayer) (an agent's), a
/// [`Runtime`](super::Runtime) (every run of a runtime) or a
/// [`RunMiddleware`](super::RunMiddleware) (one run).
///
/// ```
/// use tower_agent::lifecycle::{LoggingMiddleware, MiddlewareStack};
///
/// let logging = LoggingMiddleware::named("log");
/// let stack = MiddlewareStack::new().push(logging.clone());
/// assert_eq!(stack.len(), 1);
/// assert_eq!(stack.names().collect::<Vec<_>>(), ["log"]);
/// ```
///
/// # Clone
///
/// Cheap: the middleware are shared.
#[derive(Clone, Default)]
pub struct MiddlewareStack {
    lifecycle: Vec<Arc<dyn Middleware>>,
    model: Vec<Arc<dyn ModelMiddleware>>,
    tool: Vec<Arc<dyn ToolMiddleware>>,
}

impl MiddlewareStack {
    /// An empty stack.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a lifecycle middleware after the ones already there.
    pub fn push(self, middleware: impl Middleware) -> Self {
        self.push_arc(Arc::new(middleware))
    }

    /// Registers a shared lifecycle middleware.
    pub fn push_arc(mut self, middleware: Arc<dyn Middleware>) -> Self {
        self.lifecycle.push(middleware);
        self
    }

    /// Registers a model wrap middleware inside the ones already there.
    pub fn push_model(self, middleware: impl ModelMiddleware) -> Self {
        self.push_model_arc(Arc::new(middleware))
    }

    /// Registers a shared model wrap middleware.
    pub fn push_model_arc(mut self, middleware: Arc<dyn ModelMiddleware>) -> Self {
        self.model.push(middleware);
        self
    }

    /// Registers a tool wrap middleware inside the ones already there.
    pub fn push_tool(self, middleware: impl ToolMiddleware) -> Self {
        self.push_tool_arc(Arc::new(middleware))
    }

    /// Registers a shared tool wrap middleware.
    pub fn push_tool_arc(mut self, middleware: Arc<dyn ToolMiddleware>) -> Self {
        self.tool.push(middleware);
        self
    }

    /// Appends every middleware of `other`, inside these.
    pub fn extend(mut self, other: MiddlewareStack) -> Self {
        self.lifecycle.extend(other.lifecycle);
        self.model.extend(other.model);
        self.tool.extend(other.tool);
        self
    }

    /// How many middleware of all three kinds.
    pub fn len(&self) -> usize {
        self.lifecycle.len() + self.model.len() + self.tool.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The names of the lifecycle, then the model, then the tool middleware.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.lifecycle
            .iter()
            .map(|m| m.name())
            .chain(self.model.iter().map(|m| m.name()))
            .chain(self.tool.iter().map(|m| m.name()))
    }

    /// The compiled form: names, declared hooks and per-hook lists read once.
    pub(crate) fn compile(&self) -> Arc<Stack> {
        Arc::new(Stack::build(
            self.lifecycle.iter().cloned().map(Entry::new).collect(),
            self.model
                .iter()
                .map(|m| Link {
                    name: Arc::from(m.name()),
                    wrap: Arc::new(ModelLink(m.clone())),
                })
                .collect(),
            self.tool
                .iter()
                .map(|m| Link {
                    name: Arc::from(m.name()),
                    wrap: Arc::new(ToolLink(m.clone())),
                })
                .collect(),
            self.model.iter().any(|m| m.holds_stream()),
        ))
    }
}

impl fmt::Debug for MiddlewareStack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MiddlewareStack")
            .field(
                "lifecycle",
                &self.lifecycle.iter().map(|m| m.name()).collect::<Vec<_>>(),
            )
            .field(
                "model",
                &self.model.iter().map(|m| m.name()).collect::<Vec<_>>(),
            )
            .field(
                "tool",
                &self.tool.iter().map(|m| m.name()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A compiled stack: what one run (or one placement level) uses.
pub(crate) struct Stack {
    pub(crate) entries: Box<[Entry]>,
    /// Per hook point, the entries to call, in the order to call them.
    lists: [Box<[u32]>; HookPoint::COUNT],
    pub(crate) model: Arc<[Link<ModelCall>]>,
    pub(crate) tool: Arc<[Link<ToolInvocation>]>,
    pub(crate) holds_stream: bool,
}

impl Stack {
    fn build(
        entries: Vec<Entry>,
        model: Vec<Link<ModelCall>>,
        tool: Vec<Link<ToolInvocation>>,
        model_holds_stream: bool,
    ) -> Stack {
        let lists = std::array::from_fn(|i| {
            let hook = HookPoint::ALL[i];
            // Debug builds call undeclared async hooks too, to catch a
            // declaration that leaves out an override. Delta hooks are
            // synchronous and cannot be checked, so only declared ones run.
            let checked = cfg!(debug_assertions)
                && !matches!(hook, HookPoint::OnModelDelta | HookPoint::OnToolDelta);
            let mut list: Vec<u32> = (0..entries.len() as u32)
                .filter(|&j| checked || entries[j as usize].hooks.contains(hook))
                .collect();
            if hook.is_reversed() {
                list.reverse();
            }
            list.into_boxed_slice()
        });
        let holds_stream = model_holds_stream || entries.iter().any(|e| e.holds_stream);
        Stack {
            entries: entries.into_boxed_slice(),
            lists,
            model: model.into(),
            tool: tool.into(),
            holds_stream,
        }
    }

    /// The empty stack, built once and shared.
    pub(crate) fn empty() -> Arc<Stack> {
        static EMPTY: OnceLock<Arc<Stack>> = OnceLock::new();
        EMPTY
            .get_or_init(|| Arc::new(Stack::build(Vec::new(), Vec::new(), Vec::new(), false)))
            .clone()
    }

    /// The levels one after the other (the first outermost), as one stack.
    pub(crate) fn compose(levels: &[&Arc<Stack>]) -> Arc<Stack> {
        let mut non_empty = levels.iter().filter(|s| !s.is_empty());
        match (non_empty.next(), non_empty.next()) {
            (None, _) => Stack::empty(),
            (Some(only), None) => Arc::clone(only),
            _ => Arc::new(Stack::build(
                levels
                    .iter()
                    .flat_map(|s| s.entries.iter().cloned())
                    .collect(),
                levels
                    .iter()
                    .flat_map(|s| s.model.iter().cloned())
                    .collect(),
                levels.iter().flat_map(|s| s.tool.iter().cloned()).collect(),
                levels.iter().any(|s| s.holds_stream),
            )),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.model.is_empty() && self.tool.is_empty()
    }

    /// Whether any middleware is called at `hook`.
    #[inline]
    pub(crate) fn has(&self, hook: HookPoint) -> bool {
        !self.lists[hook as usize].is_empty()
    }

    /// The middleware called at `hook`, in the order to call them.
    #[inline]
    pub(crate) fn at(&self, hook: HookPoint) -> impl Iterator<Item = &Entry> {
        self.lists[hook as usize]
            .iter()
            .map(|&i| &self.entries[i as usize])
    }

    /// Whether the model call needs this stack: wrap middleware or delta hooks.
    pub(crate) fn wraps_model(&self) -> bool {
        !self.model.is_empty() || self.has(HookPoint::OnModelDelta)
    }

    /// Whether the tool call needs this stack.
    pub(crate) fn wraps_tool(&self) -> bool {
        !self.tool.is_empty() || self.has(HookPoint::OnToolDelta)
    }
}

impl fmt::Debug for Stack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stack")
            .field(
                "lifecycle",
                &self.entries.iter().map(|e| &*e.name).collect::<Vec<_>>(),
            )
            .field(
                "model",
                &self.model.iter().map(|l| &*l.name).collect::<Vec<_>>(),
            )
            .field(
                "tool",
                &self.tool.iter().map(|l| &*l.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}
