//! The futures of the lifecycle services, named so they can be stored.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

use crate::error::BoxError;

/// The response future of [`Lifecycle`](super::Lifecycle),
/// [`FromFn`](super::FromFn), [`WrapModel`](super::WrapModel) and
/// [`WrapTool`](super::WrapTool).
///
/// Boxed behind this name so that it can change without breaking users.
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture<T, E = BoxError> {
    inner: BoxFuture<'static, Result<T, E>>,
}

impl<T, E> ResponseFuture<T, E> {
    pub(crate) fn new(future: impl Future<Output = Result<T, E>> + Send + 'static) -> Self {
        Self {
            inner: Box::pin(future),
        }
    }
}

impl<T, E> Future for ResponseFuture<T, E> {
    type Output = Result<T, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<T, E> fmt::Debug for ResponseFuture<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}
