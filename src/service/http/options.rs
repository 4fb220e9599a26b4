//! The settings both provider builders share: base URL, key, default model,
//! headers, timeout, size limit and HTTP client.

use std::fmt;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::DEFAULT_MAX_RESPONSE_BYTES;
use crate::error::AgentError;

/// What a provider's builder collects before it builds its
/// [`HttpModel`](super::HttpModel).
pub(crate) struct HttpOptions {
    pub(crate) base_url: String,
    pub(crate) api_key: Option<String>,
    pub(crate) model: String,
    pub(crate) headers: HeaderMap,
    header_error: Option<String>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) max_response_bytes: usize,
    pub(crate) client: Option<reqwest::Client>,
}

impl HttpOptions {
    /// The defaults for a service at `base_url`.
    pub(crate) fn new(base_url: String) -> Self {
        Self {
            base_url,
            api_key: None,
            model: String::new(),
            headers: HeaderMap::new(),
            header_error: None,
            timeout: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            client: None,
        }
    }

    /// Adds a header; an invalid name or value is kept to fail the build.
    pub(crate) fn header(&mut self, name: &str, value: &str) {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            (Ok(name), Ok(value)) => {
                self.headers.append(name, value);
            }
            (Err(e), _) => self.header_error = Some(e.to_string()),
            (_, Err(e)) => self.header_error = Some(e.to_string()),
        }
    }

    /// The first invalid header, as the build's error.
    pub(crate) fn check(&self) -> Result<(), AgentError> {
        match &self.header_error {
            Some(err) => Err(AgentError::Config(format!("invalid header: {err}"))),
            None => Ok(()),
        }
    }

    /// The API key as a sensitive header value (`prefix` before it, such as
    /// `Bearer `).
    pub(crate) fn key_header(&self, prefix: &str) -> Result<Option<HeaderValue>, AgentError> {
        let Some(key) = &self.api_key else {
            return Ok(None);
        };
        let mut value = HeaderValue::from_str(&format!("{prefix}{key}"))
            .map_err(|_| AgentError::Config("the API key is not a valid header".into()))?;
        value.set_sensitive(true);
        Ok(Some(value))
    }

    /// The fields a builder's `Debug` shows, the key redacted.
    pub(crate) fn debug_fields(&self, f: &mut fmt::DebugStruct<'_, '_>) {
        f.field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("timeout", &self.timeout);
    }
}

/// Reads an environment variable, unset when empty.
pub(crate) fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}
