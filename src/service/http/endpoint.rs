//! One model call over HTTP, shared by both providers: send, classify the
//! status, read JSON or server-sent events, record usage, trace.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use http::header::{ACCEPT, CONTENT_TYPE};
use http::HeaderMap;
use tracing::{field, Instrument};

use super::error::{broken, classify_http, transport, MAX_ERROR_BODY};
use super::options::HttpOptions;
use super::sse::{decode, Decoder, Failed};
use crate::error::{AgentError, BoxError, ErrorKind, ProviderError, TimeoutSource};
use crate::future::BoxResponseFuture;
use crate::request::{DeltaSink, ModelCall};
use crate::types::{ModelDelta, ModelResponse};

/// A provider's wire format: how its requests are written and its answers
/// read.
pub(crate) trait Format: Send + Sync + 'static {
    /// The stream decoder.
    type Decoder: Decoder + Send;

    /// The provider's name in traces (`gen_ai.provider.name`).
    const PROVIDER: &'static str;

    /// The JSON body of `call`, asking `model`.
    fn body(&self, call: &ModelCall, model: &str) -> serde_json::Result<Vec<u8>>;

    /// A decoder for an answer asked of `model`.
    fn decoder(&self, model: &str) -> Self::Decoder;

    /// A whole JSON body; `Err` says what is wrong with it.
    fn parse(&self, body: &[u8], model: &str) -> Result<ModelResponse, String>;
}

/// A model service over HTTP in the wire format `F`: what a provider's
/// service holds behind its `Arc`.
pub(crate) struct HttpModel<F> {
    endpoint: Endpoint,
    model: String,
    format: F,
}

impl<F: Format> HttpModel<F> {
    /// A service posting to `options.base_url` joined with `path`, with
    /// `options.headers` and `headers` (the provider's own, such as its key).
    pub(crate) fn new(
        options: HttpOptions,
        path: &str,
        headers: HeaderMap,
        format: F,
    ) -> Result<Self, AgentError> {
        options.check()?;
        let mut all = options.headers;
        all.extend(headers);
        let endpoint = Endpoint::new(
            &options.base_url,
            path,
            all,
            options.timeout,
            options.max_response_bytes,
            options.client,
        )?;
        Ok(Self {
            endpoint,
            model: options.model,
            format,
        })
    }

    /// The URL calls are posted to.
    pub(crate) fn url(&self) -> &str {
        self.endpoint.url()
    }

    /// The model asked for when a request names none.
    pub(crate) fn default_model(&self) -> &str {
        &self.model
    }

    /// The wire format's settings.
    pub(crate) fn format(&self) -> &F {
        &self.format
    }

    /// One call: the request's model, or the default when it names none.
    pub(crate) fn call(self: Arc<Self>, call: ModelCall) -> BoxResponseFuture<ModelResponse> {
        BoxResponseFuture::new(async move {
            let model = if call.request.model.is_empty() {
                self.model.as_str()
            } else {
                call.request.model.as_str()
            };
            let body = self.format.body(&call, model)?;
            self.endpoint
                .call(F::PROVIDER, model, body, &call, &self.format)
                .await
        })
    }
}

/// Where and how calls are sent.
struct Endpoint {
    url: reqwest::Url,
    host: String,
    headers: HeaderMap,
    timeout: Option<Duration>,
    max_bytes: usize,
    client: reqwest::Client,
}

impl Endpoint {
    /// An endpoint at `base` joined with `path`.
    fn new(
        base: &str,
        path: &str,
        headers: HeaderMap,
        timeout: Option<Duration>,
        max_bytes: usize,
        client: Option<reqwest::Client>,
    ) -> Result<Endpoint, AgentError> {
        let joined = format!("{}{path}", base.trim().trim_end_matches('/'));
        let url = reqwest::Url::parse(&joined)
            .map_err(|e| AgentError::Config(format!("invalid base URL `{base}`: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(AgentError::Config(format!(
                "the base URL `{base}` is not http or https"
            )));
        }
        let client = match client {
            Some(client) => client,
            None => reqwest::Client::builder()
                .user_agent(concat!("tower-agent/", env!("CARGO_PKG_VERSION")))
                .connect_timeout(Duration::from_secs(30))
                .build()
                .map_err(|e| AgentError::Config(format!("cannot build the HTTP client: {e}")))?,
        };
        Ok(Endpoint {
            host: url.host_str().unwrap_or_default().to_owned(),
            url,
            headers,
            timeout,
            max_bytes,
            client,
        })
    }

    /// The URL calls are posted to.
    fn url(&self) -> &str {
        self.url.as_str()
    }

    /// Posts `body` for `call` and reads the answer of `model`.
    async fn call<F: Format>(
        &self,
        provider: &'static str,
        model: &str,
        body: Vec<u8>,
        call: &ModelCall,
        format: &F,
    ) -> Result<ModelResponse, BoxError> {
        let span = tracing::info_span!(
            "chat",
            "otel.kind" = "client",
            "gen_ai.operation.name" = "chat",
            "gen_ai.provider.name" = provider,
            "gen_ai.request.model" = model,
            "server.address" = %self.host,
            "gen_ai.response.model" = field::Empty,
            "gen_ai.usage.input_tokens" = field::Empty,
            "gen_ai.usage.output_tokens" = field::Empty,
            "gen_ai.response.finish_reasons" = field::Empty,
            "error.type" = field::Empty,
        );
        let result = self
            .exchange(model, body, call, format)
            .instrument(span.clone())
            .await;
        let ctx = &call.context;
        match result {
            Ok(mut response) => {
                ctx.record_usage(&response.model, response.usage);
                response.usage_recorded = true;
                span.record("gen_ai.response.model", response.model.as_str());
                span.record("gen_ai.usage.input_tokens", response.usage.input_tokens);
                span.record("gen_ai.usage.output_tokens", response.usage.output_tokens);
                span.record(
                    "gen_ai.response.finish_reasons",
                    field::debug(&response.finish_reason),
                );
                Ok(response)
            }
            Err(Failed { error, usage }) => {
                if let Some(usage) = usage {
                    ctx.record_usage(model, usage);
                }
                span.record("error.type", error.kind().code());
                if error.kind() == ErrorKind::Timeout && ctx.remaining() == Some(Duration::ZERO) {
                    // The run's deadline bounded the request, and passed.
                    return Err(Box::new(AgentError::Timeout {
                        timer: TimeoutSource::RunDeadline,
                        after: Some(ctx.elapsed()),
                    }));
                }
                Err(error.into())
            }
        }
    }

    async fn exchange<F: Format>(
        &self,
        model: &str,
        body: Vec<u8>,
        call: &ModelCall,
        format: &F,
    ) -> Result<ModelResponse, Failed> {
        let failed = |error| Failed { error, usage: None };
        let sink = call.stream.as_ref();
        let mut request = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(body);
        if sink.is_some() {
            request = request.header(ACCEPT, "text/event-stream");
        }
        let left = call.context.remaining();
        let timeout = match (self.timeout, left) {
            (Some(own), Some(left)) => Some(own.min(left)),
            (own, left) => own.or(left),
        };
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        // What a timeout names as the provider's: its own, when the run's
        // deadline did not come first.
        let allowed = self
            .timeout
            .filter(|own| left.is_none_or(|left| *own <= left));
        let response = request
            .send()
            .await
            .map_err(|e| failed(transport(e, 0).allowed(allowed)))?;
        let status = response.status();
        if !status.is_success() {
            let headers = response.headers().clone();
            let body = read_error_body(response).await;
            return Err(failed(classify_http(status.as_u16(), &headers, &body)));
        }
        let is_sse = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        if is_sse {
            return decode(
                response.bytes_stream(),
                format.decoder(model),
                sink,
                self.max_bytes,
                |e, sent| transport(e, sent).allowed(allowed),
            )
            .await;
        }
        let body = read_body(response, self.max_bytes, allowed)
            .await
            .map_err(failed)?;
        let response = format
            .parse(&body, model)
            .map_err(|detail| failed(broken(detail, 0)))?;
        if let Some(sink) = sink {
            send_whole(sink, &response);
        }
        Ok(response)
    }
}

/// Sends a whole answer to a sink, for a server that ignored `stream`.
fn send_whole(sink: &DeltaSink, response: &ModelResponse) {
    let text = response.message.text();
    if !text.is_empty() {
        sink.send(&ModelDelta::text(text));
    }
    for (index, call) in response.message.tool_calls.iter().enumerate() {
        sink.send(&ModelDelta::ToolCall {
            index,
            id: Some(call.id.clone()).filter(|id| !id.is_empty()),
            name: Some(call.name.clone()),
            arguments: call.arguments.clone(),
        });
    }
}

/// Reads a whole body of at most `max` bytes; a timeout names the time
/// the call was `allowed`.
async fn read_body(
    response: reqwest::Response,
    max: usize,
    allowed: Option<Duration>,
) -> Result<Vec<u8>, ProviderError> {
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| transport(e, 0).allowed(allowed))?;
        if body.len().saturating_add(chunk.len()) > max {
            return Err(broken(
                format!("the response is larger than {max} bytes"),
                0,
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Reads at most [`MAX_ERROR_BODY`] bytes of an error body, as text; a body
/// that breaks off is read as far as it came.
async fn read_error_body(response: reqwest::Response) -> String {
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(Ok(chunk)) = chunks.next().await {
        let room = MAX_ERROR_BODY - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= MAX_ERROR_BODY {
            break;
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}
