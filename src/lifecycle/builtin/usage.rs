//! [`UsageAccountingMiddleware`]: the usage of every answer the runs used.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use crate::context::RunContext;
use crate::lifecycle::{FailPolicy, Hook, Middleware};
use crate::types::{ModelResponse, Usage};

/// What a [`UsageAccountingMiddleware`] counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageTotals {
    /// The usage of every answer, summed.
    pub usage: Usage,
    /// How many answers.
    pub responses: u64,
    /// The usage per model that answered.
    pub by_model: BTreeMap<String, Usage>,
}

/// Folds each answer's usage into running [`UsageTotals`] in `after_model`,
/// across every run it is part of (nested runs included).
///
/// It counts the answers the runs used; the run's ledger
/// ([`RunContext::usage_entries`]) has every call that reached a backend,
/// retried and fallen-back attempts included.
///
/// ```
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_agent::lifecycle::builtin::UsageAccountingMiddleware;
/// use tower_agent::lifecycle::{LifecycleLayer, MiddlewareStack};
/// use tower_agent::{Agent, RunRequest, ScriptedModel, ScriptedTurn, Usage};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::AgentError> {
/// let accounting = UsageAccountingMiddleware::new();
/// let model = ScriptedModel::new([ScriptedTurn::text("hi").usage(Usage::new(12, 3))]);
/// let agent = ServiceBuilder::new()
///     .layer(LifecycleLayer::new(MiddlewareStack::new().push(accounting.clone())))
///     .service(Agent::builder("a").model(model).build()?);
/// agent.oneshot(RunRequest::new("hello")).await?;
/// assert_eq!(accounting.totals().usage, Usage::new(12, 3));
/// assert_eq!(accounting.totals().responses, 1);
/// # Ok(()) }
/// ```
///
/// # Clone
///
/// Clones share the totals.
#[derive(Clone, Default)]
pub struct UsageAccountingMiddleware {
    totals: Arc<Mutex<UsageTotals>>,
}

impl UsageAccountingMiddleware {
    /// Totals starting at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The totals so far.
    pub fn totals(&self) -> UsageTotals {
        self.totals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl fmt::Debug for UsageAccountingMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UsageAccountingMiddleware")
            .field("totals", &self.totals())
            .finish()
    }
}

impl Middleware for UsageAccountingMiddleware {
    fn name(&self) -> &str {
        "usage-accounting"
    }

    fn fail_policy(&self) -> FailPolicy {
        FailPolicy::Open
    }

    fn after_model<'a>(
        &'a self,
        _: &'a RunContext,
        response: &'a mut ModelResponse,
    ) -> Hook<'a, ()> {
        let mut totals = self.totals.lock().unwrap_or_else(PoisonError::into_inner);
        totals.usage += response.usage;
        totals.responses += 1;
        *totals
            .by_model
            .entry(response.model.to_string())
            .or_default() += response.usage;
        Hook::ok(())
    }
}
