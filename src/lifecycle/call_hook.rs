//! Calls one hook of one middleware: learning "not overridden", events,
//! panics, the fail policy, attribution.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use futures::FutureExt;
use tokio::time::Instant;

use super::attribute::{attribute, panicked};
use super::middleware::{HookKind, NotOverridden};
use super::stack::Entry;
use super::{Hook, HookPoint};
use crate::context::RunContext;
use crate::error::{AgentError, BoxError, TimeoutSource};
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

/// Races `fut` against the run's cancellation and deadline: a hook still
/// running then is no longer waited for.
async fn race<F: Future>(ctx: &RunContext, fut: F) -> Result<F::Output, AgentError> {
    async fn until(deadline: Option<Instant>) {
        match deadline {
            Some(deadline) => tokio::time::sleep_until(deadline).await,
            None => std::future::pending().await,
        }
    }
    tokio::select! {
        biased;
        () = ctx.cancelled() => Err(AgentError::Cancelled),
        () = until(ctx.deadline()) => Err(AgentError::Timeout { timer: TimeoutSource::RunDeadline, after: Some(ctx.elapsed()) }),
        out = fut => Ok(out),
    }
}

/// What became of a hook that failed: the run's error, or `None` when the
/// middleware fails open.
fn fail<T>(
    entry: &Entry,
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
    entry: &Entry,
    ctx: &RunContext,
    hook: HookPoint,
    make: impl FnOnce() -> Hook<'h, T>,
) -> Result<Option<T>, AgentError> {
    let kind = match catch_unwind(AssertUnwindSafe(make)) {
        Ok(Hook(kind)) => kind,
        Err(panic) => {
            started(ctx, &entry.name, hook);
            completed(ctx, &entry.name, hook, "panic");
            return fail(entry, ctx, hook, panicked(&entry.name, hook, &*panic));
        }
    };
    let (bracket, result) = match kind {
        HookKind::NotOverridden => {
            entry.learn_absent(hook);
            return Ok(None);
        }
        HookKind::Skip => return Ok(None),
        HookKind::Ready(result) => (Bracket::open(ctx, &entry.name, hook), result),
        HookKind::Pending(future) => {
            let bracket = Bracket::open(ctx, &entry.name, hook);
            let guarded = AssertUnwindSafe(future).catch_unwind();
            let outcome = if matches!(hook, HookPoint::OnError | HookPoint::AfterAgent) {
                // Closing hooks run after a cancellation too: they decide.
                Ok(guarded.await)
            } else {
                race(ctx, guarded).await
            };
            match outcome {
                Ok(Ok(result)) => (bracket, result),
                Ok(Err(panic)) => {
                    bracket.close("panic");
                    return fail(entry, ctx, hook, panicked(&entry.name, hook, &*panic));
                }
                Err(stopped) => {
                    bracket.close("error");
                    return Err(stopped);
                }
            }
        }
    };
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
    entry: &Entry,
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
