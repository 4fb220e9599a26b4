//! [`RetryPolicy`]: which failures to retry, how long to wait, when to stop.

use std::error::Error as StdError;
use std::time::Duration;

use tower::retry::Policy;

use super::future::Delay;
use super::{Backoff, RetryBudget, RetryRequest};
use crate::error::{find, kind_of, retry_after, BoxError, ErrorKind, ProviderError};
use crate::event::AgentEvent;

/// Whether `err` is a provider's passing trouble, worth another call (to the
/// same model or the next): rate-limited, unavailable, timed out, or an
/// unclassified error from an HTTP 5xx answer.
///
/// Never: invalid request, auth, context length, tripwire, quota exhausted,
/// cancelled — calling again cannot help there. The `source()` chain is
/// searched, so wrapped errors (tower's `Buffer`, a
/// [`FallbackExhausted`](crate::layers::fallback::error::FallbackExhausted)) count as
/// what they wrap.
///
/// ```
/// use tower_agent::layers::retry::is_transient;
/// use tower_agent::{ErrorKind, ProviderError};
///
/// assert!(is_transient(&ProviderError::unavailable("overloaded")));
/// assert!(is_transient(&ProviderError::new(ErrorKind::Other, "bad gateway").status(502)));
/// assert!(!is_transient(&ProviderError::new(ErrorKind::ContextLength, "too long")));
/// assert!(is_transient(&tower::timeout::error::Elapsed::new()));
/// ```
pub fn is_transient(err: &(dyn StdError + 'static)) -> bool {
    match kind_of(err) {
        kind if kind.is_retryable() => true,
        ErrorKind::Other => find::<ProviderError>(err)
            .and_then(ProviderError::http_status)
            .is_some_and(|status| (500..600).contains(&status)),
        _ => false,
    }
}

/// The LLM-aware [`tower::retry::Policy`]: see the [module docs](super).
///
/// Defaults: 3 attempts in all, [`Backoff::default`] (500 ms doubling to
/// 30 s, full jitter), a provider's `Retry-After` honoured up to 60 s, no
/// budget.
///
/// It works on its own with `tower::retry::RetryLayer` too, for services
/// failing with [`BoxError`]; [`LlmRetryLayer`](super::LlmRetryLayer) adds the
/// stream guard a streamed call needs to be retried at all.
///
/// # Clone
///
/// Each call carries its own clone (its attempt count); the budget and a
/// seeded backoff's generator are shared.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    max_attempts: u32,
    backoff: Backoff,
    max_retry_after: Duration,
    budget: Option<RetryBudget>,
    /// Failed attempts of the call this clone belongs to.
    failed: u32,
}

impl RetryPolicy {
    /// The default policy.
    pub fn new() -> Self {
        Self {
            max_attempts: 3,
            backoff: Backoff::default(),
            max_retry_after: Duration::from_secs(60),
            budget: None,
            failed: 0,
        }
    }

    /// The most attempts a call gets, the first included (default 3; 0 is
    /// read as 1, no retry).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// How long to wait between attempts when the provider does not say.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The longest `Retry-After` to wait for (default 60 s). A provider
    /// asking for more fails the call at once, with its error.
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.max_retry_after = max;
        self
    }

    /// Draws every retry from `budget`, shared with whoever else holds it.
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    pub(super) fn budget_handle(&self) -> Option<&RetryBudget> {
        self.budget.as_ref()
    }

    /// Whether a call may be sent more than once (and so needs a copy).
    pub(super) fn retries(&self) -> bool {
        self.max_attempts > 1
    }

    /// How long to wait before the next attempt, or `None` to give up.
    fn next_delay<Req: RetryRequest>(
        &self,
        req: &Req,
        err: &(dyn StdError + 'static),
    ) -> Result<Duration, &'static str> {
        if !is_transient(err) {
            return Err("not retryable");
        }
        if self.failed >= self.max_attempts {
            return Err("attempts used up");
        }
        if !req.replay_safe() {
            return Err(
                "not replay-safe (streamed output went out, or the tool is not idempotent)",
            );
        }
        let ctx = req.context();
        if ctx.is_cancelled() {
            return Err("the run was cancelled");
        }
        let delay = match retry_after(err) {
            Some(after) if after > self.max_retry_after => {
                return Err("Retry-After is longer than the policy waits")
            }
            Some(after) => after,
            None => self.backoff.delay(self.failed),
        };
        if ctx.remaining().is_some_and(|left| delay >= left) {
            return Err("the run's deadline comes first");
        }
        if let Some(budget) = &self.budget {
            if !budget.withdraw() {
                return Err("the retry budget is spent");
            }
        }
        Ok(delay)
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl<Req, Res> Policy<Req, Res, BoxError> for RetryPolicy
where
    Req: RetryRequest,
{
    type Future = Delay;

    fn retry(&mut self, req: &mut Req, result: &mut Result<Res, BoxError>) -> Option<Delay> {
        if let Some(budget) = &self.budget {
            budget.deposit_once(req.extensions_mut());
        }
        let err: &(dyn StdError + 'static) = result.as_ref().err()?.as_ref();
        self.failed += 1;
        let attempt = self.failed;
        let code = kind_of(err).code();
        match self.next_delay(req, err) {
            Ok(delay) => {
                tracing::debug!(attempt, code, ?delay, error = %err, "retrying");
                let ctx = req.context();
                ctx.emit(|| AgentEvent::RetryAttempt {
                    run_id: ctx.run_id().clone(),
                    attempt,
                    code,
                    error: err.to_string(),
                    delay,
                });
                Some(Delay::new(delay))
            }
            Err(reason) => {
                tracing::debug!(attempt, code, reason, error = %err, "not retrying");
                None
            }
        }
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        self.retries().then(|| req.clone())
    }
}
