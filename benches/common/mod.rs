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

/// The cases named in `BENCH_INTERLEAVE` (comma-separated, the baseline
/// first), timed in turn, one batch of each a round, for `BENCH_ROUNDS`
/// rounds (default 30); `batch(case)` runs one batch and answers the time
/// of one run in it. Prints, per case, its fastest batch and its median,
/// and the median over the rounds of its difference to the baseline in the
/// same round. A busy machine slows the cases of a round alike and leaves
/// the fastest batches alone, where one criterion run after another reads
/// each case at a different load. `None` when the variable is not set.
pub fn interleave(mut batch: impl FnMut(&str) -> std::time::Duration) -> Option<()> {
    let names = std::env::var("BENCH_INTERLEAVE").ok()?;
    let names: Vec<&str> = names.split(',').map(str::trim).collect();
    let rounds: usize =
        std::env::var("BENCH_ROUNDS").map_or(30, |r| r.parse().expect("BENCH_ROUNDS is a number"));
    let mut times = vec![Vec::with_capacity(rounds); names.len()];
    for name in &names {
        // A warm-up batch of each, not counted.
        batch(name);
    }
    for _ in 0..rounds {
        for (at, name) in names.iter().enumerate() {
            times[at].push(batch(name).as_secs_f64() * 1e9);
        }
    }
    let median = |values: &[f64]| {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    };
    let fastest_base = times[0].iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "case: fastest batch / median, ns a run; over {} (fastest, median of paired rounds)",
        names[0]
    );
    for (at, name) in names.iter().enumerate() {
        let fastest = times[at].iter().copied().fold(f64::INFINITY, f64::min);
        let paired: Vec<f64> = times[at]
            .iter()
            .zip(&times[0])
            .map(|(t, b)| t - b)
            .collect();
        println!(
            "{name}: {fastest:.0} / {:.0}; +{:.0} ns, +{:.0} ns",
            median(&times[at]),
            fastest - fastest_base,
            median(&paired),
        );
    }
    Some(())
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
