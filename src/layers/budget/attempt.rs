//! One attempt through the budget: reserve on every group of lines, call,
//! settle with the real usage (also when dropped).

use std::future::Future;
use std::sync::Arc;
use std::task::Context;

use tower::Service;

use super::Config;
use crate::context::RunContext;
use crate::error::{AgentError, BoxError};
use crate::request::ModelCall;
use crate::stores::budget::{BudgetLine, BudgetStore, Reservation, Spend};
use crate::stores::report_failure;
use crate::types::{Cost, ModelResponse, Price, Usage};

/// The reservations of one attempt; settled once, also when the attempt
/// is dropped (with what the run recorded meanwhile).
struct Holds {
    held: Vec<(Arc<dyn BudgetStore>, Reservation)>,
    ctx: RunContext,
    before: Usage,
    price: Option<Price>,
}

fn spend(price: Option<&Price>, usage: &Usage) -> Spend {
    Spend::new(
        price.map_or(Cost::ZERO, |p| p.cost(usage)),
        usage.total_tokens(),
    )
}

/// The usage the run recorded since `before`.
fn recorded_since(ctx: &RunContext, before: Usage) -> Usage {
    let now = ctx.usage();
    Usage {
        input_tokens: now.input_tokens.saturating_sub(before.input_tokens),
        output_tokens: now.output_tokens.saturating_sub(before.output_tokens),
        cached_input_tokens: now
            .cached_input_tokens
            .saturating_sub(before.cached_input_tokens),
        reasoning_tokens: now.reasoning_tokens.saturating_sub(before.reasoning_tokens),
    }
}

impl Holds {
    async fn settle(mut self, actual: Spend) {
        for (store, reservation) in std::mem::take(&mut self.held) {
            if let Err(err) = store.settle(reservation, actual).await {
                report_failure(&self.ctx, "budget", "settle", &err, true);
            }
        }
    }
}

impl Drop for Holds {
    fn drop(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let actual = spend(self.price.as_ref(), &recorded_since(&self.ctx, self.before));
        let held = std::mem::take(&mut self.held);
        let ctx = self.ctx.clone();
        let mut settle = Box::pin(async move {
            for (store, reservation) in held {
                if let Err(err) = store.settle(reservation, actual).await {
                    report_failure(&ctx, "budget", "settle", &err, true);
                }
            }
        });
        // A store that answers at once settles here; one that waits, on the
        // runtime.
        let waker = futures::task::noop_waker();
        if settle
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
        {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(settle);
            }
        }
    }
}

pub(super) async fn attempt<S>(
    config: Arc<Config>,
    groups: Vec<(Arc<dyn BudgetStore>, Vec<BudgetLine>)>,
    estimate: Spend,
    price: Option<Price>,
    mut inner: S,
    call: ModelCall,
) -> Result<ModelResponse, BoxError>
where
    S: Service<ModelCall, Response = ModelResponse>,
    S::Error: Into<BoxError>,
{
    let ctx = call.context.clone();
    let mut holds = Holds {
        held: Vec::with_capacity(groups.len()),
        before: ctx.usage(),
        ctx,
        price,
    };
    for (store, lines) in groups {
        match store.reserve(&lines, estimate).await {
            Ok(reservation) => holds.held.push((store, reservation)),
            Err(err) => {
                let refused = matches!(
                    err.downcast_ref::<AgentError>(),
                    Some(AgentError::BudgetExceeded(_))
                );
                if refused {
                    holds.settle(Spend::ZERO).await;
                    return Err(err);
                }
                report_failure(&holds.ctx, "budget", "reserve", &err, config.fail_open);
                if !config.fail_open {
                    holds.settle(Spend::ZERO).await;
                    return Err(err);
                }
            }
        }
    }
    let result = inner.call(call).await.map_err(Into::into);
    let usage = match &result {
        Ok(response) => response.usage,
        Err(_) => recorded_since(&holds.ctx, holds.before),
    };
    let price = match &result {
        Ok(response) if !response.model.is_empty() => config
            .prices
            .get(&response.model)
            .cloned()
            .or(holds.price.clone()),
        _ => holds.price.clone(),
    };
    holds.settle(spend(price.as_ref(), &usage)).await;
    result
}
