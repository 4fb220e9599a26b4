//! [`AnthropicMessages`]: Anthropic's Messages API as a model service.
//!
//! It is a `Service<ModelCall, Response = ModelResponse, Error = BoxError>`
//! like [`OpenAiChat`](crate::service::openai::OpenAiChat), over the same
//! [`http`](crate::service::http) transport: the same error mapping (see
//! [`http::error`](crate::service::http::error);
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
//! # Prompt caching
//!
//! By default (turn it off with
//! [`prompt_caching(false)`](AnthropicMessagesBuilder::prompt_caching))
//! every request carries `cache_control: {"type": "ephemeral"}`
//! breakpoints on its stable prefix, at most the API's 4, in this order:
//!
//! 1. the last tool definition (the tools come first in the prompt);
//! 2. the leading system messages: `system` is then sent as text blocks,
//!    the leading messages in one block that carries the breakpoint, and
//!    system messages that come later (and the `response_format`
//!    instruction) in a block after it;
//! 3. the last block of the last message: the whole prompt is written to
//!    the cache, and the next turn, which only appends, reads it;
//! 4. the last block of the message before it: a fallback for when the
//!    next turn adds more than the API looks back from a breakpoint.
//!
//! Each turn of an agent then reads the earlier turns from the cache. The
//! usage says what was read (`cached_input_tokens`); what was written is
//! part of `input_tokens`. A prompt shorter than the model's minimum is
//! not cached, and no error says so.
//!
//! ```
//! use tower_agent::service::anthropic::AnthropicMessages;
//!
//! let claude = AnthropicMessages::builder("https://api.anthropic.com")
//!     .api_key("sk-ant-...")
//!     .cache_breakpoints(2) // the tools and the system prompt only
//!     .build()
//!     .unwrap();
//! # let _ = claude;
//! ```
//!
//! # Streaming
//!
//! With a sink on the call, the request sets `stream: true` and reads the
//! event stream (`message_start`, `content_block_*`, `message_delta`,
//! `message_stop`, `ping`, `error`). A tool call's deltas carry its position
//! among the answer's tool calls as `index`. The answer is complete at
//! `message_stop`; a stream that ends before, or breaks, fails as
//! `PROVIDER_UNAVAILABLE` with a
//! [`BrokenResponse`](crate::service::http::BrokenResponse) source, exactly
//! as for OpenAI.

mod stream;
mod wire;

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue};

pub use self::stream::fuzz_anthropic_stream;
use self::stream::EventAccumulator;
use self::wire::{MessagesRequest, MessagesResponse, MAX_CACHE_BREAKPOINTS};
use crate::error::AgentError;
use crate::request::ModelCall;
use crate::service::http::{
    env_var, http_builder_setters, http_model_service, Format, HttpModel, HttpOptions,
};
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
    inner: Arc<HttpModel<AnthropicFormat>>,
}

impl AnthropicMessages {
    /// A builder for a service talking to `base_url` (such as
    /// `https://api.anthropic.com`; `/v1/messages` is appended, or only
    /// `/messages` when the URL already ends in `/v1`).
    pub fn builder(base_url: impl Into<String>) -> AnthropicMessagesBuilder {
        AnthropicMessagesBuilder {
            http: HttpOptions::new(base_url.into()),
            version: DEFAULT_VERSION.to_owned(),
            format: AnthropicFormat {
                max_tokens: 4096,
                cache_breakpoints: MAX_CACHE_BREAKPOINTS,
            },
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
        let base = env_var("ANTHROPIC_BASE_URL");
        let key = env_var("ANTHROPIC_API_KEY");
        if base.is_none() && key.is_none() {
            return None;
        }
        let mut builder = AnthropicMessages::builder(
            base.unwrap_or_else(|| "https://api.anthropic.com".to_owned()),
        );
        builder.http.api_key = key;
        builder.http.model = env_var("ANTHROPIC_MODEL").unwrap_or_default();
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

impl fmt::Debug for AnthropicMessages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicMessages")
            .field("url", &self.inner.url())
            .field("model", &self.inner.default_model())
            .field("max_tokens", &self.inner.format().max_tokens)
            .finish_non_exhaustive()
    }
}

/// Builds an [`AnthropicMessages`]. See [`AnthropicMessages::builder`].
pub struct AnthropicMessagesBuilder {
    http: HttpOptions,
    version: String,
    format: AnthropicFormat,
}

impl fmt::Debug for AnthropicMessagesBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("AnthropicMessagesBuilder");
        self.http.debug_fields(&mut f);
        f.finish_non_exhaustive()
    }
}

impl AnthropicMessagesBuilder {
    http_builder_setters!();

    /// The API key, sent as `x-api-key`.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.http.api_key = Some(key.into());
        self
    }

    /// The `anthropic-version` header (default [`DEFAULT_VERSION`]).
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// `max_tokens` when the request sets none (the API requires one;
    /// default 4096).
    pub fn max_tokens(mut self, max_tokens: u32) -> Self {
        self.format.max_tokens = max_tokens;
        self
    }

    /// Whether every request carries prompt-cache breakpoints (default on):
    /// see [Prompt caching](self#prompt-caching).
    pub fn prompt_caching(mut self, yes: bool) -> Self {
        self.format.cache_breakpoints = if yes { MAX_CACHE_BREAKPOINTS } else { 0 };
        self
    }

    /// Places at most `n` prompt-cache breakpoints (the API takes at most
    /// 4; 0 turns caching off), in the order of
    /// [Prompt caching](self#prompt-caching): to leave some for a layer of
    /// your own, or to cache less.
    pub fn cache_breakpoints(mut self, n: usize) -> Self {
        self.format.cache_breakpoints = n.min(MAX_CACHE_BREAKPOINTS);
        self
    }

    /// The service.
    ///
    /// # Errors
    ///
    /// [`AgentError::Config`] when the base URL, the key, the version or a
    /// header is invalid, or the HTTP client cannot be built.
    pub fn build(self) -> Result<AnthropicMessages, AgentError> {
        self.http.check()?;
        let mut headers = HeaderMap::new();
        let version = HeaderValue::from_str(&self.version)
            .map_err(|_| AgentError::Config("the version is not a valid header".into()))?;
        headers.insert("anthropic-version", version);
        if let Some(value) = self.http.key_header("")? {
            headers.insert("x-api-key", value);
        }
        let path = if self
            .http
            .base_url
            .trim()
            .trim_end_matches('/')
            .ends_with("/v1")
        {
            "/messages"
        } else {
            "/v1/messages"
        };
        let model = HttpModel::new(self.http, path, headers, self.format)?;
        Ok(AnthropicMessages {
            inner: Arc::new(model),
        })
    }
}

http_model_service!(AnthropicMessages);

/// The Messages wire format and its settings.
struct AnthropicFormat {
    max_tokens: u32,
    cache_breakpoints: usize,
}

impl Format for AnthropicFormat {
    type Decoder = EventAccumulator;

    const PROVIDER: &'static str = "anthropic";

    fn body(&self, call: &ModelCall, model: &str) -> serde_json::Result<Vec<u8>> {
        let mut body =
            MessagesRequest::new(&call.request, model, self.max_tokens, call.stream.is_some());
        if self.cache_breakpoints > 0 {
            body.cache_breakpoints(self.cache_breakpoints);
        }
        serde_json::to_vec(&body)
    }

    fn decoder(&self, model: &str) -> EventAccumulator {
        EventAccumulator::new(model)
    }

    fn parse(&self, body: &[u8], model: &str) -> Result<ModelResponse, String> {
        let response: MessagesResponse =
            serde_json::from_slice(body).map_err(|e| format!("the body is not a message: {e}"))?;
        response.into_response(model)
    }
}
