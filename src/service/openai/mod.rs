//! [`OpenAiChat`]: the OpenAI chat-completions protocol as a model service,
//! for OpenAI and every server that speaks it (vLLM, Ollama, llama.cpp,
//! OpenRouter, Groq, …).
//!
//! It is a `Service<ModelCall, Response = ModelResponse, Error = BoxError>`
//! over `reqwest`, so tower's layers wrap it unchanged:
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use tower::ServiceBuilder;
//! use tower_agent::service::openai::OpenAiChat;
//! use tower_agent::Agent;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_agent::AgentError> {
//! let chat = OpenAiChat::builder("http://127.0.0.1:8080/v1")
//!     .api_key("sk-...")
//!     .model("gpt-4o-mini")
//!     .timeout(Duration::from_secs(60))
//!     .build()?;
//! let model = ServiceBuilder::new()
//!     .concurrency_limit(8)
//!     .service(chat);
//! let agent = Agent::builder("assistant").model(model).build()?;
//! let run = agent.run("Say hello.").await?;
//! println!("{}", run.output);
//! # Ok(()) }
//! ```
//!
//! Or from the environment (`OPENAI_BASE_URL`, `OPENAI_API_KEY`,
//! `OPENAI_MODEL`), falling back to an embedded model when it is not set:
//!
//! ```
//! use tower_agent::service::openai::OpenAiChat;
//! use tower_agent::service::{box_model, BoxModel};
//! use tower_agent::{ScriptedModel, ScriptedTurn};
//!
//! # fn main() -> Result<(), tower_agent::AgentError> {
//! let model: BoxModel = match OpenAiChat::from_env() {
//!     Some(chat) => box_model(chat?),
//!     None => box_model(ScriptedModel::new([ScriptedTurn::text("hello")])),
//! };
//! # let _ = model; Ok(()) }
//! ```
//!
//! # What it sends and reads
//!
//! The request's messages in the chat-completions shape, its tools as
//! `function` tools, `temperature`, `max_tokens` (or `max_completion_tokens`,
//! see [`OpenAiChatBuilder::max_completion_tokens`]), `stop`,
//! `response_format` (`json_schema` included) and `parallel_tool_calls`
//! (only with tools, as OpenAI requires). The model is the request's, or the
//! service's default when the request names none.
//!
//! The answer's text, tool calls, finish reason and usage: prompt,
//! completion, cached (`prompt_tokens_details.cached_tokens`) and reasoning
//! (`completion_tokens_details.reasoning_tokens`) tokens.
//!
//! # Streaming
//!
//! When the call has a sink ([`ModelCall::stream`]), the request asks for
//! server-sent events with `stream_options.include_usage`, and each piece is
//! forwarded as it arrives: text as [`ModelDelta::Text`], tool-call pieces as
//! [`ModelDelta::ToolCall`] (joined by their `index` into the final calls),
//! visible reasoning (`reasoning_content`) as [`ModelDelta::Reasoning`]. A
//! server that ignores `stream: true` and answers in one JSON body is read
//! as such, its text and calls sent to the sink whole.
//!
//! A stream is complete at `data: [DONE]`. One that ends before it, breaks,
//! is not valid UTF-8, holds a chunk that is not JSON, or grows past the
//! size limit fails as `PROVIDER_UNAVAILABLE` (retryable), its source a
//! [`BrokenResponse`]. Its answer never reaches the transcript: the call is an
//! error. The deltas already sent are the sink's business: a retry layer
//! should retry a streamed call only before its first delta
//! ([`BrokenResponse::deltas_sent`] says how many went out). An `error` event
//! inside the stream is classified by its type. No byte sequence panics:
//! the decoder is fuzzed (see `fuzz/` in the repository).
//!
//! # Errors
//!
//! See the [`error`] module for the table from HTTP status and
//! body to [`ErrorKind`](crate::ErrorKind), `Retry-After` included.
//!
//! # Usage
//!
//! The service reaches the backend, so it records each answer's usage into
//! the run's ledger (`record_usage`) and sets
//! [`ModelResponse::usage_recorded`]. A stream that fails after its usage
//! chunk still records that usage: the provider billed it.
//!
//! # Tracing
//!
//! Each call runs in a `chat` span with the OpenTelemetry GenAI fields
//! `gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model`,
//! `server.address`, `gen_ai.response.model`, `gen_ai.usage.input_tokens`,
//! `gen_ai.usage.output_tokens`, `gen_ai.response.finish_reasons` and, on
//! failure, `error.type`.

pub mod error;
mod http_call;
mod sse;
mod stream;
mod wire;

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use tower::Service;

pub use self::error::BrokenResponse;
pub(crate) use self::http_call::{Endpoint, Format};
#[cfg(test)]
pub(crate) use self::sse::{check_deltas, decode_chunks, split};
pub(crate) use self::sse::{fuzz_one, Decoder, Flow};
pub use self::stream::fuzz_openai_stream;
use self::stream::ChunkAccumulator;
pub(crate) use self::wire::{assistant, tokens};
use self::wire::{ChatCompletion, ChatRequest, MaxTokensField};
use crate::error::{AgentError, BoxError};
use crate::request::ModelCall;
#[cfg(doc)]
use crate::types::ModelDelta;
use crate::types::ModelResponse;

/// The default limit on the size of one response, streamed or not.
pub(crate) const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// The OpenAI chat-completions protocol as a model service. See the
/// [module docs](self).
///
/// # Clone
///
/// Cheap: clones share the HTTP client (and its connection pool) and the
/// configuration.
#[derive(Clone)]
pub struct OpenAiChat {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: Endpoint,
    model: String,
    max_tokens_field: MaxTokensField,
    include_usage: bool,
}

impl OpenAiChat {
    /// A builder for a service talking to `base_url` (such as
    /// `https://api.openai.com/v1`; `/chat/completions` is appended).
    pub fn builder(base_url: impl Into<String>) -> OpenAiChatBuilder {
        OpenAiChatBuilder {
            base_url: base_url.into(),
            api_key: None,
            model: String::new(),
            headers: HeaderMap::new(),
            header_error: None,
            timeout: None,
            max_tokens_field: MaxTokensField::MaxTokens,
            include_usage: true,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            client: None,
        }
    }

    /// The service configured by the environment: `OPENAI_BASE_URL` (the
    /// base URL), `OPENAI_API_KEY` (optional) and `OPENAI_MODEL` (the default
    /// model, optional). `None` when `OPENAI_BASE_URL` is unset or empty.
    ///
    /// # Errors
    ///
    /// `Some(Err(_))` with [`AgentError::Config`] when the URL is not valid.
    pub fn from_env() -> Option<Result<OpenAiChat, AgentError>> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let mut builder = OpenAiChat::builder(var("OPENAI_BASE_URL")?);
        if let Some(key) = var("OPENAI_API_KEY") {
            builder = builder.api_key(key);
        }
        if let Some(model) = var("OPENAI_MODEL") {
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

impl fmt::Debug for OpenAiChat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiChat")
            .field("url", &self.inner.endpoint.url())
            .field("model", &self.inner.model)
            .finish_non_exhaustive()
    }
}

/// Builds an [`OpenAiChat`]. See [`OpenAiChat::builder`].
pub struct OpenAiChatBuilder {
    base_url: String,
    api_key: Option<String>,
    model: String,
    headers: HeaderMap,
    header_error: Option<String>,
    timeout: Option<Duration>,
    max_tokens_field: MaxTokensField,
    include_usage: bool,
    max_response_bytes: usize,
    client: Option<reqwest::Client>,
}

impl fmt::Debug for OpenAiChatBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiChatBuilder")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl OpenAiChatBuilder {
    /// The API key, sent as `Authorization: Bearer <key>`.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// The model asked for when a request names none (the agent's
    /// `model_name` is empty by default).
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = model.into();
        self
    }

    /// A header sent with every request (an organization, a project, a
    /// gateway's routing key). An invalid name or value fails
    /// [`build`](Self::build).
    pub fn header(mut self, name: impl AsRef<str>, value: impl AsRef<str>) -> Self {
        let name = HeaderName::from_bytes(name.as_ref().as_bytes());
        let value = HeaderValue::from_str(value.as_ref());
        match (name, value) {
            (Ok(name), Ok(value)) => {
                self.headers.append(name, value);
            }
            (Err(e), _) => self.header_error = Some(e.to_string()),
            (_, Err(e)) => self.header_error = Some(e.to_string()),
        }
        self
    }

    /// Headers sent with every request.
    pub fn headers(mut self, headers: HeaderMap) -> Self {
        self.headers.extend(headers);
        self
    }

    /// The most one call may take, body included. The run's deadline, when
    /// shorter, wins. No limit by default.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sends `max_completion_tokens` instead of `max_tokens` (OpenAI's
    /// reasoning models require it; other servers read `max_tokens`).
    pub fn max_completion_tokens(mut self, yes: bool) -> Self {
        self.max_tokens_field = if yes {
            MaxTokensField::MaxCompletionTokens
        } else {
            MaxTokensField::MaxTokens
        };
        self
    }

    /// Whether a streamed call asks for the usage chunk
    /// (`stream_options.include_usage`, default `true`). Turn it off for a
    /// server that refuses the option.
    pub fn include_usage(mut self, yes: bool) -> Self {
        self.include_usage = yes;
        self
    }

    /// The largest response read, streamed or not (default 16 MiB); past it
    /// the call fails as `PROVIDER_UNAVAILABLE`.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// The HTTP client to use (for proxies, TLS roots, pools). By default a
    /// new one.
    pub fn client(mut self, client: reqwest::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// The service.
    ///
    /// # Errors
    ///
    /// [`AgentError::Config`] when the base URL or a header is invalid, or
    /// the HTTP client cannot be built.
    pub fn build(self) -> Result<OpenAiChat, AgentError> {
        if let Some(err) = self.header_error {
            return Err(AgentError::Config(format!("invalid header: {err}")));
        }
        let mut headers = self.headers;
        if let Some(key) = &self.api_key {
            let mut value = HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| AgentError::Config("the API key is not a valid header".into()))?;
            value.set_sensitive(true);
            headers.insert(http::header::AUTHORIZATION, value);
        }
        let endpoint = Endpoint::new(
            &self.base_url,
            "/chat/completions",
            headers,
            self.timeout,
            self.max_response_bytes,
            self.client,
        )?;
        Ok(OpenAiChat {
            inner: Arc::new(Inner {
                endpoint,
                model: self.model,
                max_tokens_field: self.max_tokens_field,
                include_usage: self.include_usage,
            }),
        })
    }
}

/// The future of an [`OpenAiChat`] call.
pub type ResponseFuture = crate::future::BoxResponseFuture<ModelResponse>;

impl Service<ModelCall> for OpenAiChat {
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // The HTTP client queues; limit concurrency with a layer.
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
            let streamed = call.stream.is_some();
            let body = ChatRequest::new(
                &call.request,
                &model,
                streamed,
                inner.include_usage,
                inner.max_tokens_field,
            );
            let body = serde_json::to_vec(&body)?;
            inner
                .endpoint
                .call("openai", &model, body, &call, OpenAiFormat)
                .await
        })
    }
}

/// How chat-completions bodies are read.
struct OpenAiFormat;

impl Format for OpenAiFormat {
    type Decoder = ChunkAccumulator;

    fn decoder(&self, model: &str) -> ChunkAccumulator {
        ChunkAccumulator::new(model)
    }

    fn parse(&self, body: &[u8], model: &str) -> Result<ModelResponse, String> {
        let completion: ChatCompletion = serde_json::from_slice(body)
            .map_err(|e| format!("the body is not a completion: {e}"))?;
        completion.into_response(model)
    }
}
