//! Errors: one [`AgentError`] at the run boundary, tiny leaf errors inside.
//!
//! Services and layers may fail with any [`BoxError`], as tower's own layers
//! do. The run classifies what reaches it with [`AgentError::classify`]:
//!
//! | what the box holds | becomes |
//! | --- | --- |
//! | an [`AgentError`] | itself |
//! | a [`ProviderError`] | [`AgentError::Provider`], its [`ErrorKind`] kept |
//! | a [`RateLimited`] (a local rate limit refused) | [`ErrorKind::RateLimited`], its `retry_after` kept |
//! | a [`ProviderError`] of kind [`ErrorKind::Timeout`] | [`AgentError::Timeout`] from [`TimeoutSource::Provider`] |
//! | `tower::timeout::error::Elapsed` | [`AgentError::Timeout`] from [`TimeoutSource::Tower`] |
//! | a [`CircuitOpen`] (a circuit breaker refused) | [`ErrorKind::Unavailable`], its `retry_after` kept |
//! | `tower::load_shed::error::Overloaded` | [`ErrorKind::Unavailable`] |
//! | anything else | [`AgentError::Other`], the source kept |
//!
//! Wrappers such as `tower::buffer`'s `ServiceError` are looked through: the
//! whole `source()` chain is searched.
//!
//! Every error has a stable [`code`](AgentError::code) for logs and HTTP
//! mapping:
//!
//! ```
//! use tower_agent::{AgentError, BoxError, ErrorKind};
//!
//! let err: BoxError = Box::new(tower::timeout::error::Elapsed::new());
//! let err = AgentError::classify(err);
//! assert_eq!(err.kind(), ErrorKind::Timeout);
//! assert_eq!(err.code(), "TIMEOUT");
//! assert!(err.kind().is_retryable());
//! ```
//!
//! A timeout says which deadline fired, and after how long:
//!
//! ```
//! use std::time::Duration;
//! use tower_agent::error::{AgentError, TimeoutSource};
//!
//! let err = AgentError::Timeout { timer: TimeoutSource::CallTimeout, after: Some(Duration::from_secs(30)) };
//! assert_eq!(err.to_string(), "timed out: the call timeout fired after 30s");
//! assert_eq!(err.code(), "TIMEOUT");
//! ```

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use serde_json::Value;

use crate::types::{AgentRun, Amount};

mod timeout;

pub use timeout::TimeoutSource;
use timeout::TimeoutText;

/// The error type of services and layers: what tower's own layers use.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What kind of failure an error is. Decides retry, fallback and the HTTP
/// status a server would answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The run used every turn it may take.
    MaxTurns,
    /// The run was cancelled.
    Cancelled,
    /// A call or the run took longer than allowed.
    Timeout,
    /// The provider could not answer (5xx, connection error, overload).
    Unavailable,
    /// The provider asked to slow down (429), or a local rate limit refused.
    RateLimited,
    /// The account's quota or a budget is used up; retrying will not help.
    QuotaExhausted,
    /// The request is malformed or refused as such.
    InvalidRequest,
    /// The conversation no longer fits the model's context window.
    ContextLength,
    /// The credentials were refused.
    Auth,
    /// A tool failed outside a run (inside a run, the model reads the error).
    ToolFailed,
    /// A guard stopped the run.
    Tripwire,
    /// The final answer did not match the response schema.
    StructuredOutput,
    /// A middleware hook failed or panicked.
    Middleware,
    /// An approval decision did not match the call it was given for.
    Approval,
    /// After a middleware edit, a tool call lost its result (or the reverse).
    HistoryIntegrity,
    /// The agent was configured wrongly.
    Config,
    /// Anything else.
    Other,
}

impl ErrorKind {
    /// The stable code, e.g. `RATE_LIMITED`.
    pub const fn code(self) -> &'static str {
        match self {
            ErrorKind::MaxTurns => "MAX_TURNS",
            ErrorKind::Cancelled => "CANCELLED",
            ErrorKind::Timeout => "TIMEOUT",
            ErrorKind::Unavailable => "PROVIDER_UNAVAILABLE",
            ErrorKind::RateLimited => "RATE_LIMITED",
            ErrorKind::QuotaExhausted => "QUOTA_EXHAUSTED",
            ErrorKind::InvalidRequest => "INVALID_REQUEST",
            ErrorKind::ContextLength => "CONTEXT_LENGTH",
            ErrorKind::Auth => "AUTH",
            ErrorKind::ToolFailed => "TOOL_FAILED",
            ErrorKind::Tripwire => "GUARDRAIL_TRIPPED",
            ErrorKind::StructuredOutput => "STRUCTURED_OUTPUT",
            ErrorKind::Middleware => "MIDDLEWARE_FAILED",
            ErrorKind::Approval => "APPROVAL_MISMATCH",
            ErrorKind::HistoryIntegrity => "HISTORY_INTEGRITY",
            ErrorKind::Config => "INVALID_CONFIG",
            ErrorKind::Other => "INTERNAL",
        }
    }

    /// Whether trying the same call again may succeed: rate-limited,
    /// unavailable and timed-out calls.
    pub const fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::RateLimited | ErrorKind::Unavailable | ErrorKind::Timeout
        )
    }

    /// The HTTP status a server would answer a failed run with.
    pub const fn http_status(self) -> u16 {
        match self {
            ErrorKind::Tripwire
            | ErrorKind::InvalidRequest
            | ErrorKind::ContextLength
            | ErrorKind::StructuredOutput
            | ErrorKind::Approval
            | ErrorKind::HistoryIntegrity => 400,
            ErrorKind::Auth => 401,
            ErrorKind::QuotaExhausted => 402,
            ErrorKind::Cancelled => 499,
            ErrorKind::RateLimited => 429,
            ErrorKind::Unavailable => 503,
            ErrorKind::Timeout => 504,
            _ => 500,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// A model provider's failure, classified. Providers and layers (retry, rate
/// limit) return it boxed; the run keeps it as [`AgentError::Provider`].
#[derive(Debug)]
pub struct ProviderError {
    kind: ErrorKind,
    message: String,
    status: Option<u16>,
    retry_after: Option<Duration>,
    timed_out_after: Option<Duration>,
    source: Option<BoxError>,
}

impl ProviderError {
    /// An error of `kind` with a message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            status: None,
            retry_after: None,
            timed_out_after: None,
            source: None,
        }
    }

    /// The provider's own timeout (its HTTP client's) fired, after `after`
    /// when it is known. Classifies as [`AgentError::Timeout`] from
    /// [`TimeoutSource::Provider`].
    pub fn timed_out(message: impl Into<String>, after: Option<Duration>) -> Self {
        let mut err = Self::new(ErrorKind::Timeout, message);
        err.timed_out_after = after;
        err
    }

    /// For a timeout, the time the provider allowed the call, if known.
    pub fn timed_out_after(&self) -> Option<Duration> {
        self.timed_out_after
    }

    /// The provider is unavailable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    /// The provider rate-limited the call, optionally saying when to retry.
    pub fn rate_limited(message: impl Into<String>, retry_after: Option<Duration>) -> Self {
        Self::new(ErrorKind::RateLimited, message).retry_after_opt(retry_after)
    }

    /// The HTTP status the provider answered with.
    pub fn status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    /// When the provider says the call may be retried.
    pub fn retry_after(self, after: Duration) -> Self {
        self.retry_after_opt(Some(after))
    }

    /// For a timeout, records how long the provider was allowed (the HTTP
    /// providers' transport says it).
    #[cfg(feature = "openai")]
    pub(crate) fn allowed(mut self, after: Option<Duration>) -> Self {
        if self.kind == ErrorKind::Timeout {
            self.timed_out_after = after;
        }
        self
    }

    fn retry_after_opt(mut self, after: Option<Duration>) -> Self {
        self.retry_after = after;
        self
    }

    /// The underlying error.
    pub fn source_error(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The provider's message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The HTTP status, if there was a response.
    pub fn http_status(&self) -> Option<u16> {
        self.status
    }

    /// The provider's `Retry-After`, if it sent one.
    pub fn retry_after_hint(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.code(), self.message)?;
        if let Some(status) = self.status {
            write!(f, " (HTTP {status})")?;
        }
        Ok(())
    }
}

impl StdError for ProviderError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// A local rate limit refused a call: it would have waited longer than
/// allowed for capacity. The leaf error of
/// [`layers::rate_limit`](crate::layers::rate_limit); classifies as
/// [`ErrorKind::RateLimited`] and carries when to try again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimited {
    key: String,
    retry_after: Duration,
}

impl RateLimited {
    /// The limit of `key` refused a call that could start `retry_after` from now.
    pub fn new(key: impl Into<String>, retry_after: Duration) -> Self {
        Self {
            key: key.into(),
            retry_after,
        }
    }

    /// The rate-limit key (by default the model's name).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How long from the refusal until the call would have had capacity.
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rate limit `{}`: capacity in {:?}, longer than the call may wait",
            self.key, self.retry_after
        )
    }
}

impl StdError for RateLimited {}

/// A circuit breaker refused a call at once: the model's provider failed
/// too often lately. The leaf error of
/// [`layers::circuit_breaker`](crate::layers::circuit_breaker); classifies
/// as [`ErrorKind::Unavailable`] (`PROVIDER_UNAVAILABLE`), so a fallback
/// moves on at once, and carries when the breaker will let a call through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircuitOpen {
    key: String,
    retry_after: Duration,
}

impl CircuitOpen {
    /// The breaker of `key` refused a call; it tries again `retry_after` from now.
    pub fn new(key: impl Into<String>, retry_after: Duration) -> Self {
        Self {
            key: key.into(),
            retry_after,
        }
    }

    /// The breaker's key (by default the model's name).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How long until the breaker lets a probe call through (zero while a
    /// probe is already in flight).
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }
}

impl fmt::Display for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "circuit `{}` is open: the provider failed too often; next try in {:?}",
            self.key, self.retry_after
        )
    }
}

impl StdError for CircuitOpen {}

/// A budget refused a model call: what was spent and reserved, plus the
/// call's estimate, would pass its limit. Ends the run as a tripwire does
/// (also from inside a nested run), with the code `BUDGET_EXCEEDED`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetExceeded {
    /// The budget's name.
    pub budget: String,
    /// What it is kept for, e.g. `tenant:acme`, `thread:t-1`, `run:run_…`.
    pub key: String,
    /// Its limit.
    pub limit: Amount,
    /// What was spent, plus what calls in flight hold, when it refused.
    pub spent: Amount,
    /// What the refused call would have reserved.
    pub requested: Amount,
}

impl fmt::Display for BudgetExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "budget `{}` ({}) exceeded: limit {}, spent {}, the call needs up to {}",
            self.budget, self.key, self.limit, self.spent, self.requested
        )
    }
}

impl StdError for BudgetExceeded {}

/// A call limit was reached: the run ends with the code `LIMIT_EXCEEDED`,
/// as a tripwire does (also from inside a nested run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitExceeded {
    /// The limit, e.g. `model_calls per run`, `tool_calls(search) per thread`.
    pub limit: String,
    /// How many calls it allows.
    pub max: u32,
}

impl fmt::Display for LimitExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "limit reached: at most {} {}", self.max, self.limit)
    }
}

impl StdError for LimitExceeded {}

/// A tool panicked: what the panic becomes once caught below a wrap hook,
/// or by the run. Classifies as [`ErrorKind::Other`].
///
/// Inside a run, the model reads it as the tool's error result: by default
/// only that the tool failed; the message goes to the `ToolCallCompleted`
/// event and the trace, and reaches the model only with
/// [`AgentBuilder::show_tool_panics`](crate::AgentBuilder::show_tool_panics).
/// So its `Display` leaves the message out; read it with
/// [`message`](Self::message).
///
/// A wrap middleware made a tower layer over a tool reads the panic as
/// this error:
///
/// ```
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_agent::error::{find, ToolPanicked};
/// use tower_agent::lifecycle::{from_fn, ToolNext};
/// use tower_agent::types::ToolCall;
/// use tower_agent::{tool_fn, BoxError, RunContext, ToolInvocation};
///
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Nothing {}
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let explode = tool_fn("explode", "Panics", |_: Nothing| async {
///     if true {
///         panic!("disk at /srv/data is full");
///     }
///     Ok::<String, BoxError>(String::new())
/// });
/// let tool = ServiceBuilder::new()
///     .layer(from_fn(|invocation: ToolInvocation, next: ToolNext| next.run(invocation)))
///     .service(explode);
///
/// let call = ToolInvocation::new(ToolCall::new("1", "explode", "{}"), RunContext::new());
/// let err = tool.oneshot(call).await.unwrap_err();
/// assert_eq!(err.to_string(), "the tool `explode` panicked");
/// let panic = find::<ToolPanicked>(err.as_ref()).unwrap();
/// assert_eq!(panic.message(), "disk at /srv/data is full");
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPanicked {
    tool: String,
    message: String,
}

impl ToolPanicked {
    /// `tool` panicked with `payload`.
    pub(crate) fn new(tool: &str, payload: &(dyn std::any::Any + Send)) -> Self {
        Self {
            tool: tool.to_owned(),
            message: panic_message(payload),
        }
    }

    /// The tool's name.
    pub fn tool(&self) -> &str {
        &self.tool
    }

    /// The panic's message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ToolPanicked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the tool `{}` panicked", self.tool)
    }
}

impl StdError for ToolPanicked {}

/// The error of a run, and of anything the run classifies.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The run used all its turns. `partial` holds what it did.
    #[error("the run used all {limit} turns without a final answer")]
    MaxTurns {
        /// The agent's `max_turns`.
        limit: u32,
        /// The run so far: its transcript, usage and counters.
        partial: Box<AgentRun>,
    },
    /// The run's cancellation token fired.
    #[error("the run was cancelled")]
    Cancelled,
    /// A call, or the run, timed out: `timer` says which deadline fired
    /// and `after` how long it allowed (the run's: how long the run had been
    /// going), e.g. "timed out: the call timeout fired after 30s".
    #[error("{}", TimeoutText(*timer, *after))]
    Timeout {
        /// Which deadline fired.
        timer: TimeoutSource,
        /// After how long, when known.
        after: Option<Duration>,
    },
    /// The model provider failed.
    #[error(transparent)]
    Provider(ProviderError),
    /// A guard stopped the run.
    #[error("guardrail tripped in {middleware}.{hook}: {reason}")]
    Tripwire {
        /// The middleware that raised it (filled in by the stack).
        middleware: String,
        /// The hook it was raised from (filled in by the stack).
        hook: String,
        /// Why.
        reason: String,
        /// Details for the caller.
        info: Option<Value>,
    },
    /// The final answer never matched the response schema.
    #[error(
        "the final answer did not match the response schema after {attempts} attempts: {message}"
    )]
    StructuredOutput {
        /// How many answers were checked.
        attempts: u32,
        /// The last validation error.
        message: String,
        /// The last answer's text.
        raw: String,
    },
    /// A tool failed outside a run.
    #[error("tool `{tool}` failed: {source}")]
    ToolFailed {
        /// The tool's name.
        tool: String,
        /// Why.
        source: BoxError,
    },
    /// A middleware hook failed or panicked.
    #[error("middleware `{middleware}` failed in {hook}: {source}")]
    Middleware {
        /// The middleware's name.
        middleware: String,
        /// The hook.
        hook: String,
        /// The hook's error, or the panic's message.
        source: BoxError,
    },
    /// An approval decision did not fit the call it was given for.
    #[error("approval refused: {0}")]
    Approval(String),
    /// A tool call lost its result, or a result its call.
    #[error("history integrity: {0}")]
    HistoryIntegrity(String),
    /// The agent's configuration is wrong.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A budget refused a model call (`BUDGET_EXCEEDED`, a tripwire).
    #[error(transparent)]
    BudgetExceeded(BudgetExceeded),
    /// A call limit was reached (`LIMIT_EXCEEDED`, a tripwire).
    #[error(transparent)]
    LimitExceeded(LimitExceeded),
    /// Any other failure, with its source.
    #[error(transparent)]
    Other(BoxError),
}

impl AgentError {
    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            AgentError::MaxTurns { .. } => ErrorKind::MaxTurns,
            AgentError::Cancelled => ErrorKind::Cancelled,
            AgentError::Timeout { .. } => ErrorKind::Timeout,
            AgentError::Provider(e) => e.kind(),
            AgentError::Tripwire { .. } => ErrorKind::Tripwire,
            AgentError::StructuredOutput { .. } => ErrorKind::StructuredOutput,
            AgentError::ToolFailed { .. } => ErrorKind::ToolFailed,
            AgentError::Middleware { .. } => ErrorKind::Middleware,
            AgentError::Approval(_) => ErrorKind::Approval,
            AgentError::HistoryIntegrity(_) => ErrorKind::HistoryIntegrity,
            AgentError::Config(_) => ErrorKind::Config,
            AgentError::BudgetExceeded(_) | AgentError::LimitExceeded(_) => ErrorKind::Tripwire,
            AgentError::Other(_) => ErrorKind::Other,
        }
    }

    /// The stable code of [`kind`](Self::kind), e.g. `GUARDRAIL_TRIPPED`;
    /// `BUDGET_EXCEEDED` and `LIMIT_EXCEEDED` for those tripwires.
    pub fn code(&self) -> &'static str {
        match self {
            AgentError::BudgetExceeded(_) => "BUDGET_EXCEEDED",
            AgentError::LimitExceeded(_) => "LIMIT_EXCEEDED",
            _ => self.kind().code(),
        }
    }

    /// Turns whatever a service or layer failed with into an `AgentError`.
    /// See the [module docs](crate::error).
    pub fn classify(err: BoxError) -> AgentError {
        let err = match err.downcast::<AgentError>() {
            Ok(agent) => return *agent,
            Err(err) => err,
        };
        let err = match err.downcast::<ProviderError>() {
            Ok(provider) => return AgentError::from(*provider),
            Err(err) => err,
        };
        match find::<AgentError>(err.as_ref()) {
            Some(AgentError::Tripwire {
                middleware,
                hook,
                reason,
                info,
            }) => {
                return AgentError::Tripwire {
                    middleware: middleware.clone(),
                    hook: hook.clone(),
                    reason: reason.clone(),
                    info: info.clone(),
                }
            }
            Some(AgentError::BudgetExceeded(e)) => return AgentError::BudgetExceeded(e.clone()),
            Some(AgentError::LimitExceeded(e)) => return AgentError::LimitExceeded(e.clone()),
            _ => {}
        }
        if let Some(timeout) = find::<AgentError>(err.as_ref()).and_then(AgentError::timeout) {
            return timeout;
        }
        if let Some(provider) = find::<ProviderError>(err.as_ref()) {
            if provider.kind() == ErrorKind::Timeout {
                return AgentError::provider_timeout(provider);
            }
        }
        match kind_of(err.as_ref()) {
            ErrorKind::Timeout => AgentError::Timeout {
                timer: TimeoutSource::Tower,
                after: None,
            },
            ErrorKind::Cancelled => AgentError::Cancelled,
            kind @ (ErrorKind::Unavailable
            | ErrorKind::RateLimited
            | ErrorKind::QuotaExhausted
            | ErrorKind::InvalidRequest
            | ErrorKind::ContextLength
            | ErrorKind::Auth) => AgentError::Provider(
                ProviderError::new(kind, err.to_string())
                    .retry_after_opt(retry_after(err.as_ref()))
                    .source_error(err),
            ),
            _ => AgentError::Other(err),
        }
    }

    /// Which deadline fired and after how long, if this is a timeout.
    pub fn timeout_source(&self) -> Option<(TimeoutSource, Option<Duration>)> {
        match *self {
            AgentError::Timeout { timer, after } => Some((timer, after)),
            AgentError::Provider(ref p) if p.kind() == ErrorKind::Timeout => {
                Some((TimeoutSource::Provider, p.timed_out_after()))
            }
            _ => None,
        }
    }

    /// A copy of a timeout error.
    fn timeout(&self) -> Option<AgentError> {
        match *self {
            AgentError::Timeout { timer, after } => Some(AgentError::Timeout { timer, after }),
            _ => None,
        }
    }

    fn provider_timeout(provider: &ProviderError) -> AgentError {
        AgentError::Timeout {
            timer: TimeoutSource::Provider,
            after: provider.timed_out_after(),
        }
    }

    /// A tripwire error whose middleware and hook the stack fills in.
    pub(crate) fn tripwire(reason: String, info: Option<Value>) -> AgentError {
        AgentError::Tripwire {
            middleware: String::new(),
            hook: String::new(),
            reason,
            info,
        }
    }
}

impl From<ProviderError> for AgentError {
    /// [`AgentError::Provider`]; a provider's timeout becomes
    /// [`AgentError::Timeout`] from [`TimeoutSource::Provider`].
    fn from(err: ProviderError) -> Self {
        if err.kind() == ErrorKind::Timeout {
            return AgentError::provider_timeout(&err);
        }
        AgentError::Provider(err)
    }
}

/// Raises a tripwire: return it from any hook or wrap middleware and the run
/// ends with [`AgentError::Tripwire`] (`GUARDRAIL_TRIPPED`), also from inside
/// a nested agent. The stack fills in the middleware's name and the hook.
///
/// ```
/// use tower_agent::{tripwire, BoxError};
///
/// fn check(input: &str) -> Result<(), BoxError> {
///     if input.contains("refund") {
///         return Err(tripwire("refunds go to a person").into());
///     }
///     Ok(())
/// }
/// assert!(check("I want a refund").is_err());
/// ```
pub fn tripwire(reason: impl Into<String>) -> AgentError {
    AgentError::tripwire(reason.into(), None)
}

/// Like [`tripwire`], with details for the caller.
pub fn tripwire_with(reason: impl Into<String>, info: Value) -> AgentError {
    AgentError::tripwire(reason.into(), Some(info))
}

/// Finds an error of type `E` in `err` or its `source()` chain.
pub fn find<'a, E: StdError + 'static>(err: &'a (dyn StdError + 'static)) -> Option<&'a E> {
    let mut current = Some(err);
    while let Some(err) = current {
        if let Some(found) = err.downcast_ref::<E>() {
            return Some(found);
        }
        current = err.source();
    }
    None
}

/// The [`ErrorKind`] of any error, without consuming it: what a retry or
/// fallback policy asks. Searches the `source()` chain.
pub fn kind_of(err: &(dyn StdError + 'static)) -> ErrorKind {
    let mut current = Some(err);
    while let Some(err) = current {
        if let Some(agent) = err.downcast_ref::<AgentError>() {
            return agent.kind();
        }
        if let Some(provider) = err.downcast_ref::<ProviderError>() {
            return provider.kind();
        }
        if err.is::<tower::timeout::error::Elapsed>() {
            return ErrorKind::Timeout;
        }
        if err.is::<tower::load_shed::error::Overloaded>() {
            return ErrorKind::Unavailable;
        }
        if err.is::<RateLimited>() {
            return ErrorKind::RateLimited;
        }
        if err.is::<CircuitOpen>() {
            return ErrorKind::Unavailable;
        }
        current = err.source();
    }
    ErrorKind::Other
}

/// The `Retry-After` hint of an error, if it carries one.
pub fn retry_after(err: &(dyn StdError + 'static)) -> Option<Duration> {
    let mut current = Some(err);
    while let Some(err) = current {
        if let Some(AgentError::Provider(provider)) = err.downcast_ref::<AgentError>() {
            return provider.retry_after_hint();
        }
        if let Some(provider) = err.downcast_ref::<ProviderError>() {
            return provider.retry_after_hint();
        }
        if let Some(limited) = err.downcast_ref::<RateLimited>() {
            return Some(limited.retry_after());
        }
        if let Some(open) = err.downcast_ref::<CircuitOpen>() {
            return Some(open.retry_after());
        }
        current = err.source();
    }
    None
}

/// A nameless [`tripwire`] named after who raised it (`by`, at `hook`);
/// any other error as it is. The one place a tripwire is attributed: the
/// lifecycle hooks, the wrap hooks and the run loop (for a tool's own
/// tripwire) all call it.
pub(crate) fn attribute_tripwire(err: AgentError, by: &str, hook: &str) -> AgentError {
    match err {
        AgentError::Tripwire {
            middleware,
            hook: raised_at,
            reason,
            info,
        } if middleware.is_empty() => AgentError::Tripwire {
            middleware: by.to_owned(),
            hook: if raised_at.is_empty() {
                hook.to_owned()
            } else {
                raised_at
            },
            reason,
            info,
        },
        other => other,
    }
}

/// The text of a panic's payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

#[cfg(test)]
mod tests;
