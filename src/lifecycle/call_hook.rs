//! Calls one hook of one middleware: learning "not overridden", events,
//! panics, the fail policy, attribution.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;

use super::attribute::{attribute, panicked};
use super::middleware::{HookKind, NotOverridden};
use super::stack::StackEntry;
use super::{Hook, HookPoint};
use crate::context::RunContext;
use crate::error::{AgentError, BoxError};
use crate::event::AgentEvent;

pub(crate) fn started(ctx: &RunContext, name: &Arc<str>, hook: HookPoint) {
    ctx.emit(|| AgentEvent::MiddlewareStarted {
        run_id: ctx.run_id().clone(),
        middleware: name.clone(),
        hook: hook.as_str(),
    });
}

pub(crate) fn completed(ctx: &RunContext, name: &Arc<str>, hook: HookPoint, outcome: &'static str) {
    ctx.emit(|| AgentEvent::MiddlewareCompleted {
        run_id: ctx.run_id().clone(),
        middleware: name.clone(),
        hook: hook.as_str(),
        outcome,
    });
}

/// The `MiddlewareStarted` of one invocation, which owes its
/// `MiddlewareCompleted`: if the invocation's future is dropped before it
/// closes (a sibling tool call failed, the run was dropped), the drop emits
/// it with outcome `cancelled`, so the pair stays balanced.
pub(crate) struct Bracket<'a> {
    ctx: &'a RunContext,
    name: &'a Arc<str>,
    hook: HookPoint,
    open: bool,
}

impl<'a> Bracket<'a> {
    pub(crate) fn open(ctx: &'a RunContext, name: &'a Arc<str>, hook: HookPoint) -> Self {
        started(ctx, name, hook);
        Self {
            ctx,
            name,
            hook,
            open: true,
        }
    }

    pub(crate) fn close(mut self, outcome: &'static str) {
        self.open = false;
        completed(self.ctx, self.name, self.hook, outcome);
    }
}

impl Drop for Bracket<'_> {
    fn drop(&mut self) {
        if self.open {
            completed(self.ctx, self.name, self.hook, "cancelled");
        }
    }
}

/// Logs an error that must not fail the run (fail-open, `on_error`,
/// `after_agent`).
pub(crate) fn log_ignored(ctx: &RunContext, name: &Arc<str>, hook: HookPoint, err: &AgentError) {
    tracing::warn!(middleware = %name, hook = hook.as_str(), error = %err, "middleware error ignored");
    ctx.emit(|| AgentEvent::MiddlewareFailedOpen {
        run_id: ctx.run_id().clone(),
        middleware: name.clone(),
        hook: hook.as_str(),
        error: err.to_string(),
    });
}

/// What became of a hook that failed: the run's error, or `None` when the
/// middleware fails open.
fn fail<T>(
    entry: &StackEntry,
    ctx: &RunContext,
    hook: HookPoint,
    err: AgentError,
) -> Result<Option<T>, AgentError> {
    let decision = matches!(
        err,
        AgentError::Tripwire { .. } | AgentError::Cancelled | AgentError::Timeout { .. }
    );
    if entry.fail_open && !decision {
        log_ignored(ctx, &entry.name, hook, &err);
        return Ok(None);
    }
    Err(err)
}

/// Invokes one hook of one middleware. `make` calls the hook method.
///
/// `Ok(None)`: the hook skipped (or failed open). Events bracket every
/// invocation that did not skip, balanced whatever happens; a panic fails
/// with [`AgentError::Middleware`].
pub(crate) async fn invoke<'h, T>(
    entry: &StackEntry,
    ctx: &RunContext,
    hook: HookPoint,
    make: impl FnOnce() -> Hook<'h, T>,
) -> Result<Option<T>, AgentError> {
    match invoke_now(entry, ctx, hook, make) {
        Invoked::Done(result) => result,
        Invoked::Pending(future) => finish(entry, ctx, hook, future).await,
    }
}

/// What [`invoke_now`] found: the hook's answer, or the future it still
/// has to wait for (hand it to [`finish`]).
pub(crate) enum Invoked<'h, T> {
    Done(Result<Option<T>, AgentError>),
    Pending(BoxFuture<'h, Result<T, BoxError>>),
}

/// The synchronous part of [`invoke`]: calls the hook and settles every
/// answer but a pending future, without awaiting anything. Inlined into
/// each hook point's loop, so that a hook that skips costs its call and a
/// branch.
#[inline(always)]
pub(crate) fn invoke_now<'h, T>(
    entry: &StackEntry,
    ctx: &RunContext,
    hook: HookPoint,
    make: impl FnOnce() -> Hook<'h, T>,
) -> Invoked<'h, T> {
    let answer = catch_unwind(AssertUnwindSafe(make));
    if matches!(answer, Ok(Hook(HookKind::Skip))) {
        // Nothing in it to drop: no drop glue run for it.
        std::mem::forget(answer);
        return Invoked::Done(Ok(None));
    }
    answered(entry, ctx, hook, answer)
}

/// What [`invoke_now`] makes of an answer other than a skip.
#[inline(never)]
fn answered<'h, T>(
    entry: &StackEntry,
    ctx: &RunContext,
    hook: HookPoint,
    answer: std::thread::Result<Hook<'h, T>>,
) -> Invoked<'h, T> {
    let kind = match answer {
        Ok(Hook(kind)) => kind,
        Err(panic) => {
            started(ctx, &entry.name, hook);
            completed(ctx, &entry.name, hook, "panic");
            return Invoked::Done(fail(entry, ctx, hook, panicked(&entry.name, hook, &*panic)));
        }
    };
    match kind {
        HookKind::NotOverridden => {
            entry.learn_absent(hook);
            Invoked::Done(Ok(None))
        }
        HookKind::Skip => Invoked::Done(Ok(None)),
        HookKind::Ready(result) if !ctx.events().enabled() => {
            // Nobody listens to the run's events: none to bracket an
            // answer that is already there, which is settled here.
            ctx.attribute_stop(&entry.name);
            Invoked::Done(match result {
                Ok(value) => Ok(Some(value)),
                Err(err) => fail(entry, ctx, hook, attribute(err, &entry.name, hook)),
            })
        }
        HookKind::Ready(result) => {
            let bracket = Bracket::open(ctx, &entry.name, hook);
            Invoked::Done(settle(entry, ctx, hook, bracket, result))
        }
        HookKind::Pending(future) => Invoked::Pending(future),
    }
}

/// Waits for a hook's pending future, bracketed by its events.
pub(crate) async fn finish<T>(
    entry: &StackEntry,
    ctx: &RunContext,
    hook: HookPoint,
    future: BoxFuture<'_, Result<T, BoxError>>,
) -> Result<Option<T>, AgentError> {
    let bracket = Bracket::open(ctx, &entry.name, hook);
    let guarded = AssertUnwindSafe(future).catch_unwind();
    let outcome = if matches!(hook, HookPoint::OnError | HookPoint::AfterAgent) {
        // Closing hooks run after a cancellation too: they decide.
        Ok(guarded.await)
    } else {
        ctx.race(guarded).await
    };
    match outcome {
        Ok(Ok(result)) => settle(entry, ctx, hook, bracket, result),
        Ok(Err(panic)) => {
            bracket.close("panic");
            fail(entry, ctx, hook, panicked(&entry.name, hook, &*panic))
        }
        Err(stopped) => {
            bracket.close("error");
            Err(stopped)
        }
    }
}

/// A hook's answer: attribution, the closing event, the fail policy.
fn settle<T>(
    entry: &StackEntry,
    ctx: &RunContext,
    hook: HookPoint,
    bracket: Bracket<'_>,
    result: Result<T, BoxError>,
) -> Result<Option<T>, AgentError> {
    ctx.attribute_stop(&entry.name);
    match result {
        Ok(value) => {
            bracket.close("ok");
            Ok(Some(value))
        }
        Err(err) => {
            bracket.close("error");
            fail(entry, ctx, hook, attribute(err, &entry.name, hook))
        }
    }
}

/// Runs a synchronous delta hook: no events, panics caught.
pub(crate) fn invoke_delta(
    entry: &StackEntry,
    ctx: &RunContext,
    hook: HookPoint,
    f: impl FnOnce() -> Result<(), BoxError>,
) -> Result<(), AgentError> {
    let err = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(err)) if err.is::<NotOverridden>() => {
            entry.learn_absent(hook);
            return Ok(());
        }
        Ok(Err(err)) => attribute(err, &entry.name, hook),
        Err(panic) => panicked(&entry.name, hook, &*panic),
    };
    fail::<()>(entry, ctx, hook, err).map(|_| ())
}
