//! Shared fixtures of the benches: a 3-turn scripted model and a tool.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::future::{ready, Ready};
use std::sync::Arc;
use std::task::{Context, Poll};

use schemars::JsonSchema;
use serde::Deserialize;
use tower::Service;
use tower_agent::types::{Message, ModelRequest, ModelResponse, Role};
use tower_agent::{tool_sync, BoxError, ModelCall, ScriptedModel, ScriptedTurn, ToolRouter};

#[derive(Debug, Deserialize, JsonSchema)]
pub struct Lookup {
    pub id: u32,
}

/// model → tool → model → tool → model: two tool turns, then an answer.
pub fn three_turn_model() -> ScriptedModel {
    ScriptedModel::from_fn(|request: &ModelRequest| {
        let turns = request
            .messages
            .iter()
            .rev()
            .take_while(|m| m.role != Role::User)
            .filter(|m| m.role == Role::Assistant)
            .count();
        if turns < 2 {
            ScriptedTurn::tool_call("lookup", r#"{"id": 7}"#)
        } else {
            ScriptedTurn::text("done")
        }
    })
    .record(false)
}

pub fn lookup_tools() -> ToolRouter {
    ToolRouter::new().tool(tool_sync("lookup", "Looks up", |l: Lookup| {
        Ok::<_, BoxError>(l.id)
    }))
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The design's default model stack, outermost first: retry ▸ timeout ▸
/// fallback ▸ cache ▸ rate limit (ample) ▸ PII (when `pii`), around `model`.
pub fn default_stack(model: ScriptedModel, pii: bool) -> tower_agent::BoxModel {
    use std::time::Duration;
    use tower::ServiceBuilder;
    use tower_agent::layers::cache::CacheLayer;
    use tower_agent::layers::pii::MaskPiiLayer;
    use tower_agent::layers::rate_limit::ModelRateLimitLayer;
    use tower_agent::layers::retry::RetryPolicy;
    use tower_agent::layers::ServiceBuilderExt;
    use tower_agent::service::box_model;

    let limits = ModelRateLimitLayer::new()
        .requests(u64::MAX / 4, Duration::from_secs(1))
        .tokens(u64::MAX / 4, Duration::from_secs(1));
    let inner = if pii {
        box_model(MaskPiiLayer::default().layer_model(model))
    } else {
        box_model(model)
    };
    box_model(
        ServiceBuilder::new()
            .llm_retry(RetryPolicy::new())
            .call_timeout(Duration::from_secs(30))
            .fallback_models(["backup-model"])
            .response_cache(CacheLayer::new())
            .model_rate_limit(limits)
            .service(inner),
    )
}

/// `Layer::layer` without importing the trait at every call site.
pub trait LayerModel {
    fn layer_model(&self, model: ScriptedModel)
        -> tower_agent::layers::pii::MaskPii<ScriptedModel>;
}

impl LayerModel for tower_agent::layers::pii::MaskPiiLayer {
    fn layer_model(
        &self,
        model: ScriptedModel,
    ) -> tower_agent::layers::pii::MaskPii<ScriptedModel> {
        tower::Layer::layer(self, model)
    }
}

/// A model that answers at once with a prepared response. Like a real
/// provider client, it is cheap to clone (tower's retry clones it per call).
#[derive(Clone)]
pub struct Noop(Arc<ModelResponse>);

impl Service<ModelCall> for Noop {
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = Ready<Result<ModelResponse, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _call: ModelCall) -> Self::Future {
        let mut response = ModelResponse::clone(&self.0);
        response.usage_recorded = true;
        ready(Ok(response))
    }
}

/// The no-op model with its one answer, "shipped".
pub fn noop_model() -> Noop {
    Noop(Arc::new(ModelResponse::new(
        "bench-model",
        Message::assistant("shipped"),
    )))
}

/// A bench's `main`. With `BENCH_CASE` and `BENCH_RUNS` set, `count(case,
/// runs)` runs one case that many times and nothing else, for callgrind:
/// the difference of two run counts, divided by the difference of the runs,
/// is the instructions a run. Otherwise the criterion groups in `benches`.
pub fn main(count: impl FnOnce(&str, usize), benches: impl FnOnce()) {
    if let (Ok(case), Ok(runs)) = (std::env::var("BENCH_CASE"), std::env::var("BENCH_RUNS")) {
        count(&case, runs.parse().expect("BENCH_RUNS is a number"));
        return;
    }
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
