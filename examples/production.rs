//! The production stack of the README, with the prelude: the model stack is
//! tower layers (retry ▸ timeout ▸ fallback ▸ cache ▸ rate limit ▸ PII
//! nearest the model), and a `LifecycleLayer` brackets the run with a
//! middleware that guards its input. The layered agent keeps `run`.
//!
//! ```sh
//! cargo run --example production
//! ```

use std::time::Duration;

use tower_agent::prelude::*;

/// An input guard: refunds go to a person.
struct RefundGuard;

impl Middleware for RefundGuard {
    fn name(&self) -> &str {
        "refund-guard"
    }

    fn hooks(&self) -> HookSet {
        HookSet::BEFORE_RUN
    }

    fn before_run<'a>(
        &'a self,
        _ctx: &'a RunContext,
        input: &'a mut Message,
        _messages: &'a [Message],
    ) -> Hook<'a, Option<String>> {
        if input.text().contains("refund") {
            return Hook::err(tripwire("refunds go to a person"));
        }
        Hook::ok(None)
    }
}

/// Builds the stack, runs it twice, and checks both answers.
#[tokio::main(flavor = "current_thread")]
pub(crate) async fn main() -> Result<(), AgentError> {
    let limits = ModelRateLimitLayer::builder()
        .requests(500, Duration::from_secs(60))
        .tokens(200_000, Duration::from_secs(60))
        .build()?;
    let model = ServiceBuilder::new()
        .llm_retry(RetryPolicy::new())
        .call_timeout(Duration::from_secs(60))
        .fallback_models(["backup-model"])
        .response_cache(CacheLayer::new())
        .model_rate_limit(limits)
        .mask_pii(MaskPiiLayer::default())
        .service(ScriptedModel::new([ScriptedTurn::text(
            "I have written to <EMAIL_1>.",
        )]));

    let agent = Agent::builder("support")
        .model(model)
        .model_name("main-model")
        .build()?;
    let agent = LifecycleLayer::new(MiddlewareStack::new().push(RefundGuard)).layer(agent);

    let run = agent.run("Mail ann@example.com").await?;
    assert_eq!(run.output, "I have written to ann@example.com.");
    println!("{}", run.output);

    let err = agent.run("I want a refund").await.unwrap_err();
    assert_eq!(err.code(), "GUARDRAIL_TRIPPED");
    println!("{err}");
    Ok(())
}
