//! [`Next`]: the rest of the stack below a wrap hook, and the driver that
//! walks the wrap chain to the service below it.

use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};

use super::attribute::{name_tripwire, panicked};
use super::call_hook::Bracket;
use super::stack::Entry;
use super::wrap::{WrapRequest, WrappedKind};
use super::HookPoint;
use crate::context::RunContext;
use crate::error::{kind_of, panic_message, BoxError, ErrorKind};

pub(crate) type BoxService<Req> =
    BoxCloneSyncService<Req, <Req as WrapRequest>::Response, BoxError>;

/// The rest of the stack below a wrap hook: what `next` calls.
///
/// Call [`run`](Self::run) once to proceed, never to answer yourself, or on
/// clones to call it again (retry, fallback). Each run drives the service it
/// calls to readiness first.
///
/// # Clone
///
/// Cheap: clones share the rest of the stack. The service that was made
/// ready before the middleware was called goes to the first run, whichever
/// clone makes it; later runs call a clone of it, driven to readiness then.
pub struct Next<Req: WrapRequest> {
    /// The middleware whose wrap hooks may still run (`None` below a tower
    /// adapter), from `index` on.
    chain: Option<Arc<[Entry]>>,
    index: usize,
    innermost: Arc<Innermost<Req>>,
    /// The middleware that was handed what request, to compare with what it
    /// hands on.
    received: Option<(Arc<str>, Req::Snapshot)>,
    /// The depth of the run the chain's stack was installed for (`None`
    /// outside a run): a wrap hook's own error fails the runs from the
    /// calling one up to that one.
    home: Option<usize>,
}

/// The service below the last wrap hook.
struct Innermost<Req: WrapRequest> {
    /// Made ready by `poll_ready` (holding whatever it reserved) for the
    /// first run; after it, a clone for the runs that may follow.
    ready: Mutex<Option<BoxService<Req>>>,
    /// Below a lifecycle chain: a tool's failure becomes its error result.
    recover: bool,
}

impl<Req: WrapRequest> Innermost<Req> {
    fn new(service: BoxService<Req>, recover: bool) -> Arc<Self> {
        Arc::new(Self {
            ready: Mutex::new(Some(service)),
            recover,
        })
    }

    /// The service for one run. A clone is left behind only while another
    /// `Next` shares this one and so may run later: the `Next` being run is
    /// the last holder otherwise, and nothing can clone it any more.
    fn take(self: &Arc<Self>) -> Option<BoxService<Req>> {
        let mut slot = self.ready.lock().unwrap_or_else(PoisonError::into_inner);
        let service = slot.take()?;
        if Arc::strong_count(self) > 1 {
            *slot = Some(service.clone());
        }
        Some(service)
    }
}

impl<Req: WrapRequest> Next<Req> {
    /// A `next` calling `service` (made ready), for middleware `by` handed
    /// `received`: what a tower adapter hands its middleware.
    pub(crate) fn service(service: BoxService<Req>, by: &Arc<str>, received: &Req) -> Self {
        Self {
            chain: None,
            index: 0,
            innermost: Innermost::new(service, false),
            received: Some((by.clone(), received.snapshot())),
            home: None,
        }
    }

    /// The wrap hooks of `chain` (the first outermost) around `innermost`,
    /// for a stack installed in a run at depth `home`.
    pub(crate) fn chain(
        chain: Arc<[Entry]>,
        innermost: BoxService<Req>,
        home: Option<usize>,
    ) -> Self {
        Self {
            chain: Some(chain),
            index: 0,
            innermost: Innermost::new(innermost, true),
            received: None,
            home,
        }
    }

    /// Calls the rest of the stack with `req`.
    ///
    /// # Errors
    ///
    /// What the rest of the stack fails with.
    pub async fn run(self, mut req: Req) -> Result<Req::Response, BoxError> {
        let mut next = self;
        // What the last middleware handed on, when it is what it was handed:
        // the next middleware's snapshot, without taking it again.
        let mut carried = None;
        loop {
            if let Some((by, received)) = next.received.take() {
                if req.reconcile(&by, &received) {
                    carried = Some(received);
                }
            }
            let hook = Req::wrap_hook();
            let found = next.chain.as_ref().and_then(|chain| {
                chain[next.index.min(chain.len())..]
                    .iter()
                    .position(|e| e.may_override(hook))
                    .map(|at| (chain[next.index + at].clone(), next.index + at))
            });
            let Some((entry, at)) = found else {
                let recover = next.innermost.recover;
                let Some(service) = next.innermost.take() else {
                    return Err("the service below the wrap hooks is gone".into());
                };
                drop(next);
                return call_innermost(service, req, recover).await;
            };
            let inner = Next {
                chain: next.chain.clone(),
                index: at + 1,
                innermost: next.innermost.clone(),
                received: Some((
                    entry.name.clone(),
                    carried.take().unwrap_or_else(|| req.snapshot()),
                )),
                home: next.home,
            };
            let ctx = req.context().clone();
            let wrapped = match catch_unwind(AssertUnwindSafe(|| Req::wrap(&*entry.mw, req, inner)))
            {
                Ok(wrapped) => wrapped.0,
                Err(panic) => {
                    let bracket = Bracket::open(&ctx, &entry.name, hook);
                    bracket.close("panic");
                    let err = Box::new(panicked(&entry.name, hook, &*panic));
                    return Err(own_failure(&ctx, next.home, err));
                }
            };
            match wrapped {
                WrappedKind::NotOverridden(r, mut n) => {
                    // Handed on as it came: nothing to reconcile.
                    entry.learn_absent(hook);
                    carried = n.received.take().map(|(_, snapshot)| snapshot);
                    req = r;
                    next = n;
                }
                WrappedKind::Next(r, n) => {
                    req = r;
                    next = n;
                }
                WrappedKind::Future(future) => {
                    // The middleware holds the rest of the stack now.
                    let home = next.home;
                    drop(next);
                    let result = guarded(&ctx, &entry.name, hook, || future).await;
                    return result
                        .map_err(|err| own_failure(&ctx, home, Req::link_error(err, &entry.name)));
                }
            }
        }
    }
}

/// Notes a middleware failure of a wrap hook for the runs it fails.
fn own_failure(ctx: &RunContext, home: Option<usize>, err: BoxError) -> BoxError {
    if let Some(home) = home {
        if kind_of(err.as_ref()) == ErrorKind::Middleware {
            ctx.note_hook_failure(ctx.depth().saturating_sub(home));
        }
    }
    err
}

impl<Req: WrapRequest> Clone for Next<Req> {
    fn clone(&self) -> Self {
        Self {
            chain: self.chain.clone(),
            index: self.index,
            innermost: self.innermost.clone(),
            received: self.received.clone(),
            home: self.home,
        }
    }
}

impl<Req: WrapRequest> fmt::Debug for Next<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rest: Vec<&str> = self
            .chain
            .iter()
            .flat_map(|chain| chain[self.index.min(chain.len())..].iter())
            .filter(|e| e.may_override(Req::wrap_hook()))
            .map(|e| &*e.name)
            .collect();
        f.debug_struct("Next")
            .field("middleware", &rest)
            .finish_non_exhaustive()
    }
}

/// Calls the service below the last wrap hook: made ready first; a panic
/// becomes an error, and a nameless tripwire names the model or the tool.
/// Below a lifecycle chain (`recover`), a tool's failure becomes the error
/// result the model would read, so that what a middleware fails with is its
/// own error.
pub(crate) async fn call_innermost<Req: WrapRequest>(
    mut service: BoxService<Req>,
    req: Req,
    recover: bool,
) -> Result<Req::Response, BoxError> {
    let name = req.callee();
    let ctx = recover.then(|| req.context().clone());
    let base = || format!("{}:{name}", Req::KIND);
    service.ready().await?;
    let result = match AssertUnwindSafe(service.call(req)).catch_unwind().await {
        Ok(result) => result.map_err(|e| name_tripwire(e, &base(), "call")),
        Err(panic) => Err(format!("`{}` panicked: {}", base(), panic_message(&*panic)).into()),
    };
    match (result, ctx) {
        (Err(err), Some(ctx)) => Req::recover(&ctx, &name, err),
        (result, _) => result,
    }
}

/// Runs one wrap hook's future: events around it, its panic a typed error,
/// its nameless tripwire named after it.
pub(crate) async fn guarded<R, F>(
    ctx: &RunContext,
    name: &Arc<str>,
    hook: HookPoint,
    make: impl FnOnce() -> F,
) -> Result<R, BoxError>
where
    F: Future<Output = Result<R, BoxError>>,
{
    let bracket = Bracket::open(ctx, name, hook);
    let result = match catch_unwind(AssertUnwindSafe(make)) {
        Ok(future) => AssertUnwindSafe(future).catch_unwind().await,
        Err(panic) => Err(panic),
    };
    match result {
        Ok(Ok(response)) => {
            bracket.close("ok");
            Ok(response)
        }
        Ok(Err(err)) => {
            bracket.close("error");
            Err(name_tripwire(err, name, hook.as_str()))
        }
        Err(panic) => {
            bracket.close("panic");
            Err(Box::new(panicked(name, hook, &*panic)))
        }
    }
}
