//! One model or tool call through a stack's part of the onion: the delta
//! hooks on the stream sink, the wrap chain, then the service below
//! ([`StackModel`], [`StackTool`] when an inherited stack wraps it).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tokio::sync::Notify;
use tower::Service;

use futures::future::Either;

use super::next::call_innermost;
use super::stack::CompiledStack;
use super::{HookPoint, Next, ResponseFuture};
use crate::error::{kind_of, AgentError, BoxError, ErrorKind};
use crate::request::{BoxModel, BoxTool, DeltaSink, ModelCall, ToolInvocation, ToolOutput};
use crate::types::{ModelDelta, ModelResponse};

/// The first error a delta hook raised, which aborts the call.
#[derive(Default)]
struct DeltaFailure {
    failed: AtomicBool,
    error: Mutex<Option<AgentError>>,
    notify: Notify,
}

impl DeltaFailure {
    fn fail(&self, err: AgentError) {
        let mut slot = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(err);
            self.failed.store(true, Ordering::Release);
            self.notify.notify_one();
        }
    }

    fn take(&self) -> Option<AgentError> {
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// `fut`, unless a delta hook fails first: then its error, and `fut`
    /// is dropped (the stream is cut).
    async fn race<T>(&self, fut: impl Future<Output = Result<T, BoxError>>) -> Result<T, BoxError> {
        tokio::select! {
            biased;
            () = self.notify.notified() => Err(self.error_box()),
            result = fut => match self.take() {
                Some(err) => Err(Box::new(err)),
                None => result,
            },
        }
    }

    fn error_box(&self) -> BoxError {
        match self.take() {
            Some(err) => Box::new(err),
            None => "a delta hook failed".into(),
        }
    }
}

/// A sink running `hooks` on each delta before passing it `downstream`.
fn guard_sink(
    downstream: Option<DeltaSink>,
    failure: Arc<DeltaFailure>,
    hooks: impl Fn(&mut ModelDelta) -> Result<(), AgentError> + Send + Sync + 'static,
) -> DeltaSink {
    let provisional = downstream.as_ref().is_some_and(DeltaSink::is_provisional);
    let guarded = move |delta: &ModelDelta| {
        if failure.failed.load(Ordering::Acquire) {
            return;
        }
        let mut delta = delta.clone();
        match hooks(&mut delta) {
            Ok(()) => {
                if let Some(sink) = &downstream {
                    sink.send(&delta);
                }
            }
            Err(err) => failure.fail(err),
        }
    };
    // Deltas the run holds stay provisional: a retry may still replay the call.
    if provisional {
        DeltaSink::provisional(guarded)
    } else {
        DeltaSink::new(guarded)
    }
}

/// One model call through `stack`'s part of the onion. Delta hooks see the
/// stream only in a run that streams.
pub(crate) async fn model_call(
    stack: Arc<CompiledStack>,
    mut call: ModelCall,
    base: BoxModel,
    home: Option<usize>,
) -> Result<ModelResponse, BoxError> {
    let failure = match call.stream.take() {
        Some(sink) if stack.has(HookPoint::OnModelDelta) => {
            let failure = Arc::new(DeltaFailure::default());
            let (hooks, ctx) = (stack.clone(), call.context.clone());
            call.stream = Some(guard_sink(Some(sink), failure.clone(), move |delta| {
                hooks.on_model_delta(&ctx, delta)
            }));
            Some(failure)
        }
        sink => {
            call.stream = sink;
            None
        }
    };
    let fut = if stack.has(HookPoint::WrapModel) {
        Either::Left(Next::chain(stack.entries.clone(), base, home).run(call))
    } else {
        // No wrap hook may run: straight to the service below.
        Either::Right(call_innermost(base, call, true))
    };
    match failure {
        None => fut.await,
        Some(failure) => failure.race(fut).await,
    }
}

/// One tool call through `stack`'s part of the onion. With delta hooks, the
/// tool gets a sink for its progress even when nobody else listens.
pub(crate) async fn tool_call(
    stack: Arc<CompiledStack>,
    mut invocation: ToolInvocation,
    base: BoxTool,
    home: Option<usize>,
) -> Result<ToolOutput, BoxError> {
    let failure = if stack.has(HookPoint::OnToolDelta) {
        let failure = Arc::new(DeltaFailure::default());
        let (hooks, ctx, call) = (
            stack.clone(),
            invocation.context.clone(),
            invocation.call.clone(),
        );
        invocation.stream = Some(guard_sink(
            invocation.stream.take(),
            failure.clone(),
            move |delta| hooks.on_tool_delta(&ctx, &call, delta),
        ));
        Some(failure)
    } else {
        None
    };
    let ctx = invocation.context.clone();
    let fut = if stack.has(HookPoint::WrapTool) {
        Either::Left(Next::chain(stack.entries.clone(), base, home).run(invocation))
    } else {
        Either::Right(call_innermost(base, invocation, true))
    };
    let result = match failure {
        None => fut.await,
        Some(failure) => failure.race(fut).await,
    };
    // What fails here as a middleware error is this stack's (a nested
    // run's own failures became error results below): it fails the runs up
    // to the one the stack was installed for.
    if let (Err(err), Some(home)) = (&result, home) {
        if kind_of(err.as_ref()) == ErrorKind::Middleware {
            ctx.note_hook_failure(ctx.depth().saturating_sub(home));
        }
    }
    result
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
