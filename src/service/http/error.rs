//! How an HTTP answer becomes a [`ProviderError`]: the status and error body
//! table, `Retry-After`, transport failures and broken responses.
//!
//! | what comes back | [`ErrorKind`] |
//! | --- | --- |
//! | `insufficient_quota` (any status), 402 | `QUOTA_EXHAUSTED`, not retryable |
//! | 429 | `RATE_LIMITED`, with `Retry-After` (seconds or an HTTP date) or `retry-after-ms` |
//! | 408, 409, 5xx (Anthropic's 529 too), connection errors | `PROVIDER_UNAVAILABLE` |
//! | the per-request timeout | `TIMEOUT` |
//! | 4xx with a context-length code or message | `CONTEXT_LENGTH` |
//! | other 400, 404, 413, 422 and other 4xx | `INVALID_REQUEST` |
//! | 401, 403 | `AUTH` |
//! | a malformed body, a truncated or broken stream | `PROVIDER_UNAVAILABLE`, its source a [`BrokenResponse`] |
//!
//! A `Retry-After` hint is kept whatever the status (a 503 may carry one
//! too). 409 is retryable because OpenAI answers it for a transient lock.

use std::error::Error as StdError;
use std::fmt;
use std::time::{Duration, SystemTime};

use http::HeaderMap;
use serde_json::Value;

use crate::error::{ErrorKind, ProviderError};

/// How much of an error body is read.
pub(crate) const MAX_ERROR_BODY: usize = 64 * 1024;

/// The provider answered, but the answer could not be read: malformed JSON,
/// a stream that ended before its terminator, a connection that broke
/// mid-body, or a body over the size limit.
///
/// It is the [`source`](std::error::Error::source) of a
/// `PROVIDER_UNAVAILABLE` [`ProviderError`], so a retry policy retries it like
/// a 503. A streamed call may already have sent deltas to the run's sink when
/// it fails: [`deltas_sent`](Self::deltas_sent) says how many, so a retry
/// policy can decline to retry a call whose text the user already saw. The
/// failed answer itself never reaches the transcript: the call is an error.
///
/// ```
/// use tower_agent::error::find;
/// use tower_agent::service::http::BrokenResponse;
/// # fn check(err: &(dyn std::error::Error + 'static)) -> bool {
/// // In a retry policy: retry only a stream that showed nothing yet.
/// find::<BrokenResponse>(err).map_or(true, |broken| broken.deltas_sent() == 0)
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokenResponse {
    detail: String,
    deltas_sent: usize,
}

impl BrokenResponse {
    pub(crate) fn new(detail: impl Into<String>, deltas_sent: usize) -> Self {
        Self {
            detail: detail.into(),
            deltas_sent,
        }
    }

    /// What was wrong with the answer.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// How many deltas of the failed answer already went to the run's sink.
    pub fn deltas_sent(&self) -> usize {
        self.deltas_sent
    }
}

impl fmt::Display for BrokenResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl StdError for BrokenResponse {}

/// A `PROVIDER_UNAVAILABLE` error for an answer that could not be read.
pub(crate) fn broken(detail: impl Into<String>, deltas_sent: usize) -> ProviderError {
    let broken = BrokenResponse::new(detail, deltas_sent);
    ProviderError::unavailable(format!("unreadable response: {}", broken.detail))
        .source_error(broken)
}

/// The parts of an error body that the mapping reads. Both OpenAI's
/// `{"error": {"message", "type", "code"}}` and Anthropic's
/// `{"type": "error", "error": {"type", "message"}}` fit, as do servers that
/// answer `{"error": "text"}`, `{"message": ...}` or `{"detail": ...}`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ErrorBody {
    pub(crate) message: Option<String>,
    pub(crate) kind: Option<String>,
    pub(crate) code: Option<String>,
}

fn text_of(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        Value::Number(n) => Some(n.to_string()),
        other => Some(other.to_string()),
    }
}

impl ErrorBody {
    pub(crate) fn parse(body: &str) -> ErrorBody {
        let Ok(root) = serde_json::from_str::<Value>(body) else {
            return ErrorBody::default();
        };
        Self::from_value(&root)
    }

    pub(crate) fn from_value(root: &Value) -> ErrorBody {
        let node = match root.get("error") {
            Some(Value::String(message)) => {
                return ErrorBody {
                    message: Some(message.clone()),
                    ..ErrorBody::default()
                }
            }
            Some(error @ Value::Object(_)) => error,
            _ => root,
        };
        ErrorBody {
            message: text_of(node.get("message")).or_else(|| text_of(node.get("detail"))),
            kind: text_of(node.get("type")),
            code: text_of(node.get("code")),
        }
    }

    fn tags(&self) -> impl Iterator<Item = &str> {
        self.kind.iter().chain(self.code.iter()).map(String::as_str)
    }

    fn message_lower(&self) -> String {
        self.message.as_deref().unwrap_or("").to_ascii_lowercase()
    }

    /// Whether the account is out of credit.
    pub(crate) fn is_quota(&self) -> bool {
        const TAGS: [&str; 3] = [
            "insufficient_quota",
            "billing_hard_limit_reached",
            "billing_not_active",
        ];
        const MESSAGES: [&str; 2] = ["exceeded your current quota", "credit balance is too low"];
        let message = self.message_lower();
        self.tags().any(|t| TAGS.contains(&t)) || MESSAGES.iter().any(|m| message.contains(m))
    }

    /// Whether the request did not fit the model's context window.
    pub(crate) fn is_context_length(&self) -> bool {
        const TAGS: [&str; 2] = ["context_length_exceeded", "exceed_context_size_error"];
        const MESSAGES: [&str; 8] = [
            "context length",
            "context_length",
            "context window",
            "maximum context",
            "context size",
            "prompt is too long",
            "too many tokens",
            "reduce the length",
        ];
        let message = self.message_lower();
        self.tags().any(|t| TAGS.contains(&t)) || MESSAGES.iter().any(|m| message.contains(m))
    }

    /// The kind of an error that came without a status: an `error` event in
    /// a stream.
    pub(crate) fn stream_kind(&self) -> ErrorKind {
        if self.is_quota() {
            return ErrorKind::QuotaExhausted;
        }
        if self.is_context_length() {
            return ErrorKind::ContextLength;
        }
        let tag = |needle: &str| self.tags().any(|t| t.contains(needle));
        if tag("rate_limit") {
            ErrorKind::RateLimited
        } else if tag("authentication") || tag("permission") {
            ErrorKind::Auth
        } else if tag("invalid_request") || tag("not_found") || tag("request_too_large") {
            ErrorKind::InvalidRequest
        } else {
            ErrorKind::Unavailable
        }
    }
}

/// Reads one header as text.
fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name)?.to_str().ok().map(str::trim)
}

fn seconds(value: f64) -> Option<Duration> {
    if value.is_finite() && value >= 0.0 {
        Duration::try_from_secs_f64(value).ok()
    } else {
        None
    }
}

/// When the provider says to retry: `retry-after-ms`, else `Retry-After` in
/// seconds or as an HTTP date (relative to `now`; a date in the past is zero).
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    if let Some(ms) = header(headers, "retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if let Some(after) = seconds(ms / 1000.0) {
            return Some(after);
        }
    }
    let value = header(headers, "retry-after")?;
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    if let Some(after) = value.parse::<f64>().ok().and_then(seconds) {
        return Some(after);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

fn reason(status: u16) -> &'static str {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("unexpected status")
}

/// Classifies a non-success HTTP answer. See the [module docs](self).
pub(crate) fn classify_http(status: u16, headers: &HeaderMap, body: &str) -> ProviderError {
    let parsed = ErrorBody::parse(body);
    let kind = if parsed.is_quota() {
        ErrorKind::QuotaExhausted
    } else {
        match status {
            401 | 403 => ErrorKind::Auth,
            402 => ErrorKind::QuotaExhausted,
            408 | 409 => ErrorKind::Unavailable,
            429 => ErrorKind::RateLimited,
            400..=499 if parsed.is_context_length() => ErrorKind::ContextLength,
            400..=499 => ErrorKind::InvalidRequest,
            _ => ErrorKind::Unavailable,
        }
    };
    let message = match parsed.message {
        Some(message) if !message.is_empty() => message,
        _ => {
            let snippet: String = body.trim().chars().take(200).collect();
            if snippet.is_empty() {
                reason(status).to_owned()
            } else {
                snippet
            }
        }
    };
    let mut err = ProviderError::new(kind, message).status(status);
    if let Some(after) = retry_after(headers, SystemTime::now()) {
        err = err.retry_after(after);
    }
    err
}

/// Classifies an `error` event inside a stream (no status; by its type).
pub(crate) fn classify_event(data: &Value, deltas_sent: usize) -> ProviderError {
    let parsed = ErrorBody::from_value(data);
    let kind = parsed.stream_kind();
    let message = parsed
        .message
        .clone()
        .unwrap_or_else(|| "the provider reported an error mid-stream".to_owned());
    let detail = format!("error event mid-stream: {message}");
    ProviderError::new(kind, message).source_error(BrokenResponse::new(detail, deltas_sent))
}

/// Classifies a failure of the HTTP client: a timeout, or the provider
/// could not be reached.
pub(crate) fn transport(err: reqwest::Error, deltas_sent: usize) -> ProviderError {
    if err.is_timeout() {
        return ProviderError::new(ErrorKind::Timeout, "the request to the provider timed out")
            .source_error(err);
    }
    let what = if err.is_connect() {
        "could not connect to the provider"
    } else if err.is_body() || err.is_decode() {
        "the connection broke while reading the response"
    } else {
        "the request to the provider failed"
    };
    if err.is_body() || err.is_decode() {
        let detail = format!("{what}: {err}");
        return ProviderError::unavailable(what)
            .source_error(BrokenResponse::new(detail, deltas_sent));
    }
    ProviderError::unavailable(what).source_error(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn maps_status_and_body_to_kinds() {
        let openai = |code: &str, message: &str| {
            format!(
                r#"{{"error": {{"message": "{message}", "type": "invalid_request_error", "code": "{code}"}}}}"#
            )
        };
        let table: Vec<(u16, String, ErrorKind)> = vec![
            (429, openai("rate_limit_exceeded", "Rate limit reached"), ErrorKind::RateLimited),
            (429, openai("insufficient_quota", "You exceeded your current quota"), ErrorKind::QuotaExhausted),
            (429, r#"{"error": {"message": "x", "type": "insufficient_quota"}}"#.into(), ErrorKind::QuotaExhausted),
            (402, r#"{"error": {"message": "Insufficient credits", "code": 402}}"#.into(), ErrorKind::QuotaExhausted),
            (400, r#"{"type": "error", "error": {"type": "invalid_request_error", "message": "Your credit balance is too low to access the API"}}"#.into(), ErrorKind::QuotaExhausted),
            (408, String::new(), ErrorKind::Unavailable),
            (409, String::new(), ErrorKind::Unavailable),
            (500, r#"{"error": {"message": "boom", "type": "server_error"}}"#.into(), ErrorKind::Unavailable),
            (502, "<html>bad gateway</html>".into(), ErrorKind::Unavailable),
            (503, String::new(), ErrorKind::Unavailable),
            (529, r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#.into(), ErrorKind::Unavailable),
            (400, openai("context_length_exceeded", "This model's maximum context length is 8192 tokens"), ErrorKind::ContextLength),
            (400, r#"{"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it", "type": "exceed_context_size_error"}}"#.into(), ErrorKind::ContextLength),
            (400, r#"{"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"}}"#.into(), ErrorKind::ContextLength),
            (400, openai("invalid_value", "Invalid value for 'temperature'"), ErrorKind::InvalidRequest),
            (422, r#"{"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}"#.into(), ErrorKind::InvalidRequest),
            (404, openai("model_not_found", "The model `x` does not exist"), ErrorKind::InvalidRequest),
            (413, r#"{"type": "error", "error": {"type": "request_too_large", "message": "Request exceeds the maximum size"}}"#.into(), ErrorKind::InvalidRequest),
            (401, openai("invalid_api_key", "Incorrect API key provided"), ErrorKind::Auth),
            (403, r#"{"type": "error", "error": {"type": "permission_error", "message": "no"}}"#.into(), ErrorKind::Auth),
            (400, "{not json".into(), ErrorKind::InvalidRequest),
        ];
        for (status, body, kind) in table {
            let err = classify_http(status, &HeaderMap::new(), &body);
            assert_eq!(err.kind(), kind, "{status} {body}");
            assert_eq!(err.http_status(), Some(status));
            assert!(!err.message().is_empty());
        }
    }

    #[test]
    fn keeps_the_message_or_a_snippet() {
        let err = classify_http(
            400,
            &HeaderMap::new(),
            r#"{"error": {"message": "bad temperature"}}"#,
        );
        assert_eq!(err.message(), "bad temperature");
        let err = classify_http(503, &HeaderMap::new(), "");
        assert_eq!(err.message(), "Service Unavailable");
        let err = classify_http(502, &HeaderMap::new(), "upstream down");
        assert_eq!(err.message(), "upstream down");
        assert_eq!(
            err.to_string(),
            "PROVIDER_UNAVAILABLE: upstream down (HTTP 502)"
        );
    }

    #[test]
    fn reads_retry_after_in_every_form() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let at = |h: &[(&'static str, &str)]| retry_after(&headers(h), now);
        assert_eq!(at(&[("retry-after", "7")]), Some(Duration::from_secs(7)));
        assert_eq!(
            at(&[("retry-after", " 1.5 ")]),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            at(&[("retry-after-ms", "250"), ("retry-after", "9")]),
            Some(Duration::from_millis(250))
        );
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(at(&[("retry-after", &date)]), Some(Duration::from_secs(30)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(at(&[("retry-after", &past)]), Some(Duration::ZERO));
        assert_eq!(at(&[("retry-after", "soon")]), None);
        assert_eq!(at(&[("retry-after", "-3")]), None);
        assert_eq!(at(&[("retry-after", "1e400")]), None);
        assert_eq!(at(&[("retry-after-ms", "NaN")]), None);
        assert_eq!(at(&[]), None);
    }

    #[test]
    fn a_429_carries_its_retry_after() {
        let err = classify_http(
            429,
            &headers(&[("retry-after", "3")]),
            r#"{"error": {"message": "slow down", "type": "rate_limit_error"}}"#,
        );
        assert_eq!(err.kind(), ErrorKind::RateLimited);
        assert_eq!(err.retry_after_hint(), Some(Duration::from_secs(3)));
        assert!(err.kind().is_retryable());
        let quota = classify_http(
            429,
            &headers(&[("retry-after", "3")]),
            r#"{"error": {"message": "quota", "code": "insufficient_quota"}}"#,
        );
        assert!(!quota.kind().is_retryable());
    }

    #[test]
    fn classifies_error_events_by_type() {
        let kind = |v: Value| classify_event(&v, 0).kind();
        use serde_json::json;
        assert_eq!(
            kind(
                json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
            ),
            ErrorKind::Unavailable
        );
        assert_eq!(
            kind(json!({"error": {"type": "rate_limit_error", "message": "slow"}})),
            ErrorKind::RateLimited
        );
        assert_eq!(
            kind(json!({"error": {"type": "invalid_request_error", "message": "bad"}})),
            ErrorKind::InvalidRequest
        );
        assert_eq!(kind(json!({"error": "weird"})), ErrorKind::Unavailable);
        let err = classify_event(&json!({"error": {"message": "gone"}}), 4);
        let broken = crate::error::find::<BrokenResponse>(&err).unwrap();
        assert_eq!(broken.deltas_sent(), 4);
    }
}
