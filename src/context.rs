//! [`RunContext`]: the run's handle, carried by every request.
//!
//! `Service::call` has no side channel, so each boundary's request
//! ([`RunRequest`](crate::RunRequest), [`ModelCall`](crate::ModelCall),
//! [`ToolInvocation`](crate::ToolInvocation)) carries the context of the run it
//! belongs to. Cloning it costs one reference count. Hooks and layers read it;
//! they never own the run's state.
//!
//! ```
//! use std::time::Duration;
//! use tower_agent::RunContext;
//!
//! let ctx = RunContext::builder().thread_id("t-1").timeout(Duration::from_secs(30)).build();
//! let child = ctx.child();
//! assert_eq!(child.parent_run_id(), Some(ctx.run_id()));
//! ctx.cancel();
//! assert!(child.is_cancelled()); // nested runs get child tokens
//!
//! child.add_context("The user is on the premium plan.");
//! child.stop("enough");
//! assert_eq!(child.stop_requested().unwrap().reason, "enough");
//! ```

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use pin_project_lite::pin_project;
use serde_json::Value;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::error::{AgentError, TimeoutSource};
use crate::event::{AgentEvent, EventSink, NoopSink};
use crate::types::{Cost, History, ModelName, PriceTable, StopReason, Usage};

mod ledger;

use ledger::Ledger;

/// One entry of the usage ledger: one model call that reached a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageEntry {
    /// The run that made the call.
    pub run_id: Arc<str>,
    /// The agent of that run.
    pub agent: Option<Arc<str>>,
    /// The model that answered.
    pub model: ModelName,
    /// What it cost.
    pub usage: Usage,
    /// Its price, when the run has a price table
    /// ([`set_prices`](RunContext::set_prices)) that knows the model.
    pub cost: Option<Cost>,
}

/// The run's handle: ids, turn, cancellation, deadline, shared state, usage
/// ledger, event sink and the hook points. See the [module docs](self).
///
/// # Clone
///
/// Clones are handles to the same run.
#[derive(Clone)]
pub struct RunContext {
    inner: Arc<Inner>,
}

struct Inner {
    /// The run's id: given, or drawn when first asked for (a run waiting on
    /// its model holds no room for its text).
    run_id: OnceLock<Arc<str>>,
    /// The thread, the deadline and the event sink: set when the root
    /// context is made, and shared with its nested runs' contexts. Most runs
    /// have none of them, and hold a null pointer.
    fixed: Option<Arc<Fixed>>,
    parent: Option<RunContext>,
    iteration: AtomicU32,
    /// The caller's token, a child of the parent run's, or one made when
    /// first needed: a root run that nobody cancels, and that nests no run,
    /// never makes one (see [`CancelWatch`]).
    cancel: OnceLock<CancellationToken>,
    state: Mutex<http::Extensions>,
    /// Whether `state` may hold anything: set (a plain store) by every
    /// writer before it locks, so a reader that finds it unset needs no lock.
    state_written: AtomicBool,
    /// The agent's name, the ledger (with the price table) and the rare
    /// parts (with the hook points).
    shared: Mutex<Shared>,
    /// Set when a middleware of this run, or of a run it is nested in,
    /// failed in this run or below: such an error fails this run too.
    hook_failed: AtomicBool,
    /// Set once something watches the run's messages (see
    /// `lifecycle::edit_watch`): until then the hook points skip the lookup.
    watched: AtomicBool,
    /// Set once `stop` holds a reason without `by`: lets attribution skip the lock.
    stop_unattributed: AtomicBool,
    /// Which of the rare parts hold something (a bit of [`part`] each,
    /// written under the `shared` lock): a read of a part that holds
    /// nothing (a stop, context to add, a bracket) skips the lock.
    rare_parts: AtomicU8,
    /// Set once a lifecycle layer brackets the run (see
    /// [`RunContext::mark_bracketed`]).
    bracketed: AtomicBool,
    /// Whether the model of the agent running the run reads a tool's panic
    /// message (see [`RunContext::set_show_tool_panics`]).
    show_tool_panics: AtomicBool,
}

/// What the run's handles change as it goes: a pointer or two each, so one
/// lock for all of them (none is held while another is taken).
#[derive(Default)]
struct Shared {
    /// The agent running the run: the one it started with, then each one
    /// it was handed over to.
    agent_name: Option<Arc<str>>,
    /// Allocated when the first usage is recorded (or a price table is
    /// set): a run waiting on its first answer holds a pointer, not the
    /// ledger's room.
    ledger: Option<Box<Ledger>>,
    /// The hook points, context, a stop, a bracket, a prelude: allocated
    /// when first used.
    rare: Option<Box<Rare>>,
    /// The task of the one [`CancelWatch`] that waits for a cancellation
    /// while the run has no token: [`RunContext::cancel`] wakes it.
    waiter: Option<Waker>,
}

/// What a root context is made with that its nested runs keep.
struct Fixed {
    thread_id: Option<Arc<str>>,
    deadline: Option<Deadline>,
    events: Option<Arc<dyn EventSink>>,
}

/// When the run must be done, and when the root run's context was made:
/// what the time taken is measured from.
#[derive(Clone, Copy)]
struct Deadline {
    at: Instant,
    started: Instant,
}

/// What many runs never use, kept off the context until they do (every
/// context holds a pointer to it, not its room).
#[derive(Default)]
struct Rare {
    /// The hook points installed in the run (see `crate::hooks`), opaque
    /// here. A run with middleware has them, and its bracket beside them.
    port: Option<PortSlot>,
    /// What [`RunContext::add_context`] collected.
    pending_context: Vec<String>,
    stop: Option<StopReason>,
    /// The context the bracketing layer's `before_agent` hooks added, until
    /// the loop takes it.
    bracket: Vec<String>,
    /// The traits of the agent's tools, opaque here (see
    /// [`RunContext::set_run_tools`]).
    tools: Option<Arc<dyn Any + Send + Sync>>,
    /// What hooks handed the run before it began: context for this run
    /// only, and the thread's earlier messages.
    prelude: Prelude,
    /// The panics of tool calls that became their error result below a
    /// wrap hook, by call id, until the run takes them for the calls'
    /// events (see [`RunContext::note_tool_panic`]).
    tool_panics: Vec<(String, String)>,
}

/// See [`RunContext::add_run_context`] and [`RunContext::provide_history`].
#[derive(Default)]
struct Prelude {
    context: Vec<String>,
    history: Option<History>,
}

/// The rare parts, one bit each in `Inner::rare_parts`.
mod part {
    pub(super) const PORT: u8 = 1;
    pub(super) const CONTEXT: u8 = 1 << 1;
    pub(super) const STOP: u8 = 1 << 2;
    pub(super) const BRACKET: u8 = 1 << 3;
    pub(super) const TOOLS: u8 = 1 << 4;
    pub(super) const RUN_CONTEXT: u8 = 1 << 5;
    pub(super) const HISTORY: u8 = 1 << 6;
    pub(super) const TOOL_PANICS: u8 = 1 << 7;
}

/// The sink of a context built without one: one for the process, so a
/// context costs no allocation for it.
fn noop_sink() -> &'static Arc<dyn EventSink> {
    static NOOP: OnceLock<Arc<dyn EventSink>> = OnceLock::new();
    NOOP.get_or_init(|| Arc::new(NoopSink))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `f` of `ctx`'s ledger, locked, made first if need be.
fn with_ledger<R>(ctx: &RunContext, f: impl FnOnce(&mut Ledger) -> R) -> R {
    f(ctx.shared().ledger.get_or_insert_with(Box::default))
}

/// A fresh, random run id such as `run_3f9a0c1b2d4e5f60`.
pub fn new_run_id() -> Arc<str> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits = rand::random::<u64>();
    let mut id = *b"run_0000000000000000";
    for (i, digit) in id[4..].iter_mut().enumerate() {
        *digit = HEX[(bits >> (60 - 4 * i)) as usize & 0xf];
    }
    Arc::from(std::str::from_utf8(&id).expect("ASCII"))
}

impl RunContext {
    /// A root context with a fresh run id and nothing else set.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder for a root context.
    pub fn builder() -> RunContextBuilder {
        RunContextBuilder::default()
    }

    /// A context for a run nested in this one (an agent used as a tool): a
    /// fresh run id, this run as parent, a child cancellation token, the same
    /// deadline, thread, event sink and hook points, and its own state and
    /// ledger, whose usage rolls up into this one's total.
    pub fn child(&self) -> RunContext {
        let (prices, port) = {
            let shared = self.shared();
            let prices = shared.ledger.as_ref().and_then(|l| l.prices.clone());
            (prices, shared.rare.as_ref().and_then(|r| r.port.clone()))
        };
        let shared = Shared {
            ledger: prices.map(|prices| {
                let mut ledger = Box::<Ledger>::default();
                ledger.prices = Some(prices);
                ledger
            }),
            // The hook points ride in the rare parts: a child of a hooked
            // run has them from the start.
            rare: port.map(|port| {
                Box::new(Rare {
                    port: Some(port),
                    ..Rare::default()
                })
            }),
            ..Shared::default()
        };
        let rare_parts = if shared.rare.is_some() { part::PORT } else { 0 };
        RunContext {
            inner: Arc::new(Inner {
                run_id: OnceLock::new(),
                fixed: self.inner.fixed.clone(),
                parent: Some(self.clone()),
                iteration: AtomicU32::new(0),
                cancel: OnceLock::from(self.token().child_token()),
                state: Mutex::default(),
                state_written: AtomicBool::new(false),
                shared: Mutex::new(shared),
                hook_failed: AtomicBool::new(false),
                watched: AtomicBool::new(false),
                stop_unattributed: AtomicBool::new(false),
                rare_parts: AtomicU8::new(rare_parts),
                bracketed: AtomicBool::new(false),
                show_tool_panics: AtomicBool::new(false),
            }),
        }
    }

    /// The run's id.
    pub fn run_id(&self) -> &Arc<str> {
        self.inner.run_id.get_or_init(new_run_id)
    }

    /// The thread (conversation) the run belongs to, if any.
    pub fn thread_id(&self) -> Option<&str> {
        self.inner.fixed.as_ref()?.thread_id.as_deref()
    }

    /// The parent run's context, for a nested run.
    pub fn parent(&self) -> Option<&RunContext> {
        self.inner.parent.as_ref()
    }

    /// The parent run's id, for a nested run.
    pub fn parent_run_id(&self) -> Option<&Arc<str>> {
        self.parent().map(RunContext::run_id)
    }

    /// The root run of the tree this run belongs to.
    pub fn root(&self) -> &RunContext {
        let mut ctx = self;
        while let Some(parent) = ctx.parent() {
            ctx = parent;
        }
        ctx
    }

    /// How deep the run is nested: 0 for a root run.
    pub fn depth(&self) -> usize {
        let mut depth = 0;
        let mut ctx = self;
        while let Some(parent) = ctx.parent() {
            depth += 1;
            ctx = parent;
        }
        depth
    }

    /// The agent running this context, once the run started: after a
    /// handoff, the agent the run was handed over to.
    pub fn agent_name(&self) -> Option<Arc<str>> {
        self.shared().agent_name.clone()
    }

    /// Names the agent running this context. The first name set stays (a
    /// handoff moves it on).
    pub fn set_agent_name(&self, name: &Arc<str>) {
        let mut shared = self.shared();
        if shared.agent_name.is_none() {
            shared.agent_name = Some(name.clone());
        }
    }

    /// The run was handed over to the agent `name`.
    pub(crate) fn hand_to_agent(&self, name: &Arc<str>) {
        self.shared().agent_name = Some(name.clone());
    }

    /// The model turn: 0 before the first, then 1, 2, …
    pub fn iteration(&self) -> u32 {
        self.inner.iteration.load(Ordering::Relaxed)
    }

    pub(crate) fn set_iteration(&self, iteration: u32) {
        self.inner.iteration.store(iteration, Ordering::Relaxed);
    }

    /// The run's cancellation token. Cancelling it ends the run with
    /// `CANCELLED` and cancels every nested run.
    pub fn cancellation_token(&self) -> &CancellationToken {
        self.token()
    }

    /// The token, made first if the run has none yet. A [`CancelWatch`]
    /// waiting without one is woken, to watch the token from now on.
    fn token(&self) -> &CancellationToken {
        if let Some(token) = self.inner.cancel.get() {
            return token;
        }
        let token = self.inner.cancel.get_or_init(CancellationToken::new);
        let waiter = self.shared().waiter.take();
        if let Some(waiter) = waiter {
            waiter.wake();
        }
        token
    }

    /// Cancels the run and its nested runs.
    pub fn cancel(&self) {
        self.token().cancel();
    }

    /// Whether the run was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.inner
            .cancel
            .get()
            .is_some_and(CancellationToken::is_cancelled)
    }

    /// Completes when the run is cancelled.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token().cancelled()
    }

    /// When the run must be done, if a deadline was set.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline_state().map(|d| d.at)
    }

    /// `fut`, unless the run is cancelled or reaches its deadline first:
    /// then [`AgentError::Cancelled`] or [`AgentError::Timeout`] (the run's
    /// deadline, after how long), and `fut` is dropped.
    pub(crate) fn race<F: Future>(&self, fut: F) -> Race<'_, F> {
        Race {
            guard: Guard::new(self),
            fut,
        }
    }

    /// How long since the root run's context was made (zero for a run
    /// without a deadline, whose start is not kept).
    pub(crate) fn elapsed(&self) -> Duration {
        self.deadline_state()
            .map_or(Duration::ZERO, |d| d.started.elapsed())
    }

    fn deadline_state(&self) -> Option<Deadline> {
        self.inner.fixed.as_ref()?.deadline
    }

    /// The time left to the deadline (zero once passed), if one was set.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline()
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Stores a value of type `T` in the run's shared state, returning the
    /// previous one. Middleware use it to share per-run data.
    pub fn insert_state<T: Clone + Send + Sync + 'static>(&self, value: T) -> Option<T> {
        self.inner.state_written.store(true, Ordering::Relaxed);
        lock(&self.inner.state).insert(value)
    }

    /// A clone of the state value of type `T`, if any.
    pub fn state<T: Clone + Send + Sync + 'static>(&self) -> Option<T> {
        lock(&self.inner.state).get::<T>().cloned()
    }

    /// Runs `f` with the run's state map locked. Keep it short, and do not
    /// touch the state again from inside `f`.
    pub fn with_state<R>(&self, f: impl FnOnce(&mut http::Extensions) -> R) -> R {
        self.inner.state_written.store(true, Ordering::Relaxed);
        f(&mut lock(&self.inner.state))
    }

    /// Whether the run's state may hold anything: `false` until a value was
    /// put there (or the state map was handed out to do so), read without a
    /// lock.
    pub(crate) fn state_maybe_written(&self) -> bool {
        self.inner.state_written.load(Ordering::Relaxed)
    }

    /// Records the usage of one model call that reached a backend: into this
    /// run's own usage, and into the total of this run and of every run it is
    /// nested in. Providers call this; see
    /// [`ModelResponse::usage_recorded`](crate::types::ModelResponse::usage_recorded).
    pub fn record_usage(&self, model: &str, usage: Usage) {
        self.record_usage_of(&ModelName::from(model), usage);
    }

    /// [`record_usage`](Self::record_usage) of a name already shared: its
    /// entries share it too.
    pub(crate) fn record_usage_of(&self, model: &ModelName, usage: Usage) {
        // This run's own figures, its total and its entry, in one lock; the
        // entry is made (its names shared) only for the runs this one is
        // nested in.
        let (cost, agent) = {
            let mut shared = self.shared();
            let Shared {
                agent_name, ledger, ..
            } = &mut *shared;
            let ledger = ledger.get_or_insert_with(Box::default);
            let cost = ledger.prices.as_ref().and_then(|p| p.cost(model, &usage));
            ledger.add_own(agent_name.as_ref(), model, usage, cost);
            let agent = self.parent().and_then(|_| agent_name.clone());
            (cost, agent)
        };
        if let Some(cost) = cost {
            self.emit(|| AgentEvent::CostRecorded {
                run_id: self.run_id().clone(),
                model: model.clone(),
                usage,
                cost,
            });
        }
        if let Some(parent) = self.parent() {
            let entry = UsageEntry {
                run_id: self.run_id().clone(),
                agent,
                model: model.clone(),
                usage,
                cost,
            };
            let mut ctx = Some(parent);
            while let Some(c) = ctx {
                with_ledger(c, |ledger| ledger.add_nested(&entry));
                ctx = c.parent();
            }
        }
    }

    /// This run's usage, the total with its nested runs', and the total's
    /// priced cost: [`usage`](Self::usage), [`total_usage`](Self::total_usage)
    /// and [`total_cost`](Self::total_cost) in one lock.
    pub(crate) fn usage_figures(&self) -> (Usage, Usage, Option<Cost>) {
        self.read_ledger(|l| (l.own, l.total, l.total_cost))
            .unwrap_or_default()
    }

    /// `f` of the ledger, once a usage was recorded.
    fn read_ledger<R>(&self, f: impl FnOnce(&Ledger) -> R) -> Option<R> {
        self.shared().ledger.as_deref().map(f)
    }

    /// Starts the ledger from a checkpoint's figures (a resumed run).
    pub(crate) fn seed_usage(&self, own: Usage, total: Usage) {
        with_ledger(self, |ledger| {
            ledger.own += own;
            ledger.total += total;
        });
    }

    /// The usage of this run's own model calls.
    pub fn usage(&self) -> Usage {
        self.read_ledger(|l| l.own).unwrap_or_default()
    }

    /// The usage of this run and of every run nested in it.
    pub fn total_usage(&self) -> Usage {
        self.read_ledger(|l| l.total).unwrap_or_default()
    }

    /// The priced cost of this run's own model calls, once a price table
    /// priced one.
    pub fn cost(&self) -> Option<Cost> {
        self.read_ledger(|l| l.own_cost).flatten()
    }

    /// The priced cost of this run and every run nested in it.
    pub fn total_cost(&self) -> Option<Cost> {
        self.read_ledger(|l| l.total_cost).flatten()
    }

    /// Prices this run's usage (and its nested runs', when they start after
    /// this) with `prices`: each [`UsageEntry`] gets its cost. The first
    /// table set stays; a budget layer sets its own.
    pub fn set_prices(&self, prices: &Arc<PriceTable>) {
        with_ledger(self, |ledger| {
            ledger.prices.get_or_insert_with(|| prices.clone());
        });
    }

    /// The price table of the run, if one was set.
    pub fn prices(&self) -> Option<Arc<PriceTable>> {
        self.read_ledger(|l| l.prices.clone()).flatten()
    }

    /// One entry per model call of this run and the runs nested in it, in
    /// the order they were recorded.
    pub fn usage_entries(&self) -> Vec<UsageEntry> {
        let own = self.run_id();
        self.read_ledger(|l| l.entries(own)).unwrap_or_default()
    }

    /// The event sink.
    pub fn events(&self) -> &Arc<dyn EventSink> {
        match self.inner.fixed.as_ref().and_then(|f| f.events.as_ref()) {
            Some(events) => events,
            None => noop_sink(),
        }
    }

    /// Emits the event `f` builds, if the sink wants events.
    #[inline]
    pub fn emit(&self, f: impl FnOnce() -> AgentEvent) {
        // A context without a sink of its own sends to nobody: not even a
        // check of the no-op sink.
        let Some(events) = self.inner.fixed.as_ref().and_then(|f| f.events.as_ref()) else {
            return;
        };
        if events.enabled() {
            events.emit(f());
        }
    }

    /// Writes a custom entry to the run's event log.
    pub fn log_event(&self, name: impl Into<String>, data: Value) {
        self.emit(|| AgentEvent::Custom {
            run_id: self.run_id().clone(),
            name: name.into(),
            data,
        });
    }

    /// The parts of the context that change, locked.
    fn shared(&self) -> MutexGuard<'_, Shared> {
        lock(&self.inner.shared)
    }

    /// Runs `f` on the context's rarely used parts, allocated first if need
    /// be, to put something in `part`.
    fn with_rare<R>(&self, part: u8, f: impl FnOnce(&mut Rare) -> R) -> R {
        let mut shared = self.shared();
        let rare = shared.rare.get_or_insert_with(Box::default);
        // Written only under the lock: a load and a store, no atomic
        // read-modify-write.
        let parts = self.inner.rare_parts.load(Ordering::Relaxed);
        if parts & part == 0 {
            self.inner.rare_parts.store(parts | part, Ordering::Release);
        }
        f(rare)
    }

    /// `f` of the rare parts, locked, once something was put in `part`;
    /// `None` before, without taking the lock.
    fn read_rare<R>(&self, part: u8, f: impl FnOnce(&mut Rare) -> R) -> Option<R> {
        if self.inner.rare_parts.load(Ordering::Acquire) & part == 0 {
            return None;
        }
        self.shared().rare.as_deref_mut().map(f)
    }

    /// Adds a system message to the next model call, kept in the transcript.
    pub fn add_context(&self, text: impl Into<String>) {
        self.with_rare(part::CONTEXT, |rare| rare.pending_context.push(text.into()));
    }

    /// Takes the texts [`add_context`](Self::add_context) collected.
    pub(crate) fn take_context(&self) -> Vec<String> {
        self.read_rare(part::CONTEXT, |rare| {
            std::mem::take(&mut rare.pending_context)
        })
        .unwrap_or_default()
    }

    /// Adds a system message right after the system prompt, for this run
    /// only: the model reads it on every turn, the transcript (and so the
    /// thread) leaves it out. What `before_agent`'s `Some(text)` does, for a
    /// hook that runs later and needs the input (`before_run`), such as
    /// memory recalled for it. Text added once the first turn began is not
    /// read.
    pub fn add_run_context(&self, text: impl Into<String>) {
        self.with_rare(part::RUN_CONTEXT, |rare| {
            rare.prelude.context.push(text.into())
        });
    }

    /// Takes the texts [`add_run_context`](Self::add_run_context) collected.
    pub(crate) fn take_run_context(&self) -> Vec<String> {
        self.read_rare(part::RUN_CONTEXT, |rare| {
            std::mem::take(&mut rare.prelude.context)
        })
        .unwrap_or_default()
    }

    /// Gives a new run whose request came without history the thread's
    /// earlier messages, from a `before_agent` hook (a memory store that
    /// loads the thread). A run that has history or resumes a checkpoint
    /// ignores it, and so does a run that already began.
    pub fn provide_history(&self, history: impl Into<History>) {
        let history = history.into();
        self.with_rare(part::HISTORY, |rare| rare.prelude.history = Some(history));
    }

    /// Takes what [`provide_history`](Self::provide_history) gave.
    pub(crate) fn take_provided_history(&self) -> Option<History> {
        self.read_rare(part::HISTORY, |rare| rare.prelude.history.take())
            .flatten()
    }

    /// Ends the run before its next model call: it completes with status
    /// *stopped* and `reason`. The stack names the middleware (or the tool)
    /// that asked; use [`stop_by`](Self::stop_by) to name it yourself.
    pub fn stop(&self, reason: impl Into<String>) {
        self.set_stop(StopReason {
            reason: reason.into(),
            by: None,
        });
    }

    /// Like [`stop`](Self::stop), naming who asked.
    pub fn stop_by(&self, by: impl Into<String>, reason: impl Into<String>) {
        self.set_stop(StopReason {
            reason: reason.into(),
            by: Some(by.into()),
        });
    }

    fn set_stop(&self, reason: StopReason) {
        self.with_rare(part::STOP, |rare| {
            let stop = &mut rare.stop;
            if stop.is_some() {
                return;
            }
            if reason.by.is_none() {
                self.inner.stop_unattributed.store(true, Ordering::Release);
            }
            *stop = Some(reason);
        });
    }

    /// The stop asked for, if any. The first request wins.
    pub fn stop_requested(&self) -> Option<StopReason> {
        self.read_rare(part::STOP, |rare| rare.stop.clone())
            .flatten()
    }

    /// Names `by` as who asked for a stop that was asked for anonymously.
    ///
    /// Cheap when there is nothing to attribute (one atomic load), so the
    /// lifecycle stack calls it after every hook.
    pub(crate) fn attribute_stop(&self, by: &str) {
        if !self.inner.stop_unattributed.load(Ordering::Acquire) {
            return;
        }
        self.read_rare(part::STOP, |rare| {
            if let Some(stop) = rare.stop.as_mut().filter(|stop| stop.by.is_none()) {
                stop.by = Some(by.to_owned());
            }
        });
        self.inner.stop_unattributed.store(false, Ordering::Release);
    }

    /// Marks the run as bracketed by a lifecycle layer, which ran the
    /// `before_agent` hooks itself and will run the closing hooks; `context`
    /// is what those hooks added after the system prompt. The run loop then
    /// takes that context instead of asking `before_agent`, and leaves
    /// `after_agent` to the layer. A second layer on the same run adds its
    /// context to the first one's.
    pub(crate) fn mark_bracketed(&self, context: Vec<String>) {
        // A flag, not the rare parts: a bracket that adds no context (most
        // do) allocates nothing.
        if !context.is_empty() {
            self.with_rare(part::BRACKET, |rare| rare.bracket.extend(context));
        }
        self.inner.bracketed.store(true, Ordering::Release);
    }

    /// Whether a lifecycle layer brackets this run. See
    /// [`mark_bracketed`](Self::mark_bracketed).
    #[inline]
    pub(crate) fn is_bracketed(&self) -> bool {
        self.inner.bracketed.load(Ordering::Acquire)
    }

    /// Takes the context the bracketing layer's `before_agent` hooks added.
    pub(crate) fn take_bracket_context(&self) -> Vec<String> {
        self.read_rare(part::BRACKET, |rare| std::mem::take(&mut rare.bracket))
            .unwrap_or_default()
    }

    /// Sets what the agent running the run says of its tools (the
    /// `service` floor's table, opaque here), for the hooks to read with
    /// [`run_tools`](Self::run_tools): a pointer in the rare parts rather
    /// than an entry of the state map, which allocates three times.
    pub(crate) fn set_run_tools(&self, tools: Arc<dyn Any + Send + Sync>) {
        self.with_rare(part::TOOLS, |rare| rare.tools = Some(tools));
    }

    /// What [`set_run_tools`](Self::set_run_tools) set, if anything.
    pub(crate) fn run_tools(&self) -> Option<Arc<dyn Any + Send + Sync>> {
        self.read_rare(part::TOOLS, |rare| rare.tools.clone())
            .flatten()
    }

    /// Sets whether the model of the agent running the run reads a tool's
    /// panic message: the agent's `show_tool_panics`, set when its run
    /// starts and when the run is handed over to it.
    pub(crate) fn set_show_tool_panics(&self, show: bool) {
        self.inner.show_tool_panics.store(show, Ordering::Relaxed);
    }

    /// Whether the model reads a tool's panic message. See
    /// [`set_show_tool_panics`](Self::set_show_tool_panics).
    pub(crate) fn shows_tool_panics(&self) -> bool {
        self.inner.show_tool_panics.load(Ordering::Relaxed)
    }

    /// Notes that the tool call `call_id` panicked with `message`, which
    /// its result for the model leaves out unless told otherwise: kept for
    /// the call's event until [`take_tool_panic`](Self::take_tool_panic).
    /// A call that panics again (a middleware retried it) keeps the last.
    pub(crate) fn note_tool_panic(&self, call_id: &str, message: &str) {
        self.with_rare(part::TOOL_PANICS, |rare| {
            let noted = &mut rare.tool_panics;
            match noted.iter_mut().find(|(id, _)| id == call_id) {
                Some((_, last)) => message.clone_into(last),
                None => noted.push((call_id.to_owned(), message.to_owned())),
            }
        });
    }

    /// Takes the panic noted for the tool call `call_id`, if any: one
    /// atomic load for a run where no tool panicked.
    pub(crate) fn take_tool_panic(&self, call_id: &str) -> Option<String> {
        self.read_rare(part::TOOL_PANICS, |rare| {
            let at = rare.tool_panics.iter().position(|(id, _)| id == call_id)?;
            Some(rare.tool_panics.swap_remove(at).1)
        })
        .flatten()
    }

    /// Notes that something watches the run's messages.
    pub(crate) fn set_watched(&self) {
        self.inner.watched.store(true, Ordering::Release);
    }

    /// Whether something may watch the run's messages: `false` until
    /// [`set_watched`](Self::set_watched).
    #[inline]
    pub(crate) fn maybe_watched(&self) -> bool {
        self.inner.watched.load(Ordering::Acquire)
    }

    /// Whether `other` is a handle to this same run.
    #[inline]
    pub(crate) fn same_run(&self, other: &RunContext) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// `f` of the hook points installed for this run, opaque:
    /// `crate::hooks` reads them (under the lock, so `f` must be short).
    pub(crate) fn read_port_slot<R>(&self, f: impl FnOnce(&PortSlot) -> Option<R>) -> Option<R> {
        self.read_rare(part::PORT, |rare| rare.port.as_ref().and_then(f))
            .flatten()
    }

    /// Installs the hook points the run loop calls, replacing any.
    pub(crate) fn set_port_slot(&self, slot: PortSlot) {
        self.with_rare(part::PORT, |rare| rare.port = Some(slot));
    }

    /// Removes the hook points installed in the run (a handoff to an agent
    /// without middleware, in a run that had only the first agent's).
    pub(crate) fn clear_port_slot(&self) {
        if let Some(rare) = self.shared().rare.as_mut() {
            rare.port = None;
        }
    }

    /// Records that a middleware installed in the run `levels` runs up
    /// from this one (0: this run) failed here: this run and every run up to
    /// that one fail with it, instead of reading it as a failed tool call.
    pub(crate) fn note_hook_failure(&self, levels: usize) {
        let mut current = Some(self);
        let mut left = levels;
        while let Some(ctx) = current {
            ctx.inner.hook_failed.store(true, Ordering::Release);
            if left == 0 {
                break;
            }
            left -= 1;
            current = ctx.parent();
        }
    }

    /// Whether a middleware of this run or of one it is nested in failed in
    /// this run or below. See [`note_hook_failure`](Self::note_hook_failure).
    pub(crate) fn hook_failed_here(&self) -> bool {
        self.inner.hook_failed.load(Ordering::Acquire)
    }
}

/// What [`RunContext`] keeps of the installed hook points: opaque here, so
/// that the context does not depend on the port's types.
pub(crate) type PortSlot = Arc<dyn Any + Send + Sync>;

impl Default for RunContext {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for RunContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunContext")
            .field("run_id", &self.inner.run_id)
            .field("parent_run_id", &self.parent_run_id())
            .field("agent", &self.agent_name())
            .field("iteration", &self.iteration())
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}

/// Builds a root [`RunContext`].
#[derive(Default)]
pub struct RunContextBuilder {
    run_id: Option<Arc<str>>,
    thread_id: Option<Arc<str>>,
    cancel: Option<CancellationToken>,
    deadline: Option<Instant>,
    events: Option<Arc<dyn EventSink>>,
    state: http::Extensions,
}

impl fmt::Debug for RunContextBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunContextBuilder")
            .field("run_id", &self.run_id)
            .field("thread_id", &self.thread_id)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl RunContextBuilder {
    /// Uses this run id instead of a random one.
    pub fn run_id(mut self, id: impl Into<Arc<str>>) -> Self {
        self.run_id = Some(id.into());
        self
    }

    /// The thread the run belongs to.
    pub fn thread_id(mut self, id: impl Into<Arc<str>>) -> Self {
        self.thread_id = Some(id.into());
        self
    }

    /// A cancellation token of the caller's.
    pub fn cancellation(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// The instant by which the run must be done.
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// A deadline `timeout` from now.
    pub fn timeout(self, timeout: Duration) -> Self {
        self.deadline(Instant::now() + timeout)
    }

    /// Where the run's events go.
    pub fn events(mut self, sink: impl EventSink) -> Self {
        self.events = Some(Arc::new(sink));
        self
    }

    /// Where the run's events go, shared.
    pub fn events_arc(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.events = Some(sink);
        self
    }

    /// A value for the run's shared state.
    pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.state.insert(value);
        self
    }

    /// The context.
    pub fn build(self) -> RunContext {
        RunContext {
            inner: Arc::new(Inner {
                run_id: self.run_id.map_or_else(OnceLock::new, OnceLock::from),
                fixed: (self.thread_id.is_some()
                    || self.deadline.is_some()
                    || self.events.is_some())
                .then(|| {
                    Arc::new(Fixed {
                        events: self.events,
                        thread_id: self.thread_id,
                        deadline: self.deadline.map(|at| Deadline {
                            at,
                            started: Instant::now(),
                        }),
                    })
                }),
                parent: None,
                iteration: AtomicU32::new(0),
                cancel: self.cancel.map_or_else(OnceLock::new, OnceLock::from),
                state_written: AtomicBool::new(!self.state.is_empty()),
                state: Mutex::new(self.state),
                shared: Mutex::default(),
                hook_failed: AtomicBool::new(false),
                watched: AtomicBool::new(false),
                stop_unattributed: AtomicBool::new(false),
                rare_parts: AtomicU8::new(0),
                bracketed: AtomicBool::new(false),
                show_tool_panics: AtomicBool::new(false),
            }),
        }
    }
}

pin_project! {
    /// [`RunContext::race`]: `fut`, unless the run is cancelled or reaches
    /// its deadline first (checked in that order). Every suspended run holds
    /// one while it waits on its model, so it is small: the deadline's timer
    /// is on the heap, and only when the run has a deadline.
    pub(crate) struct Race<'a, F> {
        guard: Guard<'a>,
        #[pin]
        fut: F,
    }
}

impl<F: Future> Future for Race<'_, F> {
    type Output = Result<F::Output, AgentError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let fut = this.fut;
        this.guard.poll(cx, |cx| fut.poll(cx))
    }
}

/// What [`Race`] races a future against, for a future that polls its work
/// itself: the run's cancellation and its deadline.
pub(crate) struct Guard<'a> {
    ctx: &'a RunContext,
    cancelled: CancelWatch<'a>,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<'a> Guard<'a> {
    /// The guard of the run of `ctx`: its deadline's timer starts now.
    pub(crate) fn new(ctx: &'a RunContext) -> Self {
        Self {
            ctx,
            cancelled: CancelWatch::new(),
            deadline: ctx
                .deadline()
                .map(|deadline| Box::pin(tokio::time::sleep_until(deadline))),
        }
    }

    /// The context of the run it guards.
    pub(crate) fn ctx(&self) -> &'a RunContext {
        self.ctx
    }

    /// `work`, unless the run is cancelled or reached its deadline: then
    /// [`AgentError::Cancelled`] or [`AgentError::Timeout`].
    pub(crate) fn poll<T>(
        &mut self,
        cx: &mut Context<'_>,
        work: impl FnOnce(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<Result<T, AgentError>> {
        // A cancellation already signalled wins; otherwise the signal's
        // waiter is registered only when the work has to wait, so a call
        // that answers at once never touches it.
        if self.ctx.is_cancelled() {
            return Poll::Ready(Err(AgentError::Cancelled));
        }
        if let Some(deadline) = &mut self.deadline {
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(AgentError::Timeout {
                    timer: TimeoutSource::RunDeadline,
                    after: Some(self.ctx.elapsed()),
                }));
            }
        }
        if let Poll::Ready(out) = work(cx) {
            return Poll::Ready(Ok(out));
        }
        if self.cancelled.poll(self.ctx, cx).is_ready() {
            return Poll::Ready(Err(AgentError::Cancelled));
        }
        Poll::Pending
    }
}

/// Waits for a run's cancellation, in what the run has: with a token, on
/// it (its waiter on the heap, so that the race stays small); without one,
/// as the context's one waiter, woken by [`RunContext::cancel`] or by the
/// token's making, whichever comes first. A second watch waiting beside
/// the first makes the token, and both wait on it.
///
/// It borrows the context its [`Guard`] holds, which it is given at each
/// poll and when the guard is dropped.
pub(crate) struct CancelWatch<'a> {
    /// Registered as the context's waiter.
    registered: bool,
    /// Waiting on the token.
    waiting: Option<Pin<Box<WaitForCancellationFuture<'a>>>>,
}

impl<'a> CancelWatch<'a> {
    pub(crate) fn new() -> Self {
        Self {
            registered: false,
            waiting: None,
        }
    }

    /// Ready once the run is cancelled; otherwise the task is woken then.
    pub(crate) fn poll(&mut self, ctx: &'a RunContext, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(waiting) = &mut self.waiting {
            return waiting.as_mut().poll(cx);
        }
        let inner = &ctx.inner;
        let mut shared = ctx.shared();
        // Read under the lock the token's maker takes the waiter with.
        if inner.cancel.get().is_none() {
            match &mut shared.waiter {
                Some(waiter) if self.registered => {
                    if !waiter.will_wake(cx.waker()) {
                        waiter.clone_from(cx.waker());
                    }
                    return Poll::Pending;
                }
                None => {
                    shared.waiter = Some(cx.waker().clone());
                    self.registered = true;
                    return Poll::Pending;
                }
                // Another watch waits: the token, for both.
                Some(_) => {}
            }
        }
        drop(shared);
        self.registered = false;
        let waiting = self.waiting.insert(Box::pin(ctx.token().cancelled()));
        waiting.as_mut().poll(cx)
    }
}

impl CancelWatch<'_> {
    /// Gives up the context's waiter, if this watch is it.
    fn release(&mut self, ctx: &RunContext) {
        if self.registered {
            let mut shared = ctx.shared();
            // Once the token is made, the waiter's room is no watch's.
            if ctx.inner.cancel.get().is_none() {
                shared.waiter = None;
            }
        }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.cancelled.release(self.ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_sixteen_random_hex_digits() {
        let (a, b) = (new_run_id(), new_run_id());
        assert_ne!(a, b);
        let digits = a.strip_prefix("run_").expect("the prefix");
        assert_eq!(digits.len(), 16);
        assert!(digits
            .bytes()
            .all(|d| d.is_ascii_hexdigit() && !d.is_ascii_uppercase()));
    }

    /// A root run without a token makes none to wait, and still stops
    /// when cancelled: through `cancel`, through a token asked for while it
    /// waits, and with two waits side by side.
    #[tokio::test(start_paused = true)]
    async fn a_waiting_race_without_a_token_is_cancelled() {
        let pending = || std::future::pending::<()>();

        let ctx = RunContext::new();
        let waiting = tokio::spawn({
            let ctx = ctx.clone();
            async move { ctx.race(pending()).await }
        });
        tokio::task::yield_now().await;
        assert!(ctx.inner.cancel.get().is_none(), "no token made to wait");
        ctx.cancel();
        assert!(matches!(waiting.await.unwrap(), Err(AgentError::Cancelled)));

        let ctx = RunContext::new();
        let waiting = tokio::spawn({
            let ctx = ctx.clone();
            async move { ctx.race(pending()).await }
        });
        tokio::task::yield_now().await;
        let token = ctx.cancellation_token().clone();
        tokio::task::yield_now().await;
        token.cancel();
        assert!(matches!(waiting.await.unwrap(), Err(AgentError::Cancelled)));

        let ctx = RunContext::new();
        let both = tokio::spawn({
            let ctx = ctx.clone();
            async move {
                let (a, b) = tokio::join!(ctx.race(pending()), ctx.race(pending()));
                (a, b)
            }
        });
        tokio::task::yield_now().await;
        ctx.cancel();
        let (a, b) = both.await.unwrap();
        assert!(matches!(a, Err(AgentError::Cancelled)));
        assert!(matches!(b, Err(AgentError::Cancelled)));

        // A race that ends unregisters: the context keeps no waker.
        let ctx = RunContext::new();
        let done = ctx.race(std::future::ready(7)).await;
        assert_eq!(done.unwrap(), 7);
        assert!(ctx.shared().waiter.is_none());
    }

    #[test]
    fn usage_rolls_up_exactly_once() {
        let root = RunContext::new();
        let child = root.child();
        let grandchild = child.child();
        root.record_usage("m", Usage::new(1, 1));
        child.record_usage("m", Usage::new(10, 10));
        grandchild.record_usage("m", Usage::new(100, 100));
        assert_eq!(root.usage(), Usage::new(1, 1));
        assert_eq!(root.total_usage(), Usage::new(111, 111));
        assert_eq!(child.total_usage(), Usage::new(110, 110));
        assert_eq!(grandchild.total_usage(), Usage::new(100, 100));
        assert_eq!(root.usage_entries().len(), 3);
        assert_eq!(grandchild.depth(), 2);
        assert_eq!(grandchild.root().run_id(), root.run_id());
    }

    #[test]
    fn first_stop_wins_and_is_attributed() {
        let ctx = RunContext::new();
        ctx.stop("first");
        ctx.stop_by("other", "second");
        ctx.attribute_stop("tool:lookup");
        let stop = ctx.stop_requested().unwrap();
        assert_eq!(stop.reason, "first");
        assert_eq!(stop.by.as_deref(), Some("tool:lookup"));
    }

    #[test]
    fn state_is_typed() {
        #[derive(Clone, PartialEq, Debug)]
        struct Tenant(u32);
        let ctx = RunContext::builder().state(Tenant(3)).build();
        assert_eq!(ctx.state::<Tenant>(), Some(Tenant(3)));
        assert_eq!(ctx.insert_state(Tenant(4)), Some(Tenant(3)));
        assert_eq!(
            ctx.with_state(|s| s.get::<Tenant>().cloned()),
            Some(Tenant(4))
        );
        assert_eq!(ctx.child().state::<Tenant>(), None);
    }
}
