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
//! Prompt caching is the provider's, on the longest prefix it has seen;
//! [`OpenAiChatBuilder::prompt_cache_key`] (or
//! [`prompt_cache_key_per_thread`](OpenAiChatBuilder::prompt_cache_key_per_thread))
//! sends `prompt_cache_key` to keep requests that share a prefix on one
//! cache.
//!
//! # Streaming
//!
//! When the call has a sink ([`ModelCall::stream`](crate::ModelCallParts::stream)), the request asks for
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
//! See the [`http::error`](crate::service::http::error) module for the
//! table from HTTP status and body to [`ErrorKind`](crate::ErrorKind),
//! `Retry-After` included.
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

mod stream;
mod wire;

use std::fmt;
use std::sync::Arc;

use http::HeaderMap;

pub use self::stream::fuzz_openai_stream;
use self::stream::ChunkAccumulator;
use self::wire::{ChatCompletion, ChatRequest, MaxTokensField};
use crate::error::AgentError;
use crate::request::ModelCall;
pub use crate::service::http::BrokenResponse;
use crate::service::http::{
    env_var, http_builder_setters, http_model_service, Format, HttpModel, HttpOptions,
};
#[cfg(doc)]
use crate::types::ModelDelta;
use crate::types::ModelResponse;

/// The OpenAI chat-completions protocol as a model service. See the
/// [module docs](self).
///
/// # Clone
///
/// Cheap: clones share the HTTP client (and its connection pool) and the
/// configuration.
#[derive(Clone)]
pub struct OpenAiChat {
    inner: Arc<HttpModel<OpenAiFormat>>,
}

impl OpenAiChat {
    /// A builder for a service talking to `base_url` (such as
    /// `https://api.openai.com/v1`; `/chat/completions` is appended).
    pub fn builder(base_url: impl Into<String>) -> OpenAiChatBuilder {
        OpenAiChatBuilder {
            http: HttpOptions::new(base_url.into()),
            format: OpenAiFormat {
                max_tokens_field: MaxTokensField::MaxTokens,
                include_usage: true,
                prompt_cache_key: None,
            },
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
        let mut builder = OpenAiChat::builder(env_var("OPENAI_BASE_URL")?);
        builder.http.api_key = env_var("OPENAI_API_KEY");
        builder.http.model = env_var("OPENAI_MODEL").unwrap_or_default();
        Some(builder.build())
    }

    /// The URL calls are posted to.
    pub fn url(&self) -> &str {
        self.inner.url()
    }

    /// The model asked for when a request names none.
    pub fn default_model(&self) -> &str {
        self.inner.default_model()
    }
}

impl fmt::Debug for OpenAiChat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiChat")
            .field("url", &self.inner.url())
            .field("model", &self.inner.default_model())
            .finish_non_exhaustive()
    }
}

/// Builds an [`OpenAiChat`]. See [`OpenAiChat::builder`].
pub struct OpenAiChatBuilder {
    http: HttpOptions,
    format: OpenAiFormat,
}

impl fmt::Debug for OpenAiChatBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("OpenAiChatBuilder");
        self.http.debug_fields(&mut f);
        f.finish_non_exhaustive()
    }
}

impl OpenAiChatBuilder {
    http_builder_setters!();

    /// The API key, sent as `Authorization: Bearer <key>`.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.http.api_key = Some(key.into());
        self
    }

    /// Sends `max_completion_tokens` instead of `max_tokens` (OpenAI's
    /// reasoning models require it; other servers read `max_tokens`).
    pub fn max_completion_tokens(mut self, yes: bool) -> Self {
        self.format.max_tokens_field = if yes {
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
        self.format.include_usage = yes;
        self
    }

    /// Sends `prompt_cache_key: key` with every request: OpenAI routes
    /// requests with the same key and prefix to the same cache, which
    /// raises the share of cached input (`cached_input_tokens` in the
    /// usage). Use one key per group of requests that share a long prefix
    /// (an agent, a tenant). Servers that do not know the field ignore it
    /// or refuse it: leave it unset for them.
    pub fn prompt_cache_key(mut self, key: impl Into<Arc<str>>) -> Self {
        self.format.prompt_cache_key = Some(PromptCacheKey::Fixed(key.into()));
        self
    }

    /// Sends the run's thread id as `prompt_cache_key` (nothing for a run
    /// without a thread): every turn of a thread shares one cache. See
    /// [`prompt_cache_key`](Self::prompt_cache_key).
    pub fn prompt_cache_key_per_thread(mut self) -> Self {
        self.format.prompt_cache_key = Some(PromptCacheKey::Thread);
        self
    }

    /// The service.
    ///
    /// # Errors
    ///
    /// [`AgentError::Config`] when the base URL or a header is invalid, or
    /// the HTTP client cannot be built.
    pub fn build(self) -> Result<OpenAiChat, AgentError> {
        let mut headers = HeaderMap::new();
        if let Some(value) = self.http.key_header("Bearer ")? {
            headers.insert(http::header::AUTHORIZATION, value);
        }
        let model = HttpModel::new(self.http, "/chat/completions", headers, self.format)?;
        Ok(OpenAiChat {
            inner: Arc::new(model),
        })
    }
}

http_model_service!(OpenAiChat);

/// The chat-completions wire format and its settings.
struct OpenAiFormat {
    max_tokens_field: MaxTokensField,
    include_usage: bool,
    prompt_cache_key: Option<PromptCacheKey>,
}

/// Where `prompt_cache_key` comes from.
#[derive(Debug, Clone)]
enum PromptCacheKey {
    /// The same key on every request.
    Fixed(Arc<str>),
    /// The run's thread id (none for a run without a thread).
    Thread,
}

impl Format for OpenAiFormat {
    type Decoder = ChunkAccumulator;

    const PROVIDER: &'static str = "openai";

    fn body(&self, call: &ModelCall, model: &str) -> serde_json::Result<Vec<u8>> {
        let mut body = ChatRequest::new(
            &call.request,
            model,
            call.stream.is_some(),
            self.include_usage,
            self.max_tokens_field,
        );
        body.prompt_cache_key = match &self.prompt_cache_key {
            None => None,
            Some(PromptCacheKey::Fixed(key)) => Some(key),
            Some(PromptCacheKey::Thread) => call.context.thread_id(),
        };
        serde_json::to_vec(&body)
    }

    fn decoder(&self, model: &str) -> ChunkAccumulator {
        ChunkAccumulator::new(model)
    }

    fn parse(&self, body: &[u8], model: &str) -> Result<ModelResponse, String> {
        let completion: ChatCompletion = serde_json::from_slice(body)
            .map_err(|e| format!("the body is not a completion: {e}"))?;
        completion.into_response(model)
    }
}
