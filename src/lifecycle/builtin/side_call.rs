//! The model calls built-ins make on their own behalf (a judge, a tool
//! selector, a summarizer, a memory extractor): their usage lands in the
//! run's ledger exactly once, attributed to the built-in.

use std::sync::Arc;

use tower::ServiceExt;

use crate::context::RunContext;
use crate::error::BoxError;
use crate::request::BoxModel;
use crate::request::ModelCall;
use crate::types::{ModelRequest, ModelResponse};

/// Calls `model` with `request` in `ctx`, and records the answer's usage
/// there unless the backend already did.
pub(crate) async fn call_recorded(
    model: &BoxModel,
    ctx: &RunContext,
    request: ModelRequest,
) -> Result<ModelResponse, BoxError> {
    let response = model
        .clone()
        .oneshot(ModelCall::new(request, ctx.clone()))
        .await?;
    if !response.usage_recorded {
        ctx.record_usage(&response.model, response.usage);
    }
    Ok(response)
}

/// Calls `model` on behalf of `name`: in a child of `ctx` that carries the
/// name, so the call's usage is in the run's total and in its entries under
/// that name, recorded once.
pub(crate) async fn call_as(
    model: &BoxModel,
    ctx: &RunContext,
    name: &Arc<str>,
    request: ModelRequest,
) -> Result<ModelResponse, BoxError> {
    let child = ctx.child();
    child.set_agent_name(name);
    call_recorded(model, &child, request).await
}
