//! [`ChainRun`]: a walk down the wrap chain for a caller that holds the
//! chain as long as the call runs (the hooks installed in a run). The walk
//! needs no future of its own: a middleware's future borrows the chain from
//! the caller, and the call below the last wrap hook takes the walk's place.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

use super::attribute::{name_tripwire, panicked};
use super::call_hook::{completed, started};
use super::next::{call_innermost, own_failure, step, CallInnermost, Step};
use super::stack::StackEntry;
use super::wrap::WrapRequest;
use super::{HookPoint, Next};
use crate::context::RunContext;
use crate::error::BoxError;

impl<Req: WrapRequest> Next<Req> {
    /// [`run`](Self::run) for a caller that holds `chain` (this `next`'s
    /// own) while the call runs.
    pub(crate) fn run_in(self, chain: &Arc<[StackEntry]>, req: Req) -> ChainRun<'_, Req> {
        ChainRun::Start {
            chain,
            start: Some((self, req)),
        }
    }
}

impl<'a, Req: WrapRequest> ChainRun<'a, Req> {
    /// The rest of a run whose walk down the chain ended at `step`, or the
    /// error it ended with.
    pub(super) fn after(step: Step<'a, Req>) -> Result<Self, BoxError> {
        Ok(match step {
            Step::Innermost(service, req, recover) => {
                ChainRun::Calling(call_innermost(service.into_service(), req, recover))
            }
            Step::Failed(err) => return Err(err),
            Step::Elsewhere(next, req) => ChainRun::Elsewhere(Box::pin(next.run(req))),
            Step::Hooked {
                entry,
                ctx,
                home,
                future,
            } => ChainRun::Hooked(Hooked {
                entry,
                ctx,
                home,
                future,
                state: Bracket::Unopened,
            }),
        })
    }
}

/// The future of [`Next::run_in`]. The walk happens when it is first
/// polled, as with [`Next::run`].
pub(crate) enum ChainRun<'a, Req: WrapRequest> {
    Start {
        chain: &'a Arc<[StackEntry]>,
        start: Option<(Next<Req>, Req)>,
    },
    /// A middleware answers with a future of its own.
    Hooked(Hooked<'a, Req>),
    /// A `next` of another chain was handed on.
    Elsewhere(BoxFuture<'static, Result<Req::Response, BoxError>>),
    /// The call below the last wrap hook.
    Calling(CallInnermost<Req>),
    Finished,
}

// Nothing is pinned structurally: the futures inside are boxed or `Unpin`.
impl<Req: WrapRequest> Unpin for ChainRun<'_, Req> {}

impl<'a, Req: WrapRequest> Future for ChainRun<'a, Req> {
    type Output = Result<Req::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let ChainRun::Start { chain, start } = this {
            let chain: &'a Arc<[StackEntry]> = chain;
            let (next, req) = start.take().expect("ChainRun polled after completion");
            *this = match ChainRun::after(step(Some(chain), next, req, None)) {
                Ok(run) => run,
                Err(err) => {
                    *this = ChainRun::Finished;
                    return Poll::Ready(Err(err));
                }
            };
        }
        let result = match this {
            ChainRun::Calling(call) => Pin::new(call).poll(cx),
            ChainRun::Hooked(hooked) => hooked.poll(cx),
            ChainRun::Elsewhere(future) => future.as_mut().poll(cx),
            ChainRun::Start { .. } | ChainRun::Finished => {
                panic!("ChainRun polled after completion")
            }
        };
        if result.is_ready() {
            *this = ChainRun::Finished;
        }
        result
    }
}

/// Where a hooked middleware's invocation is in its events.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bracket {
    Unopened,
    Open,
    Closed,
}

/// A wrap hook's own future: `MiddlewareStarted` when first polled,
/// `MiddlewareCompleted` when done (`cancelled` if dropped before), its
/// panic a typed error, its nameless tripwire named after it.
pub(crate) struct Hooked<'a, Req: WrapRequest> {
    entry: &'a StackEntry,
    ctx: RunContext,
    home: Option<usize>,
    future: BoxFuture<'a, Result<Req::Response, BoxError>>,
    state: Bracket,
}

impl<Req: WrapRequest> Hooked<'_, Req> {
    fn close(&mut self, outcome: &'static str) {
        self.state = Bracket::Closed;
        completed(&self.ctx, &self.entry.name, Req::wrap_hook(), outcome);
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<Req::Response, BoxError>> {
        let hook: HookPoint = Req::wrap_hook();
        if self.state == Bracket::Unopened {
            started(&self.ctx, &self.entry.name, hook);
            self.state = Bracket::Open;
        }
        let future = &mut self.future;
        let err = match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(Ok(response))) => {
                self.close("ok");
                return Poll::Ready(Ok(response));
            }
            Ok(Poll::Ready(Err(err))) => {
                self.close("error");
                name_tripwire(err, &self.entry.name, hook.as_str())
            }
            Err(panic) => {
                self.close("panic");
                Box::new(panicked(&self.entry.name, hook, &*panic))
            }
        };
        let err = Req::middleware_error(err, &self.entry.name);
        Poll::Ready(Err(own_failure(&self.ctx, self.home, err)))
    }
}

impl<Req: WrapRequest> Drop for Hooked<'_, Req> {
    fn drop(&mut self) {
        if self.state == Bracket::Open {
            // What the middleware's future closes on its drop comes first,
            // as it nests inside (a pending future is no allocation).
            drop(std::mem::replace(
                &mut self.future,
                Box::pin(std::future::pending()),
            ));
            completed(&self.ctx, &self.entry.name, Req::wrap_hook(), "cancelled");
        }
    }
}
