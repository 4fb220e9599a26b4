//! One model or tool call through a stack's part of the onion: the delta
//! hooks on the stream sink, the wrap chain, then the service below
//! ([`StackModel`], [`StackTool`] when an inherited stack wraps it).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};

use futures::future::Either;
use futures::task::AtomicWaker;
use futures::FutureExt;
use tower::Service;

use super::chain_run::ChainRun;
use super::inline_bytes::{Builder, InlineBytes};
use super::next::{call_innermost, step, Step};
use super::stack::CompiledStack;
use super::{HookPoint, Next, ResponseFuture};
use crate::context::RunContext;
use crate::error::{kind_of, AgentError, BoxError, ErrorKind};
use crate::hooks::{CallAbort, HookFuture, ToolFinish, ToolWalk};
use crate::request::{
    BoxModel, BoxTool, Deliver, DeltaSink, ModelCall, ToolInvocation, ToolOutput,
};
use crate::types::{ModelDelta, ModelResponse, ToolCall};

/// The first error a delta hook raised, which aborts the call.
#[derive(Default)]
struct DeltaFailure {
    failed: AtomicBool,
    error: Mutex<Option<AgentError>>,
    /// The task waiting for the call, woken when a delta hook fails.
    waker: AtomicWaker,
}

impl DeltaFailure {
    fn fail(&self, err: AgentError) {
        let mut slot = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(err);
            self.failed.store(true, Ordering::Release);
            self.waker.wake();
        }
    }

    fn take(&self) -> Option<AgentError> {
        // The flag goes up only once the error is in: a call whose delta
        // hooks never failed (nearly every one) takes no lock to learn it.
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    fn error_box(&self) -> BoxError {
        match self.take() {
            Some(err) => Box::new(err),
            None => "a delta hook failed".into(),
        }
    }
}

pin_project_lite::pin_project! {
    /// A call's future, unless a delta hook fails first: then its error, and
    /// the call's future is dropped (the stream is cut). No bigger than the
    /// call's future and a pointer.
    struct Raced<F, G> {
        #[pin]
        fut: F,
        guard: Arc<G>,
    }
}

impl<T, F, G> Future for Raced<F, G>
where
    F: Future<Output = Result<T, BoxError>>,
    G: AsRef<DeltaFailure>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let failure = (**this.guard).as_ref();
        if failure.failed.load(Ordering::Acquire) {
            return Poll::Ready(Err(failure.error_box()));
        }
        failure.waker.register(cx.waker());
        match this.fut.poll(cx) {
            Poll::Ready(result) => Poll::Ready(match failure.take() {
                Some(err) => Err(Box::new(err)),
                None => result,
            }),
            Poll::Pending if failure.failed.load(Ordering::Acquire) => {
                Poll::Ready(Err(failure.error_box()))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A sink's state: the delta hooks, what they failed with, and the sink
/// the deltas go on to. The sink and the call's future share it.
struct Guard<H> {
    failure: DeltaFailure,
    downstream: Option<DeltaSink>,
    hooks: H,
}

impl<H> AsRef<DeltaFailure> for Guard<H> {
    fn as_ref(&self) -> &DeltaFailure {
        &self.failure
    }
}

impl<H> Deliver for Guard<H>
where
    H: Fn(&mut ModelDelta) -> Result<(), AgentError> + Send + Sync + 'static,
{
    fn deliver(&self, delta: &ModelDelta) {
        if self.failure.failed.load(Ordering::Acquire) {
            return;
        }
        let mut delta = delta.clone();
        match (self.hooks)(&mut delta) {
            Ok(()) => {
                if let Some(sink) = &self.downstream {
                    sink.send(&delta);
                }
            }
            Err(err) => self.failure.fail(err),
        }
    }
}

/// A sink running `hooks` on each delta before passing it `downstream`,
/// and the state it shares with the call's future.
fn guard_sink<H>(downstream: Option<DeltaSink>, hooks: H) -> (DeltaSink, Arc<Guard<H>>)
where
    H: Fn(&mut ModelDelta) -> Result<(), AgentError> + Send + Sync + 'static,
{
    // Deltas the run holds stay provisional: a retry may still replay the call.
    let provisional = downstream.as_ref().is_some_and(DeltaSink::is_provisional);
    let guard = Arc::new(Guard {
        failure: DeltaFailure::default(),
        downstream,
        hooks,
    });
    (DeltaSink::shared(guard.clone(), provisional), guard)
}

/// The call a tool's delta hooks see, as it was when the call set out: one
/// copy, inline when short, made a [`ToolCall`] at the first delta (most
/// tools stream none).
struct CallCopy {
    /// The id, the name and the arguments, one after the other.
    packed: InlineBytes,
    /// Where the id ends and the name starts.
    id_end: usize,
    /// Where the name ends and the arguments start.
    name_end: usize,
    call: OnceLock<ToolCall>,
}

impl CallCopy {
    fn new(call: &ToolCall) -> Self {
        let mut packed = Builder::new();
        packed.extend(call.id.as_bytes());
        let id_end = packed.len();
        packed.extend(call.name.as_bytes());
        let name_end = packed.len();
        packed.extend(call.arguments.as_bytes());
        Self {
            packed: packed.finish(),
            id_end,
            name_end,
            call: OnceLock::new(),
        }
    }

    fn get(&self) -> &ToolCall {
        self.call.get_or_init(|| {
            // Cut where whole strings were joined: each part is UTF-8.
            let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
            let packed = self.packed.as_bytes();
            ToolCall {
                id: text(&packed[..self.id_end]),
                name: text(&packed[self.id_end..self.name_end]),
                arguments: text(&packed[self.name_end..]),
            }
        })
    }
}

/// One model call through `stack`'s part of the onion. Delta hooks see the
/// stream only in a run that streams. The set-up happens here, at once; the
/// future only waits.
pub(crate) fn model_call(
    stack: Arc<CompiledStack>,
    call: ModelCall,
    base: BoxModel,
    home: Option<usize>,
) -> impl Future<Output = Result<ModelResponse, BoxError>> + Send + 'static {
    model_call_via(&stack, call, base, home, |next, call| next.run(call))
}

/// [`model_call`] for a caller that holds `stack` while the call runs: the
/// walk down its wrap chain needs no future of its own.
pub(crate) fn model_call_in(
    stack: &Arc<CompiledStack>,
    call: ModelCall,
    base: BoxModel,
    home: Option<usize>,
) -> impl Future<Output = Result<ModelResponse, BoxError>> + Send + '_ {
    model_call_via(stack, call, base, home, move |next, call| {
        next.run_in(&stack.entries, call)
    })
}

fn model_call_via<F>(
    stack: &Arc<CompiledStack>,
    mut call: ModelCall,
    base: BoxModel,
    home: Option<usize>,
    run: impl FnOnce(Next<ModelCall>, ModelCall) -> F,
) -> impl Future<Output = Result<ModelResponse, BoxError>> + Send
where
    F: Future<Output = Result<ModelResponse, BoxError>> + Send,
{
    // Read first: writing to the call would copy its parts if shared.
    let failure = if call.stream.is_some() && stack.has(HookPoint::OnModelDelta) {
        let (hooks, ctx) = (stack.clone(), call.context.clone());
        let parts = &mut *call;
        let (sink, guard) = guard_sink(parts.stream.take(), move |delta: &mut ModelDelta| {
            hooks.on_model_delta(&ctx, delta)
        });
        parts.stream = Some(sink);
        Some(guard)
    } else {
        None
    };
    let fut = if stack.has(HookPoint::WrapModel) {
        Either::Left(run(Next::chain(stack.entries.clone(), base, home), call))
    } else {
        // No wrap hook may run: straight to the service below.
        Either::Right(call_innermost(base, call, true))
    };
    match failure {
        None => Either::Left(fut),
        Some(guard) => Either::Right(Raced { fut, guard }),
    }
}

/// One tool call through `stack`'s part of the onion. With delta hooks, the
/// tool gets a sink for its progress even when nobody else listens.
pub(crate) fn tool_call(
    stack: Arc<CompiledStack>,
    invocation: ToolInvocation,
    base: BoxTool,
    home: Option<usize>,
) -> impl Future<Output = Result<ToolOutput, BoxError>> + Send + 'static {
    tool_call_via(&stack, invocation, base, home, |next, invocation| {
        next.run(invocation)
    })
}

/// [`tool_call`] for a caller that holds `stack` while the call runs.
pub(crate) fn tool_call_in(
    stack: &Arc<CompiledStack>,
    invocation: ToolInvocation,
    base: BoxTool,
    home: Option<usize>,
) -> impl Future<Output = Result<ToolOutput, BoxError>> + Send + '_ {
    tool_call_via(stack, invocation, base, home, move |next, invocation| {
        next.run_in(&stack.entries, invocation)
    })
}

fn tool_call_via<F>(
    stack: &Arc<CompiledStack>,
    mut invocation: ToolInvocation,
    base: BoxTool,
    home: Option<usize>,
    run: impl FnOnce(Next<ToolInvocation>, ToolInvocation) -> F,
) -> impl Future<Output = Result<ToolOutput, BoxError>> + Send
where
    F: Future<Output = Result<ToolOutput, BoxError>> + Send,
{
    let failure = tool_guard(stack, &mut invocation);
    let ctx = invocation.context.clone();
    let fut = if stack.has(HookPoint::WrapTool) {
        Either::Left(run(
            Next::chain(stack.entries.clone(), base, home),
            invocation,
        ))
    } else {
        Either::Right(call_innermost(base, invocation, true))
    };
    noted(fut, failure, ctx, home)
}

/// [`tool_call_in`] for a caller that calls the tool stack itself when
/// every wrap hook hands the call on: the walk happens here, at once.
pub(crate) fn tool_walk<'s>(
    stack: &'s Arc<CompiledStack>,
    mut invocation: ToolInvocation,
    base: &Arc<BoxTool>,
    streams: bool,
    home: Option<usize>,
    ctx: &RunContext,
) -> ToolWalk<'s> {
    // A tool that sends no progress needs no sink for the delta hooks.
    let failure = if streams {
        tool_guard(stack, &mut invocation)
    } else {
        None
    };
    let finish = |abort: Option<Arc<dyn CallAbort>>| ToolFinish { home, abort };
    if !stack.has(HookPoint::WrapTool) {
        return ToolWalk::Service {
            service: None,
            invocation,
            finish: finish(failure.map(|g| g as Arc<dyn CallAbort>)),
        };
    }
    // The tool stack is cloned only for a wrap hook that calls it: a walk
    // whose middleware all hand the call on gives it back uncloned.
    let next = Next::chain_lent(stack.entries.clone(), base, home);
    let fut = match step(Some(&stack.entries), next, invocation, Some(ctx)) {
        Step::Innermost(found, invocation, _) => {
            return ToolWalk::Service {
                service: found.into_own(),
                invocation,
                finish: finish(failure.map(|g| g as Arc<dyn CallAbort>)),
            };
        }
        step => match ChainRun::after(step) {
            Ok(run) => Either::Left(run),
            Err(err) => Either::Right(std::future::ready(Err(err))),
        },
    };
    ToolWalk::Future(HookFuture::new(noted(fut, failure, ctx.clone(), home)))
}

/// The delta hooks' sink of a tool call through `stack`, put in
/// `invocation`, and the state it shares with the call's future; `None`
/// when the stack has no delta hook.
fn tool_guard(
    stack: &Arc<CompiledStack>,
    invocation: &mut ToolInvocation,
) -> Option<Arc<Guard<impl DeltaHooks>>> {
    if !stack.has(HookPoint::OnToolDelta) {
        return None;
    }
    let (hooks, ctx, call) = (
        stack.clone(),
        invocation.context.clone(),
        CallCopy::new(&invocation.call),
    );
    let (sink, guard) = guard_sink(invocation.stream.take(), move |delta: &mut ModelDelta| {
        hooks.on_tool_delta(&ctx, call.get(), delta)
    });
    invocation.stream = Some(sink);
    Some(guard)
}

/// The delta hooks a sink runs on each delta.
trait DeltaHooks: Fn(&mut ModelDelta) -> Result<(), AgentError> + Send + Sync + 'static {}

impl<H> DeltaHooks for H where
    H: Fn(&mut ModelDelta) -> Result<(), AgentError> + Send + Sync + 'static
{
}

/// A tool call's future cut by the first error of its delta hooks
/// (`failure`), whose middleware failure is noted for the runs it fails.
fn noted<F, G>(
    fut: F,
    failure: Option<Arc<G>>,
    ctx: RunContext,
    home: Option<usize>,
) -> impl Future<Output = Result<ToolOutput, BoxError>> + Send
where
    F: Future<Output = Result<ToolOutput, BoxError>> + Send,
    G: AsRef<DeltaFailure> + Send + Sync,
{
    let fut = match failure {
        None => Either::Left(fut),
        Some(guard) => Either::Right(Raced { fut, guard }),
    };
    fut.inspect(move |result| {
        if let Err(err) = result {
            note_failure(&ctx, home, err);
        }
    })
}

/// What fails a tool call as a middleware error is this stack's (a nested
/// run's own failures became error results below): it fails the runs up to
/// the one the stack was installed for, at `home`.
pub(crate) fn note_failure(ctx: &RunContext, home: Option<usize>, err: &BoxError) {
    if let Some(home) = home {
        if kind_of(err.as_ref()) == ErrorKind::Middleware {
            ctx.note_hook_failure(ctx.depth().saturating_sub(home));
        }
    }
}

impl<H> CallAbort for Guard<H>
where
    H: Send + Sync,
{
    fn failed(&self) -> Option<BoxError> {
        self.failure
            .failed
            .load(Ordering::Acquire)
            .then(|| self.failure.error_box())
    }

    fn has_failed(&self) -> bool {
        self.failure.failed.load(Ordering::Acquire)
    }

    fn register(&self, waker: &Waker) {
        self.failure.waker.register(waker);
    }

    fn take(&self) -> Option<BoxError> {
        self.failure.take().map(|err| Box::new(err) as BoxError)
    }
}

/// A stack's part of the model onion as a service: what the inherited
/// hooks' `wrap_model` gets as its `next`.
#[derive(Clone)]
pub(crate) struct StackModel {
    pub(crate) stack: Arc<CompiledStack>,
    pub(crate) base: BoxModel,
    pub(crate) home: Option<usize>,
}

impl Service<ModelCall> for StackModel {
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = ResponseFuture<ModelResponse>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.base.poll_ready(cx)
    }

    fn call(&mut self, call: ModelCall) -> Self::Future {
        let clone = self.base.clone();
        let base = std::mem::replace(&mut self.base, clone);
        ResponseFuture::new(model_call(self.stack.clone(), call, base, self.home))
    }
}

/// A stack's part of the tool onion as a service.
#[derive(Clone)]
pub(crate) struct StackTool {
    pub(crate) stack: Arc<CompiledStack>,
    pub(crate) base: BoxTool,
    pub(crate) home: Option<usize>,
}

impl Service<ToolInvocation> for StackTool {
    type Response = ToolOutput;
    type Error = BoxError;
    type Future = ResponseFuture<ToolOutput>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.base.poll_ready(cx)
    }

    fn call(&mut self, invocation: ToolInvocation) -> Self::Future {
        let clone = self.base.clone();
        let base = std::mem::replace(&mut self.base, clone);
        ResponseFuture::new(tool_call(self.stack.clone(), invocation, base, self.home))
    }
}
