//! [`Next`]: the rest of the stack below a wrap hook, and the driver that
//! walks the wrap chain to the service below it.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};

use futures::future::BoxFuture;
use futures::FutureExt;
use tower::util::BoxCloneSyncService;
use tower::Service;

use super::attribute::{name_tripwire, panicked};
use super::call_hook::Bracket;
use super::stack::StackEntry;
use super::wrap::{WrapRequest, WrappedKind};
use super::HookPoint;
use crate::context::RunContext;
use crate::error::{kind_of, BoxError, ErrorKind};

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
    chain: Option<Arc<[StackEntry]>>,
    index: usize,
    innermost: Below<Req>,
    /// What the middleware that was handed this `next` received, to compare
    /// with what it hands on.
    received: Option<Received<Req>>,
    /// The depth of the run the chain's stack was installed for (`None`
    /// outside a run): a wrap hook's own error fails the runs from the
    /// calling one up to that one.
    home: Option<usize>,
}

/// What a middleware was handed, and who it is: below a tower adapter the
/// adapter's middleware (`by`), in a chain the one before `index`.
struct Received<Req: WrapRequest> {
    by: Option<Arc<str>>,
    snapshot: Req::Snapshot,
}

impl<Req: WrapRequest> Clone for Received<Req> {
    fn clone(&self) -> Self {
        Self {
            by: self.by.clone(),
            snapshot: self.snapshot.clone(),
        }
    }
}

/// The service below the last wrap hook, as one `Next` holds it: its own
/// until the `Next` is first cloned, shared from then on. A chain whose
/// middleware only hand the call on never shares it, and allocates nothing
/// for it.
struct Below<Req: WrapRequest> {
    slot: Mutex<Slot<Req>>,
    /// Below a lifecycle chain: a tool's failure becomes its error result.
    recover: bool,
}

enum Slot<Req: WrapRequest> {
    /// Made ready by `poll_ready` (holding whatever it reserved) for the
    /// run of this `Next`; `None` once taken.
    Own(Option<BoxService<Req>>),
    /// Shared with the clones.
    Shared(Arc<Innermost<Req>>),
    /// The caller's own service, cloned only for a run that calls it: a
    /// walk whose middleware all hand the call on gives it back uncloned.
    Lent(Arc<BoxService<Req>>),
}

/// The service below the last wrap hook, as a walk reaches it.
pub(crate) enum Found<Req: WrapRequest> {
    /// A service of the walk's own.
    Own(BoxService<Req>),
    /// The service the caller lent the chain, not cloned.
    Lent(Arc<BoxService<Req>>),
}

impl<Req: WrapRequest> Found<Req> {
    /// The service to call, cloned from the caller's when it was lent.
    pub(crate) fn into_service(self) -> BoxService<Req> {
        match self {
            Found::Own(service) => service,
            Found::Lent(lent) => BoxService::clone(&lent),
        }
    }

    /// The walk's own service; `None` when it is the one the caller lent.
    pub(crate) fn into_own(self) -> Option<BoxService<Req>> {
        match self {
            Found::Own(service) => Some(service),
            Found::Lent(_) => None,
        }
    }
}

impl<Req: WrapRequest> Below<Req> {
    fn new(service: BoxService<Req>, recover: bool) -> Self {
        Self {
            slot: Mutex::new(Slot::Own(Some(service))),
            recover,
        }
    }

    /// The same service, for a clone of the `Next`: shared from now on.
    fn share(&self) -> Self {
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        let shared = match &mut *slot {
            Slot::Lent(lent) => {
                return Self {
                    slot: Mutex::new(Slot::Lent(lent.clone())),
                    recover: self.recover,
                }
            }
            Slot::Shared(shared) => shared.clone(),
            Slot::Own(service) => {
                let shared = Arc::new(Innermost {
                    ready: Mutex::new(service.take()),
                });
                *slot = Slot::Shared(shared.clone());
                shared
            }
        };
        Self {
            slot: Mutex::new(Slot::Shared(shared)),
            recover: self.recover,
        }
    }

    /// The service for the one run of this `Next`.
    fn take(self) -> Option<Found<Req>> {
        match self
            .slot
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
        {
            Slot::Own(service) => service.map(Found::Own),
            Slot::Shared(shared) => shared.take().map(Found::Own),
            Slot::Lent(lent) => Some(Found::Lent(lent)),
        }
    }
}

/// The service below the last wrap hook, shared by the clones of a `Next`.
struct Innermost<Req: WrapRequest> {
    /// Made ready by `poll_ready` (holding whatever it reserved) for the
    /// first run; after it, a clone for the runs that may follow.
    ready: Mutex<Option<BoxService<Req>>>,
}

impl<Req: WrapRequest> Innermost<Req> {
    /// The service for one run. A clone is left behind only while another
    /// `Next` shares this one and so may run later: the `Next` being run is
    /// the last holder otherwise, and nothing can clone it any more.
    fn take(self: Arc<Self>) -> Option<BoxService<Req>> {
        let mut slot = self.ready.lock().unwrap_or_else(PoisonError::into_inner);
        let service = slot.take()?;
        if Arc::strong_count(&self) > 1 {
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
            innermost: Below::new(service, false),
            received: Some(Received {
                by: Some(by.clone()),
                snapshot: received.snapshot(),
            }),
            home: None,
        }
    }

    /// The wrap hooks of `chain` (the first outermost) around `innermost`,
    /// for a stack installed in a run at depth `home`.
    pub(crate) fn chain(
        chain: Arc<[StackEntry]>,
        innermost: BoxService<Req>,
        home: Option<usize>,
    ) -> Self {
        Self {
            chain: Some(chain),
            index: 0,
            innermost: Below::new(innermost, true),
            received: None,
            home,
        }
    }

    /// [`chain`](Self::chain) around the caller's own `innermost`, which is
    /// cloned only for a run that calls it.
    pub(crate) fn chain_lent(
        chain: Arc<[StackEntry]>,
        innermost: &Arc<BoxService<Req>>,
        home: Option<usize>,
    ) -> Self {
        Self {
            chain: Some(chain),
            index: 0,
            innermost: Below {
                slot: Mutex::new(Slot::Lent(innermost.clone())),
                recover: true,
            },
            received: None,
            home,
        }
    }

    /// Calls the rest of the stack with `req`.
    ///
    /// # Errors
    ///
    /// What the rest of the stack fails with.
    pub fn run(
        self,
        req: Req,
    ) -> impl Future<Output = Result<Req::Response, BoxError>> + Send + 'static {
        // Walking the chain happens when the future is first polled, as the
        // call would; below the last wrap hook only the service's call is
        // left, which replaces the walk in the future's place.
        RunFuture::Walking {
            walk: walk(self, req),
        }
    }
}

pin_project_lite::pin_project! {
    /// [`Next::run`]: the walk down the chain, then the call of the service
    /// below it in the walk's place.
    #[project = RunProj]
    enum RunFuture<W, Req: WrapRequest> {
        Walking { #[pin] walk: W },
        Calling { call: CallInnermost<Req> },
    }
}

impl<W, Req> Future for RunFuture<W, Req>
where
    Req: WrapRequest,
    W: Future<Output = Walked<Req>>,
{
    type Output = Result<Req::Response, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let RunProj::Walking { walk } = self.as_mut().project() {
            match ready!(walk.poll(cx)) {
                Walked::Done(result) => return Poll::Ready(result),
                Walked::Innermost(service, req, recover) => self.set(RunFuture::Calling {
                    call: call_innermost(service, req, recover),
                }),
            }
        }
        match self.project() {
            RunProj::Calling { call } => Pin::new(call).poll(cx),
            RunProj::Walking { .. } => unreachable!("the walk just ended"),
        }
    }
}

/// Where a walk down the chain ended.
enum Walked<Req: WrapRequest> {
    /// Below the last wrap hook: the service to call, with the request.
    Innermost(BoxService<Req>, Req, bool),
    /// A middleware answered (or failed).
    Done(Result<Req::Response, BoxError>),
}

/// One step of the walk: what [`step`] found.
pub(super) enum Step<'e, Req: WrapRequest> {
    Innermost(Found<Req>, Req, bool),
    /// A middleware answers with a future of its own.
    Hooked {
        entry: &'e StackEntry,
        ctx: RunContext,
        home: Option<usize>,
        future: BoxFuture<'e, Result<Req::Response, BoxError>>,
    },
    /// A `next` of another chain was handed on: it runs on its own.
    Elsewhere(Next<Req>, Req),
    Failed(BoxError),
}

/// Walks `next`'s chain while its middleware hand the request on, to the
/// first that answers with a future of its own or to the service below.
async fn walk<Req: WrapRequest>(next: Next<Req>, req: Req) -> Walked<Req> {
    // The chain lives here while its middleware's future borrows it.
    let chain = next.chain.clone();
    // Only what is awaited below lives across the await.
    let hooked = match step(chain.as_ref(), next, req, None) {
        Step::Innermost(service, req, recover) => {
            return Walked::Innermost(service.into_service(), req, recover)
        }
        Step::Failed(err) => return Walked::Done(Err(err)),
        Step::Elsewhere(next, req) => {
            let run: BoxFuture<'static, _> = Box::pin(next.run(req));
            Err(run)
        }
        Step::Hooked {
            entry,
            ctx,
            home,
            future,
        } => Ok((entry, ctx, home, future)),
    };
    let result = match hooked {
        Err(run) => run.await,
        Ok((entry, ctx, home, future)) => {
            let result = guarded(&ctx, &entry.name, Req::wrap_hook(), || future).await;
            result.map_err(|err| own_failure(&ctx, home, Req::middleware_error(err, &entry.name)))
        }
    };
    Walked::Done(result)
}

/// The synchronous part of a walk: each wrap hook that hands the request on
/// is called here, with no future and nothing shared cloned for it. One
/// `catch_unwind` guards the whole walk: a panic is attributed to the
/// middleware being called when it struck. `run`, the context of the run
/// the request belongs to when the caller has it, is borrowed rather than
/// cloned while the request keeps it.
pub(super) fn step<'e, Req: WrapRequest>(
    chain: Option<&'e Arc<[StackEntry]>>,
    next: Next<Req>,
    req: Req,
    run: Option<&RunContext>,
) -> Step<'e, Req> {
    // The context of the request the current middleware is handed.
    let mut ctx = match run {
        Some(run) if req.context().same_run(run) => Cow::Borrowed(run),
        _ => Cow::Owned(req.context().clone()),
    };
    // The middleware being called, and the home of its chain.
    let mut calling = None;
    match catch_unwind(AssertUnwindSafe(|| {
        walk_chain(chain, next, req, &mut ctx, &mut calling)
    })) {
        Ok(step) => step,
        Err(panic) => {
            let Some((entry, home)) = calling else {
                // Not a middleware's: the walk's own, which goes on up.
                resume_unwind(panic)
            };
            let entry: &StackEntry = entry;
            let hook = Req::wrap_hook();
            let bracket = Bracket::open(&ctx, &entry.name, hook);
            bracket.close("panic");
            let err = Box::new(panicked(&entry.name, hook, &*panic));
            Step::Failed(own_failure(&ctx, home, err))
        }
    }
}

/// The loop of [`step`]: `calling` names the middleware whose wrap hook
/// runs, while it runs.
fn walk_chain<'e, Req: WrapRequest>(
    chain: Option<&'e Arc<[StackEntry]>>,
    mut next: Next<Req>,
    mut req: Req,
    ctx: &mut Cow<'_, RunContext>,
    calling: &mut Option<(&'e StackEntry, Option<usize>)>,
) -> Step<'e, Req> {
    let hook = Req::wrap_hook();
    // Whether `next` holds the snapshot of `req` as it is: handed on as it
    // came by a middleware that does not override the hook.
    let mut unchanged = false;
    loop {
        // What the last middleware was handed stays in `next` for the next
        // one, unless the request changed since.
        if let (false, Some(Received { by, snapshot })) = (unchanged, &next.received) {
            let by = match (by, &next.chain) {
                (Some(by), _) => Some(by),
                (None, Some(own)) => next.index.checked_sub(1).map(|i| &own[i].name),
                (None, None) => None,
            };
            if !by.is_none_or(|by| req.reconcile(by, snapshot)) {
                next.received = None;
            }
        }
        unchanged = false;
        let entries = match (&next.chain, chain) {
            (None, _) => None,
            (Some(own), Some(chain)) if Arc::ptr_eq(own, chain) => Some(&chain[..]),
            (Some(_), _) => return Step::Elsewhere(next, req),
        };
        let found = entries.and_then(|entries| {
            let from = next.index.min(entries.len());
            entries[from..]
                .iter()
                .position(|e| e.may_override(hook))
                .map(|at| (&entries[from + at], from + at))
        });
        let Some((entry, at)) = found else {
            let recover = next.innermost.recover;
            let Some(service) = next.innermost.take() else {
                return Step::Failed("the service below the wrap hooks is gone".into());
            };
            return Step::Innermost(service, req, recover);
        };
        if !req.context().same_run(ctx) {
            *ctx = Cow::Owned(req.context().clone());
        }
        // The same `next`, one further down, handed what `req` is now.
        next.index = at + 1;
        if next.received.is_none() {
            next.received = Some(Received {
                by: None,
                snapshot: req.snapshot(),
            });
        }
        let home = next.home;
        *calling = Some((entry, home));
        let wrapped = Req::wrap(&*entry.mw, req, next).0;
        *calling = None;
        match wrapped {
            WrappedKind::NotOverridden(r, n) => {
                // Handed on as it came: nothing to reconcile.
                entry.learn_absent(hook);
                unchanged = true;
                req = r;
                next = n;
            }
            WrappedKind::Next(r, n) => {
                req = r;
                next = n;
            }
            WrappedKind::Future(future) => {
                // The middleware holds the rest of the stack now.
                return Step::Hooked {
                    entry,
                    ctx: ctx.clone().into_owned(),
                    home,
                    future,
                };
            }
        }
    }
}

/// Notes a middleware failure of a wrap hook for the runs it fails.
pub(super) fn own_failure(ctx: &RunContext, home: Option<usize>, err: BoxError) -> BoxError {
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
            innermost: self.innermost.share(),
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
pub(crate) fn call_innermost<Req: WrapRequest>(
    service: BoxService<Req>,
    req: Req,
    recover: bool,
) -> CallInnermost<Req> {
    CallInnermost {
        name: req.callee(),
        ctx: (recover && Req::RECOVERS).then(|| req.context().clone()),
        service,
        req: Some(req),
        call: None,
    }
}

/// The future of [`call_innermost`].
pub(crate) struct CallInnermost<Req: WrapRequest> {
    service: BoxService<Req>,
    /// Until the service is ready.
    req: Option<Req>,
    call: Option<<BoxService<Req> as Service<Req>>::Future>,
    name: Req::Name,
    /// Set when a failure becomes the error result.
    ctx: Option<RunContext>,
}

// Nothing is pinned structurally: the service's future is pinned on the heap.
impl<Req: WrapRequest> Unpin for CallInnermost<Req> {}

impl<Req: WrapRequest> Future for CallInnermost<Req> {
    type Output = Result<Req::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.call.is_none() {
            if let Err(err) = ready!(this.service.poll_ready(cx)) {
                return Poll::Ready(Err(err));
            }
        }
        let (service, req, call) = (&mut this.service, &mut this.req, &mut this.call);
        // A service may panic in `call` as well as in its future (a tool
        // that runs inline): both are the tool's panic.
        let answer = match catch_unwind(AssertUnwindSafe(|| {
            let call = call.get_or_insert_with(|| {
                service.call(req.take().expect("CallInnermost polled after completion"))
            });
            call.as_mut().poll(cx)
        })) {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(answer)) => Ok(answer),
            Err(panic) => Err(panic),
        };
        Poll::Ready(innermost_answer::<Req>(
            answer,
            &this.name,
            this.ctx.take().as_ref(),
        ))
    }
}

/// What the answer of the service below the last wrap hook becomes: its
/// panic an error (a tool's a [`ToolPanicked`](crate::error::ToolPanicked)),
/// its nameless tripwire named after the model or the tool `name`; with
/// `recover` (the run's context), a tool's failure, its panic too, its
/// error result.
pub(crate) fn innermost_answer<Req: WrapRequest>(
    answer: std::thread::Result<Result<Req::Response, BoxError>>,
    name: &Req::Name,
    recover: Option<&RunContext>,
) -> Result<Req::Response, BoxError> {
    let base = || format!("{}:{}", Req::KIND, name);
    // An answer goes out as it came, moved once.
    let err = match answer {
        Ok(Ok(response)) => return Ok(response),
        Ok(Err(err)) => name_tripwire(err, &base(), "call"),
        Err(panic) => Req::panicked(name, &*panic),
    };
    match recover {
        Some(ctx) => Req::recover(ctx, name, err),
        None => Err(err),
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
