//! The production stack of the README, with the prelude: the model stack is
//! tower layers (retry ▸ timeout ▸ fallback ▸ cache ▸ rate limit ▸ PII
//! nearest the model), and the agent's own middleware guards its input.
//!
//! ```sh
//! cargo run --example production
//! ```

use std::time::Duration;

use tower_agent::prelude::*;

/// Builds the stack, runs it twice, and checks both answers.
#[tokio::main(flavor = "current_thread")]
pub(crate) async fn main() -> Result<(), AgentError> {
    let limits = ModelRateLimitLayer::new()
        .requests(500, Duration::from_secs(60))
        .tokens(200_000, Duration::from_secs(60));
    let model = ServiceBuilder::new()
        .llm_retry(LlmRetryLayer::new())
        .call_timeout(Duration::from_secs(60))
        .fallback_models(["backup-model"])
        .response_cache(CacheLayer::new())
        .model_rate_limit(limits)
        .mask_pii(MaskPiiLayer::default())
        .service(ScriptedModel::new([ScriptedTurn::text(
            "I have written to <EMAIL_1>.",
        )]));

    // An input guard: refunds go to a person.
    let guard = MiddlewareStack::new().before_run("refund-guard", |_ctx, input| {
        if input.text().contains("refund") {
            return Err(tripwire("refunds go to a person").into());
        }
        Ok(())
    });

    let agent = Agent::builder("support")
        .model(model)
        .model_name("main-model")
        .middleware(guard)
        .build()?;

    let run = agent.run("Mail ann@example.com").await?;
    assert_eq!(run.output, "I have written to ann@example.com.");
    println!("{}", run.output);

    let err = agent.run("I want a refund").await.unwrap_err();
    assert_eq!(err.code(), "GUARDRAIL_TRIPPED");
    println!("{err}");
    Ok(())
}
