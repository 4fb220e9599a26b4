//! The futures of the lifecycle services, named so they can be stored.

use crate::error::BoxError;

/// The response future of [`Lifecycle`](super::Lifecycle),
/// [`FromFn`](super::FromFn), [`WrapModel`](super::WrapModel) and
/// [`WrapTool`](super::WrapTool).
///
/// Boxed behind this name so that it can change without breaking users.
pub type ResponseFuture<T, E = BoxError> = crate::future::BoxResponseFuture<T, E>;
