//! `AgentError::Timeout` says which deadline fired and after how long: the
//! run's deadline (in the loop and in a layer), a layer's call timeout on the
//! model stack and on the tool stack, the provider's own timeout, and
//! tower's `TimeoutLayer`. Everything on the paused clock.

use std::time::Duration;

use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_agent::error::TimeoutSource;
use tower_agent::layers::timeout::CallTimeoutLayer;
use tower_agent::types::{Message, ModelRequest, ToolCall};
use tower_agent::{
    Agent, AgentError, BoxError, ErrorKind, ModelCall, ProviderError, RunContext, RunRequest,
    ScriptedModel, ScriptedTurn, ToolInvocation, ToolOutput,
};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn model_call(ctx: &RunContext) -> ModelCall {
    ModelCall::new(
        ModelRequest::new("m", vec![Message::user("hi")]),
        ctx.clone(),
    )
}

fn timer(err: &AgentError) -> (TimeoutSource, Option<Duration>) {
    match *err {
        AgentError::Timeout { timer, after } => (timer, after),
        ref other => panic!("not a timeout: {other:?}"),
    }
}

fn slow_model() -> ScriptedModel {
    ScriptedModel::new([ScriptedTurn::text("late").delay(secs(600))])
}

#[tokio::test(start_paused = true)]
async fn the_loop_names_the_runs_deadline_and_the_runs_age() {
    let agent = Agent::builder("a").model(slow_model()).build().unwrap();
    let ctx = RunContext::builder().timeout(secs(10)).build();
    let err = agent
        .oneshot(RunRequest::new("hi").context(ctx))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "TIMEOUT");
    assert_eq!(timer(&err), (TimeoutSource::RunDeadline, Some(secs(10))));
    assert_eq!(
        err.to_string(),
        "timed out: the run's deadline passed after 10s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_layer_whose_run_deadline_comes_first_names_the_run() {
    let ctx = RunContext::builder().timeout(secs(3)).build();
    tokio::time::advance(secs(1)).await;
    let err = CallTimeoutLayer::new(secs(5))
        .layer(slow_model())
        .oneshot(model_call(&ctx))
        .await
        .unwrap_err();
    let err = AgentError::classify(err);
    // The run had been going 3 s when its deadline passed.
    assert_eq!(timer(&err), (TimeoutSource::RunDeadline, Some(secs(3))));
}

#[tokio::test(start_paused = true)]
async fn a_layers_own_timeout_names_the_call_timeout() {
    let model = ServiceBuilder::new()
        .layer(CallTimeoutLayer::new(secs(30)))
        .service(slow_model());
    let agent = Agent::builder("a").model(model).build().unwrap();
    let ctx = RunContext::builder().timeout(secs(60)).build();
    let err = agent
        .oneshot(RunRequest::new("hi").context(ctx))
        .await
        .unwrap_err();
    assert_eq!(timer(&err), (TimeoutSource::CallTimeout, Some(secs(30))));
    assert_eq!(
        err.to_string(),
        "timed out: the call timeout fired after 30s"
    );
}

#[tokio::test(start_paused = true)]
async fn on_a_tool_stack_the_layer_names_the_tool_timeout() {
    let slow_tool = tower::service_fn(|_call: ToolInvocation| async {
        tokio::time::sleep(secs(600)).await;
        Ok::<_, BoxError>(ToolOutput::text("late"))
    });
    let invocation = ToolInvocation::new(ToolCall::new("c", "t", "{}"), RunContext::new());
    let err = CallTimeoutLayer::new(secs(2))
        .layer(slow_tool)
        .oneshot(invocation)
        .await
        .unwrap_err();
    let err = AgentError::classify(err);
    assert_eq!(timer(&err), (TimeoutSource::Tool, Some(secs(2))));
    assert_eq!(
        err.to_string(),
        "timed out: the tool call timeout fired after 2s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_providers_timeout_names_the_provider() {
    // A provider that says how long it allowed.
    let said: BoxError = Box::new(ProviderError::timed_out(
        "the request to the provider timed out",
        Some(secs(60)),
    ));
    let err = AgentError::classify(said);
    assert_eq!(timer(&err), (TimeoutSource::Provider, Some(secs(60))));
    assert_eq!(
        err.to_string(),
        "timed out: the provider's timeout fired after 60s"
    );
    assert_eq!(err.code(), "TIMEOUT");

    // One that does not, in a full run.
    let model = ScriptedModel::new([ScriptedTurn::error(ErrorKind::Timeout, "timed out")]);
    let agent = Agent::builder("a").model(model).build().unwrap();
    let err = agent.run("hi").await.unwrap_err();
    assert_eq!(timer(&err), (TimeoutSource::Provider, None));
    assert_eq!(err.to_string(), "timed out: the provider's timeout fired");
    assert_eq!(err.timeout_source(), Some((TimeoutSource::Provider, None)));
}

#[tokio::test(start_paused = true)]
async fn towers_own_timeout_names_tower() {
    let model = tower::timeout::TimeoutLayer::new(secs(5)).layer(slow_model());
    let err = model
        .oneshot(model_call(&RunContext::new()))
        .await
        .unwrap_err();
    let err = AgentError::classify(err);
    assert_eq!(timer(&err), (TimeoutSource::Tower, None));
    assert!(err.kind().is_retryable());
}

#[test]
fn other_errors_have_no_timeout_source() {
    assert_eq!(AgentError::Cancelled.timeout_source(), None);
    let unavailable = AgentError::from(ProviderError::unavailable("down"));
    assert_eq!(unavailable.timeout_source(), None);
    assert_eq!(unavailable.code(), "PROVIDER_UNAVAILABLE");
}
