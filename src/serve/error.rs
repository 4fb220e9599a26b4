//! Errors as HTTP answers: JSON `{code, message, details}` with a status
//! mapped from the code.

use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::Value;

use crate::error::AgentError;
use crate::stores::CheckpointError;

/// An error answer of the server.
///
/// | code | status |
/// | --- | --- |
/// | `GUARDRAIL_TRIPPED`, `INVALID_REQUEST` | 400 |
/// | `AUTH` | 401 |
/// | `BUDGET_EXCEEDED`, `QUOTA_EXHAUSTED` | 402 |
/// | `NOT_FOUND` | 404 |
/// | `CONFLICT` | 409 |
/// | `RATE_LIMITED` | 429, with `Retry-After` when known |
/// | `PROVIDER_UNAVAILABLE` | 503 |
/// | `TIMEOUT` | 504 |
/// | anything else | 500 |
#[derive(Debug, Clone, Serialize)]
pub struct ApiError {
    /// The stable code ([`AgentError::code`] for a failed run).
    pub code: String,
    /// What went wrong, for a person.
    pub message: String,
    /// More, when there is more (the tripwire's info, the wait of a rate limit).
    pub details: Value,
    #[serde(skip)]
    retry_after: Option<Duration>,
}

impl ApiError {
    /// An error with `code` and `message`, no details.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            details: Value::Null,
            retry_after: None,
        }
    }

    /// A 400 `INVALID_REQUEST`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new("INVALID_REQUEST", message)
    }

    /// A 404 `NOT_FOUND`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new("NOT_FOUND", message)
    }

    /// With `details`.
    pub fn details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    /// The answer's status, from the code (see the type's docs).
    pub fn status(&self) -> StatusCode {
        status_of(&self.code)
    }
}

/// The status of an error code.
pub(crate) fn status_of(code: &str) -> StatusCode {
    match code {
        "GUARDRAIL_TRIPPED" | "INVALID_REQUEST" => StatusCode::BAD_REQUEST,
        "AUTH" => StatusCode::UNAUTHORIZED,
        "BUDGET_EXCEEDED" | "QUOTA_EXHAUSTED" => StatusCode::PAYMENT_REQUIRED,
        "NOT_FOUND" => StatusCode::NOT_FOUND,
        "CONFLICT" => StatusCode::CONFLICT,
        "RATE_LIMITED" => StatusCode::TOO_MANY_REQUESTS,
        "PROVIDER_UNAVAILABLE" => StatusCode::SERVICE_UNAVAILABLE,
        "TIMEOUT" => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<&AgentError> for ApiError {
    fn from(err: &AgentError) -> Self {
        let retry_after = crate::error::retry_after(err);
        let details = match err {
            AgentError::Tripwire {
                middleware, info, ..
            } => serde_json::json!({ "middleware": middleware, "info": info }),
            _ => match retry_after {
                Some(after) => serde_json::json!({ "retry_after_secs": after.as_secs_f64() }),
                None => Value::Null,
            },
        };
        Self {
            code: err.code().to_owned(),
            message: err.to_string(),
            details,
            retry_after,
        }
    }
}

impl From<AgentError> for ApiError {
    fn from(err: AgentError) -> Self {
        Self::from(&err)
    }
}

impl From<CheckpointError> for ApiError {
    fn from(err: CheckpointError) -> Self {
        match &err {
            CheckpointError::NotFound { .. } => Self::not_found(err.to_string()),
            CheckpointError::Conflict { found, .. } => Self::new("CONFLICT", err.to_string())
                .details(serde_json::json!({ "version": found })),
            _ => Self::new("INTERNAL", err.to_string()),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        Self::invalid(rejection.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let retry_after = (status == StatusCode::TOO_MANY_REQUESTS)
            .then_some(self.retry_after)
            .flatten();
        let mut response = (status, Json(self)).into_response();
        if let Some(after) = retry_after {
            // Whole seconds, rounded up: a client must not come back early.
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            if let Ok(value) = HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ErrorKind, ProviderError};

    #[test]
    fn codes_map_to_statuses() {
        let cases = [
            ("GUARDRAIL_TRIPPED", 400),
            ("INVALID_REQUEST", 400),
            ("AUTH", 401),
            ("BUDGET_EXCEEDED", 402),
            ("QUOTA_EXHAUSTED", 402),
            ("RATE_LIMITED", 429),
            ("PROVIDER_UNAVAILABLE", 503),
            ("TIMEOUT", 504),
            ("MAX_TURNS", 500),
            ("INTERNAL", 500),
        ];
        for (code, status) in cases {
            assert_eq!(status_of(code).as_u16(), status, "{code}");
        }
    }

    #[test]
    fn a_rate_limit_answers_429_with_retry_after_rounded_up() {
        let err = AgentError::Provider(ProviderError::rate_limited(
            "slow down",
            Some(Duration::from_millis(1500)),
        ));
        let response = ApiError::from(&err).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
    }

    #[test]
    fn a_tripwire_is_400_with_its_middleware_in_details() {
        let err = AgentError::Tripwire {
            middleware: "guard".into(),
            hook: "before_model".into(),
            reason: "no secrets".into(),
            info: None,
        };
        let api = ApiError::from(&err);
        assert_eq!(api.code, "GUARDRAIL_TRIPPED");
        assert_eq!(api.status(), StatusCode::BAD_REQUEST);
        assert_eq!(api.details["middleware"], "guard");
        let unavailable = AgentError::Provider(ProviderError::new(ErrorKind::Unavailable, "down"));
        assert_eq!(
            ApiError::from(&unavailable).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
