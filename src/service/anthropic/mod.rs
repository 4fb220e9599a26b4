//! [`AnthropicMessages`]: Anthropic's Messages API as a model service.
//!
//! It is a `Service<ModelCall, Response = ModelResponse, Error = BoxError>`
//! like [`OpenAiChat`](crate::service::openai::OpenAiChat), with the same
//! error mapping (see [`openai::error`](crate::service::openai::error);
//! Anthropic's 529 `overloaded_error` is `PROVIDER_UNAVAILABLE`), the same
//! usage recording and tracing, tools and streaming:
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use tower::ServiceBuilder;
//! use tower_agent::service::anthropic::AnthropicMessages;
//! use tower_agent::Agent;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_agent::AgentError> {
//! let claude = AnthropicMessages::builder("https://api.anthropic.com")
//!     .api_key("sk-ant-...")
//!     .model("claude-sonnet-4-5")
//!     .max_tokens(2048)
//!     .build()?;
//! let model = ServiceBuilder::new()
//!     .timeout(Duration::from_secs(120))
//!     .service(claude);
//! let agent = Agent::builder("assistant").model(model).build()?;
//! println!("{}", agent.run("Say hello.").await?.output);
//! # Ok(()) }
//! ```
//!
//! # The mapping
//!
//! | the request | the Messages API |
//! | --- | --- |
//! | system messages, wherever they are | `system`, joined in order |
//! | tool results | `tool_result` blocks of a user turn |
//! | consecutive turns of one role | merged into one turn |
//! | a tool call's arguments | the `input` object (`{}` when not a JSON object) |
//! | image parts | `image` blocks (`data:` URIs as base64) |
//! | `max_tokens` | `max_tokens`, else the service's default (4096) |
//! | `stop` | `stop_sequences` |
//! | `parallel_tool_calls: false` | `tool_choice.disable_parallel_tool_use` |
//! | `response_format` | an instruction appended to `system` (the API has no such field; the agent still validates the answer) |
//!
//! Usage: Anthropic counts cache reads and writes apart from
//! `input_tokens`; here they are part of `input_tokens`, and the reads are
//! `cached_input_tokens`. Thinking blocks are streamed as
//! [`ModelDelta::Reasoning`](crate::types::ModelDelta::Reasoning) and left
//! out of the message.
//!
//! # Streaming
//!
//! With a sink on the call, the request sets `stream: true` and reads the
//! event stream (`message_start`, `content_block_*`, `message_delta`,
//! `message_stop`, `ping`, `error`). A tool call's deltas carry its position
//! among the answer's tool calls as `index`. The answer is complete at
//! `message_stop`; a stream that ends before, or breaks, fails as
//! `PROVIDER_UNAVAILABLE` with a
//! [`BrokenResponse`](crate::service::openai::BrokenResponse) source, exactly
//! as for OpenAI.

mod stream;
mod wire;

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use tower::Service;

pub use self::stream::fuzz_anthropic_stream;
use self::stream::EventAccumulator;
use self::wire::{MessagesRequest, MessagesResponse};
use crate::error::{AgentError, BoxError};
use crate::request::ModelCall;
use crate::service::openai::{Endpoint, Format, DEFAULT_MAX_RESPONSE_BYTES};
use crate::types::ModelResponse;

/// The API version sent as `anthropic-version` by default.
pub const DEFAULT_VERSION: &str = "2023-06-01";

/// Anthropic's Messages API as a model service. See the
/// [module docs](self).
///
/// # Clone
///
/// Cheap: clones share the HTTP client and the configuration.
#[derive(Clone)]
pub struct AnthropicMessages {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: Endpoint,
    model: String,
    max_tokens: u32,
}

impl AnthropicMessages {
    /// A builder for a service talking to `base_url` (such as
    /// `https://api.anthropic.com`; `/v1/messages` is appended, or only
    /// `/messages` when the URL already ends in `/v1`).
    pub fn builder(base_url: impl Into<String>) -> AnthropicMessagesBuilder {
        AnthropicMessagesBuilder {
            base_url: base_url.into(),
            api_key: None,
            version: DEFAULT_VERSION.to_owned(),
            model: String::new(),
            max_tokens: 4096,
            headers: HeaderMap::new(),
            header_error: None,
            timeout: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            client: None,
        }
    }

    /// The service configured by the environment: `ANTHROPIC_BASE_URL`
    /// (default `https://api.anthropic.com`), `ANTHROPIC_API_KEY` and
    /// `ANTHROPIC_MODEL`. `None` when neither the URL nor the key is set.
    ///
    /// # Errors
    ///
    /// `Some(Err(_))` with [`AgentError::Config`] when the URL is not valid.
    pub fn from_env() -> Option<Result<AnthropicMessages, AgentError>> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let base = var("ANTHROPIC_BASE_URL");
        let key = var("ANTHROPIC_API_KEY");
        if base.is_none() && key.is_none() {
            return None;
        }
        let mut builder = AnthropicMessages::builder(
            base.unwrap_or_else(|| "https://api.anthropic.com".to_owned()),
        );
        if let Some(key) = key {
            builder = builder.api_key(key);
        }
        if let Some(model) = var("ANTHROPIC_MODEL") {
            builder = builder.model(model);
        }
        Some(builder.build())
    }

    /// The URL calls are posted to.
    pub fn url(&self) -> &str {
        self.inner.endpoint.url()
    }

    /// The model asked for when a request names none.
    pub fn default_model(&self) -> &str {
        &self.inner.model
    }
}

impl fmt::Debug for AnthropicMessages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicMessages")
            .field("url", &self.inner.endpoint.url())
            .field("model", &self.inner.model)
            .field("max_tokens", &self.inner.max_tokens)
            .finish_non_exhaustive()
    }
}

/// Builds an [`AnthropicMessages`]. See [`AnthropicMessages::builder`].
pub struct AnthropicMessagesBuilder {
    base_url: String,
    api_key: Option<String>,
    version: String,
    model: String,
    max_tokens: u32,
    headers: HeaderMap,
    header_error: Option<String>,
    timeout: Option<Duration>,
    max_response_bytes: usize,
    client: Option<reqwest::Client>,
}

impl fmt::Debug for AnthropicMessagesBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicMessagesBuilder")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl AnthropicMessagesBuilder {
    /// The API key, sent as `x-api-key`.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// The `anthropic-version` header (default [`DEFAULT_VERSION`]).
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// The model asked for when a request names none.
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = model.into();
        self
    }

    /// `max_tokens` when the request sets none (the API requires one;
    /// default 4096).
    pub fn max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// A header sent with every request (`anthropic-beta`, a gateway's
    /// key). An invalid name or value fails [`build`](Self::build).
    pub fn header(mut self, name: impl AsRef<str>, value: impl AsRef<str>) -> Self {
        match (
            HeaderName::from_bytes(name.as_ref().as_bytes()),
            HeaderValue::from_str(value.as_ref()),
        ) {
            (Ok(name), Ok(value)) => {
                self.headers.append(name, value);
            }
            (Err(e), _) => self.header_error = Some(e.to_string()),
            (_, Err(e)) => self.header_error = Some(e.to_string()),
        }
        self
    }

    /// The most one call may take, body included. The run's deadline, when
    /// shorter, wins. No limit by default.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The largest response read, streamed or not (default 16 MiB).
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// The HTTP client to use. By default a new one.
    pub fn client(mut self, client: reqwest::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// The service.
    ///
    /// # Errors
    ///
    /// [`AgentError::Config`] when the base URL, the key, the version or a
    /// header is invalid, or the HTTP client cannot be built.
    pub fn build(self) -> Result<AnthropicMessages, AgentError> {
        if let Some(err) = self.header_error {
            return Err(AgentError::Config(format!("invalid header: {err}")));
        }
        let invalid = |what: &str| AgentError::Config(format!("the {what} is not a valid header"));
        let mut headers = self.headers;
        headers.insert(
            "anthropic-version",
            HeaderValue::from_str(&self.version).map_err(|_| invalid("version"))?,
        );
        if let Some(key) = &self.api_key {
            let mut value = HeaderValue::from_str(key).map_err(|_| invalid("API key"))?;
            value.set_sensitive(true);
            headers.insert("x-api-key", value);
        }
        let path = if self.base_url.trim().trim_end_matches('/').ends_with("/v1") {
            "/messages"
        } else {
            "/v1/messages"
        };
        let endpoint = Endpoint::new(
            &self.base_url,
            path,
            headers,
            self.timeout,
            self.max_response_bytes,
            self.client,
        )?;
        Ok(AnthropicMessages {
            inner: Arc::new(Inner {
                endpoint,
                model: self.model,
                max_tokens: self.max_tokens,
            }),
        })
    }
}

/// The future of an [`AnthropicMessages`] call.
pub type ResponseFuture = crate::future::BoxResponseFuture<ModelResponse>;

impl Service<ModelCall> for AnthropicMessages {
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ModelCall) -> ResponseFuture {
        let inner = self.inner.clone();
        ResponseFuture::new(async move {
            let model = if call.request.model.is_empty() {
                inner.model.clone()
            } else {
                call.request.model.to_string()
            };
            let body = MessagesRequest::new(
                &call.request,
                &model,
                inner.max_tokens,
                call.stream.is_some(),
            );
            let body = serde_json::to_vec(&body)?;
            inner
                .endpoint
                .call("anthropic", &model, body, &call, AnthropicFormat)
                .await
        })
    }
}

/// How Messages bodies are read.
struct AnthropicFormat;

impl Format for AnthropicFormat {
    type Decoder = EventAccumulator;

    fn decoder(&self, model: &str) -> EventAccumulator {
        EventAccumulator::new(model)
    }

    fn parse(&self, body: &[u8], model: &str) -> Result<ModelResponse, String> {
        let response: MessagesResponse =
            serde_json::from_slice(body).map_err(|e| format!("the body is not a message: {e}"))?;
        response.into_response(model)
    }
}
