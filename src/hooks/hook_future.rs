//! [`HookFuture`]: what a hook point of the port answers.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

use crate::error::BoxError;

/// The future of a hook point: a value already there, or a boxed future.
///
/// A hook point with nothing to do answers [`HookFuture::ok`], which costs no
/// allocation; only hooks that really wait are boxed.
#[must_use = "futures do nothing unless polled"]
pub(crate) struct HookFuture<'a, T> {
    kind: HookFutureKind<'a, T>,
}

enum HookFutureKind<'a, T> {
    Ready(Option<Result<T, BoxError>>),
    Boxed(BoxFuture<'a, Result<T, BoxError>>),
}

impl<'a, T> HookFuture<'a, T> {
    /// A hook point that is already done with `value`.
    pub(crate) fn ok(value: T) -> Self {
        Self {
            kind: HookFutureKind::Ready(Some(Ok(value))),
        }
    }

    /// A hook point that is already done with `result`.
    pub(crate) fn ready(result: Result<T, BoxError>) -> Self {
        Self {
            kind: HookFutureKind::Ready(Some(result)),
        }
    }

    /// A hook point that waits for `future`.
    pub(crate) fn new<F>(future: F) -> Self
    where
        F: Future<Output = Result<T, BoxError>> + Send + 'a,
    {
        Self {
            kind: HookFutureKind::Boxed(Box::pin(future)),
        }
    }
}

// Nothing is pinned structurally: the boxed future is pinned on the heap.
impl<T> Unpin for HookFuture<'_, T> {}

impl<T> Future for HookFuture<'_, T> {
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().kind {
            HookFutureKind::Ready(value) => {
                Poll::Ready(value.take().expect("HookFuture polled after completion"))
            }
            HookFutureKind::Boxed(future) => future.as_mut().poll(cx),
        }
    }
}
