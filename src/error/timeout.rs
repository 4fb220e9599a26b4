//! [`TimeoutSource`]: which deadline a timeout error names.

use std::fmt;
use std::time::Duration;

/// Which deadline ended a call or a run: the `timer` of
/// [`AgentError::Timeout`](super::AgentError::Timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TimeoutSource {
    /// The run's deadline ([`RunContext::deadline`](crate::RunContext::deadline)),
    /// in the run loop or a layer bounded by it; `after` is how long the run
    /// had been going.
    RunDeadline,
    /// The per-call timeout of a
    /// [`CallTimeoutLayer`](crate::layers::timeout::CallTimeoutLayer) on a
    /// model stack.
    CallTimeout,
    /// A tool call's timeout: a
    /// [`CallTimeoutLayer`](crate::layers::timeout::CallTimeoutLayer) on a
    /// tool stack, or a tool's own.
    Tool,
    /// The provider's own timeout (its HTTP client's).
    Provider,
    /// tower's own `TimeoutLayer` (`tower::timeout::error::Elapsed`, which
    /// does not say after how long).
    Tower,
}

impl TimeoutSource {
    /// What fired, as the error's text says it: e.g. `the call timeout`.
    pub const fn describe(self) -> &'static str {
        match self {
            TimeoutSource::RunDeadline => "the run's deadline",
            TimeoutSource::CallTimeout => "the call timeout",
            TimeoutSource::Tool => "the tool call timeout",
            TimeoutSource::Provider => "the provider's timeout",
            TimeoutSource::Tower => "a tower timeout layer",
        }
    }
}

impl fmt::Display for TimeoutSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// The text of [`AgentError::Timeout`].
pub(super) struct TimeoutText(pub(super) TimeoutSource, pub(super) Option<Duration>);

impl fmt::Display for TimeoutText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = match self.0 {
            TimeoutSource::RunDeadline => "passed",
            _ => "fired",
        };
        write!(f, "timed out: {} {verb}", self.0)?;
        if let Some(after) = self.1 {
            write!(f, " after {after:?}")?;
        }
        Ok(())
    }
}
