//! [`BoxResponseFuture`]: the named, boxed response future of the services
//! and layers whose call is multi-step logic (a provider's HTTP exchange,
//! the PII layer, fallback, the lifecycle adapters).
//!
//! Each module names it `ResponseFuture` (a type alias), so the type can
//! change later without breaking users, as tower's own layers do.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

use crate::error::BoxError;

/// A boxed future resolving to `Result<T, E>`. See the [module docs](self).
#[must_use = "futures do nothing unless polled"]
pub struct BoxResponseFuture<T, E = BoxError> {
    inner: BoxFuture<'static, Result<T, E>>,
}

impl<T, E> BoxResponseFuture<T, E> {
    pub(crate) fn new(future: impl Future<Output = Result<T, E>> + Send + 'static) -> Self {
        Self {
            inner: Box::pin(future),
        }
    }
}

impl<T, E> Future for BoxResponseFuture<T, E> {
    type Output = Result<T, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<T, E> fmt::Debug for BoxResponseFuture<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}
