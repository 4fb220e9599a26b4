//! The HTTP transport both providers share: one `reqwest` client per
//! service, sending a call, reading its answer as JSON or as server-sent
//! events, classifying failures into [`ErrorKind`](crate::ErrorKind)s,
//! recording usage and tracing.
//!
//! A provider brings only its wire format (the request body, the
//! whole-body parser and the stream decoder); everything else is here:
//!
//! - [`error`]: the table from HTTP status and body to error kind,
//!   `Retry-After`, transport failures, and [`BrokenResponse`] for an answer
//!   that could not be read;
//! - the SSE reader, with its guard against a leading byte-order mark,
//!   invalid UTF-8 and oversized streams, and the count of deltas already
//!   sent when a stream breaks;
//! - the endpoint: URL, headers, the per-call timeout (the shorter of the
//!   service's and the run's deadline), the size limit, usage recording and
//!   the `chat` span with the OpenTelemetry GenAI fields.

mod endpoint;
pub mod error;
mod options;
mod sse;
mod wire;

pub(crate) use self::endpoint::{Format, HttpModel};
pub use self::error::BrokenResponse;
pub(crate) use self::options::{env_var, HttpOptions};
#[cfg(test)]
pub(crate) use self::sse::{check_deltas, decode_chunks, decode_collect, split};
pub(crate) use self::sse::{fuzz_one, Decoder, Deltas, Flow};
#[cfg(test)]
pub(crate) use self::wire::MAX_TOKENS;
pub(crate) use self::wire::{response, tokens};

/// The default limit on the size of one response, streamed or not.
pub(crate) const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// The `Service<ModelCall>` impl (and its `ResponseFuture`) of a provider
/// whose `inner` is an `Arc<HttpModel<_>>`.
macro_rules! http_model_service {
    ($service:ident) => {
        #[doc = concat!("The future of an [`", stringify!($service), "`] call.")]
        pub type ResponseFuture = crate::future::BoxResponseFuture<crate::types::ModelResponse>;

        impl tower::Service<crate::request::ModelCall> for $service {
            type Response = crate::types::ModelResponse;
            type Error = crate::error::BoxError;
            type Future = ResponseFuture;

            fn poll_ready(
                &mut self,
                _cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), crate::error::BoxError>> {
                // The HTTP client queues; limit concurrency with a layer.
                std::task::Poll::Ready(Ok(()))
            }

            fn call(&mut self, call: crate::request::ModelCall) -> ResponseFuture {
                self.inner.clone().call(call)
            }
        }
    };
}

/// The builder setters both providers share, on a builder whose `http` is
/// an [`HttpOptions`].
macro_rules! http_builder_setters {
    () => {
        /// The model asked for when a request names none (the agent's
        /// `model_name` is empty by default).
        pub fn model(mut self, model: impl Into<String>) -> Self {
            self.http.model = model.into();
            self
        }

        /// A header sent with every request (an organization, a gateway's
        /// routing key, a beta flag). An invalid name or value fails
        /// [`build`](Self::build).
        pub fn header(mut self, name: impl AsRef<str>, value: impl AsRef<str>) -> Self {
            self.http.header(name.as_ref(), value.as_ref());
            self
        }

        /// Headers sent with every request.
        pub fn headers(mut self, headers: http::HeaderMap) -> Self {
            self.http.headers.extend(headers);
            self
        }

        /// The most one call may take, body included. The run's deadline,
        /// when shorter, wins. No limit by default.
        pub fn timeout(mut self, timeout: std::time::Duration) -> Self {
            self.http.timeout = Some(timeout);
            self
        }

        /// The largest response read, streamed or not (default 16 MiB); past
        /// it the call fails as `PROVIDER_UNAVAILABLE`.
        pub fn max_response_bytes(mut self, bytes: usize) -> Self {
            self.http.max_response_bytes = bytes;
            self
        }

        /// The HTTP client to use (for proxies, TLS roots, pools). By
        /// default a new one.
        pub fn client(mut self, client: reqwest::Client) -> Self {
            self.http.client = Some(client);
            self
        }
    };
}

pub(crate) use {http_builder_setters, http_model_service};
