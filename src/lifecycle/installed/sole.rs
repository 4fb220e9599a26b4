//! The hook points of [`InstalledHooks`] where one middleware alone may
//! run and nothing is inherited: its answer goes straight to the port's
//! future, with no fold over the stack in between and nothing boxed for an
//! answer it has at once.

use super::InstalledHooks;
use crate::context::RunContext;
use crate::hooks::HookFuture;
use crate::lifecycle::call_hook::{finish, invoke_now, log_ignored, Invoked};
use crate::lifecycle::stack::StackEntry;
use crate::lifecycle::{Hook, HookPoint};

impl InstalledHooks {
    /// The one middleware that may run at `hook`, when nothing is
    /// inherited and exactly one here may.
    #[inline]
    pub(super) fn sole_here(&self, hook: HookPoint) -> Option<&StackEntry> {
        if self.outer.is_some() {
            return None;
        }
        self.stack.sole(hook)
    }

    /// `e`'s hook at `hook` (`make` calls it) as the port answers it:
    /// `done` makes the port's value of what it found (`None`: it skipped
    /// or failed open). At `on_error` and `after_agent` its error is
    /// logged, never returned, as the stack's fold does.
    #[inline(always)]
    pub(super) fn sole_port<'a, T, U>(
        &'a self,
        e: &'a StackEntry,
        ctx: &'a RunContext,
        hook: HookPoint,
        make: impl FnOnce() -> Hook<'a, T>,
        done: impl FnOnce(Option<T>) -> U + Send + 'a,
    ) -> HookFuture<'a, U>
    where
        T: Send + 'a,
        U: Send + 'a,
    {
        let tolerant = matches!(hook, HookPoint::OnError | HookPoint::AfterAgent);
        match invoke_now(e, ctx, hook, make) {
            Invoked::Done(Ok(found)) => HookFuture::ok(done(found)),
            Invoked::Done(Err(err)) if tolerant => {
                log_ignored(ctx, &e.name, hook, &err);
                HookFuture::ok(done(None))
            }
            Invoked::Done(Err(err)) => HookFuture::ready(Err(self.own(ctx, err))),
            Invoked::Pending(future) => HookFuture::new(async move {
                match finish(e, ctx, hook, future).await {
                    Ok(found) => Ok(done(found)),
                    Err(err) if tolerant => {
                        log_ignored(ctx, &e.name, hook, &err);
                        Ok(done(None))
                    }
                    Err(err) => Err(self.own(ctx, err)),
                }
            }),
        }
    }
}
