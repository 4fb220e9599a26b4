//! The future of [`MaskPii`](super::MaskPii).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::{restore_message, PiiSession, Streamed};
use crate::error::BoxError;
use crate::types::ModelResponse;

pin_project! {
    /// The response future of [`MaskPii`](super::MaskPii): the inner
    /// call, then the answer's placeholders restored. Two words more
    /// than the inner future.
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Calling {
            #[pin]
            future: F,
            // The session, when the request held its placeholders.
            restore: Option<Arc<PiiSession>>,
            // The restoring of a streamed call, to flush at its end.
            stream: Option<Arc<Streamed>>,
        },
        Blocked {
            error: Option<BoxError>,
        },
    }
}

impl<F> ResponseFuture<F> {
    #[inline]
    pub(super) fn new(
        future: F,
        restore: Option<Arc<PiiSession>>,
        stream: Option<Arc<Streamed>>,
    ) -> Self {
        Self {
            state: State::Calling {
                future,
                restore,
                stream,
            },
        }
    }

    pub(super) fn blocked(error: BoxError) -> Self {
        Self {
            state: State::Blocked { error: Some(error) },
        }
    }
}

impl<F, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<ModelResponse, E>>,
    E: Into<BoxError>,
{
    type Output = Result<ModelResponse, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Calling {
                future,
                restore,
                stream,
            } => {
                if restore.is_none() && stream.is_none() {
                    return future.poll(cx).map_err(Into::into);
                }
                // Changed in place: the answer is not moved about.
                let mut poll = future.poll(cx).map_err(Into::into);
                if poll.is_ready() {
                    if let Some(stream) = stream.take() {
                        stream.flush();
                    }
                    if let (Some(session), Poll::Ready(Ok(response))) = (restore, &mut poll) {
                        restore_message(session, &mut response.message);
                    }
                }
                poll
            }
            StateProj::Blocked { error } => Poll::Ready(Err(error
                .take()
                .unwrap_or_else(|| "the PII layer's future was polled after it finished".into()))),
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
