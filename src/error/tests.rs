//! The classification of errors from tower, providers and wrappers.

use super::*;

#[test]
fn classifies_tower_errors_through_wrappers() {
    let overloaded: BoxError = Box::new(tower::load_shed::error::Overloaded::new());
    assert_eq!(
        AgentError::classify(overloaded).code(),
        "PROVIDER_UNAVAILABLE"
    );

    let agent: BoxError = Box::new(tripwire("no"));
    assert_eq!(AgentError::classify(agent).code(), "GUARDRAIL_TRIPPED");

    let limited: BoxError = Box::new(ProviderError::rate_limited(
        "slow down",
        Some(Duration::from_secs(3)),
    ));
    let err = AgentError::classify(limited);
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert!(
        matches!(&err, AgentError::Provider(p) if p.retry_after_hint() == Some(Duration::from_secs(3)))
    );

    let other: BoxError = "boom".into();
    let err = AgentError::classify(other);
    assert_eq!(err.code(), "INTERNAL");
    assert_eq!(err.to_string(), "boom");
}

#[test]
fn a_local_rate_limit_classifies_with_its_retry_after() {
    let limited: BoxError = Box::new(Wrapper(Box::new(RateLimited::new(
        "gpt-4o",
        Duration::from_secs(7),
    ))));
    assert_eq!(kind_of(limited.as_ref()), ErrorKind::RateLimited);
    assert_eq!(retry_after(limited.as_ref()), Some(Duration::from_secs(7)));
    let err = AgentError::classify(limited);
    assert_eq!(err.code(), "RATE_LIMITED");
    assert!(
        matches!(&err, AgentError::Provider(p) if p.retry_after_hint() == Some(Duration::from_secs(7)))
    );
}

#[derive(Debug, thiserror::Error)]
#[error("wrapped")]
struct Wrapper(#[source] BoxError);

#[test]
fn looks_through_wrapping_errors() {
    let inner: BoxError = Box::new(tower::timeout::error::Elapsed::new());
    let wrapped: BoxError = Box::new(Wrapper(inner));
    assert_eq!(kind_of(wrapped.as_ref()), ErrorKind::Timeout);
    assert_eq!(AgentError::classify(wrapped).kind(), ErrorKind::Timeout);

    let quota: BoxError = Box::new(Wrapper(Box::new(ProviderError::new(
        ErrorKind::QuotaExhausted,
        "no credit",
    ))));
    let err = AgentError::classify(quota);
    assert_eq!(err.code(), "QUOTA_EXHAUSTED");
    assert!(!err.kind().is_retryable());
}

#[test]
fn a_timeout_keeps_its_timer_through_wrappers() {
    let timeout = AgentError::Timeout {
        timer: TimeoutSource::CallTimeout,
        after: Some(Duration::from_secs(30)),
    };
    let wrapped: BoxError = Box::new(Wrapper(Box::new(timeout)));
    let err = AgentError::classify(wrapped);
    assert_eq!(
        err.timeout_source(),
        Some((TimeoutSource::CallTimeout, Some(Duration::from_secs(30))))
    );
    let provider: BoxError = Box::new(Wrapper(Box::new(ProviderError::timed_out(
        "slow",
        Some(Duration::from_secs(5)),
    ))));
    let err = AgentError::classify(provider);
    assert_eq!(
        err.to_string(),
        "timed out: the provider's timeout fired after 5s"
    );
    assert_eq!(
        AgentError::Timeout {
            timer: TimeoutSource::RunDeadline,
            after: None
        }
        .to_string(),
        "timed out: the run's deadline passed"
    );
}
