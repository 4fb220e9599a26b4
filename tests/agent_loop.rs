//! The run loop end to end on ScriptedModel: turns, stop, cancellation,
//! deadlines, max_turns and structured output.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tower::ServiceExt;
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::types::{ModelRequest, Role, RunStatus, ToolCall};
use tower_agent::{
    tool_fn, tool_fn_ctx, Agent, AgentError, BoxError, ErrorKind, ModelCall, RunContext,
    RunRequest, ScriptedModel, ScriptedTurn, ToolRouter, Usage,
};

#[derive(Deserialize, JsonSchema)]
struct Wait {
    ms: u64,
    tag: String,
}

fn sleeper() -> ToolRouter {
    ToolRouter::new().tool(tool_fn(
        "wait",
        "Waits, then echoes",
        |w: Wait| async move {
            tokio::time::sleep(Duration::from_millis(w.ms)).await;
            Ok::<_, BoxError>(w.tag)
        },
    ))
}

#[tokio::test(start_paused = true)]
async fn parallel_tool_calls_run_concurrently_and_answer_in_call_order() {
    let model = ScriptedModel::new([
        ScriptedTurn::tool_calls([
            ToolCall::new("a", "wait", r#"{"ms": 300, "tag": "slow"}"#),
            ToolCall::new("b", "wait", r#"{"ms": 100, "tag": "fast"}"#),
            ToolCall::new("c", "wait", r#"{"ms": 200, "tag": "middle"}"#),
        ]),
        ScriptedTurn::tool_call("wait", r#"{"ms": 10, "tag": "again"}"#),
        ScriptedTurn::text("done"),
    ]);
    let agent = Agent::builder("a")
        .model(model.clone())
        .tools(sleeper())
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let run = agent.run("go").await.unwrap();
    // Concurrent: the first turn takes as long as its slowest call.
    assert_eq!(started.elapsed(), Duration::from_millis(310));
    let tool_messages: Vec<_> = run
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| (m.tool_call_id.clone().unwrap(), m.text().into_owned()))
        .collect();
    assert_eq!(
        tool_messages[..3],
        [
            ("a".to_owned(), "slow".to_owned()),
            ("b".to_owned(), "fast".to_owned()),
            ("c".to_owned(), "middle".to_owned())
        ]
    );
    assert_eq!(run.output, "done");
    assert_eq!(run.counters.turns, 3);
    assert_eq!(run.counters.model_calls, 3);
    assert_eq!(run.counters.tool_calls, 4);
    assert!(run.is_completed());
    // The model saw the results of turn 1 in turn 2, in call order.
    let second = &model.requests()[1];
    let ids: Vec<_> = second
        .messages
        .iter()
        .filter_map(|m| m.tool_call_id.as_deref())
        .collect();
    assert_eq!(ids, ["a", "b", "c"]);
}

#[tokio::test(start_paused = true)]
async fn sequential_tool_calls_when_parallel_is_off() {
    let model = ScriptedModel::new([
        ScriptedTurn::tool_calls([
            ToolCall::new("a", "wait", r#"{"ms": 300, "tag": "x"}"#),
            ToolCall::new("b", "wait", r#"{"ms": 100, "tag": "y"}"#),
        ]),
        ScriptedTurn::text("done"),
    ]);
    let agent = Agent::builder("a")
        .model(model)
        .tools(sleeper())
        .parallel_tool_calls(false)
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    agent.run("go").await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(400));
}

#[tokio::test]
async fn max_turns_fails_with_the_partial_transcript() {
    let model =
        ScriptedModel::from_fn(|_| ScriptedTurn::tool_call("wait", r#"{"ms": 0, "tag": "t"}"#));
    let agent = Agent::builder("looper")
        .model(model)
        .tools(sleeper())
        .max_turns(3)
        .build()
        .unwrap();
    let err = agent.run("loop forever").await.unwrap_err();
    assert_eq!(err.code(), "MAX_TURNS");
    let AgentError::MaxTurns { limit, partial } = err else {
        panic!("expected MaxTurns")
    };
    assert_eq!(limit, 3);
    assert_eq!(partial.counters.turns, 3);
    assert_eq!(partial.counters.tool_calls, 3);
    // user + 3 × (assistant + tool)
    assert_eq!(partial.messages.len(), 7);
    assert_eq!(partial.messages[0].text(), "loop forever");
    assert!(partial.usage.input_tokens > 0);
}

#[tokio::test]
async fn a_tool_can_stop_the_run_before_the_next_model_call() {
    #[derive(Deserialize, JsonSchema)]
    struct Why {
        reason: String,
    }
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("escalate", r#"{"reason": "needs a human"}"#),
        ScriptedTurn::text("never asked"),
    ]);
    let tools = ToolRouter::new().tool(tool_fn_ctx(
        "escalate",
        "Hands over to a person",
        |why: Why, ctx: RunContext| async move {
            ctx.stop(why.reason);
            Ok::<_, BoxError>("handed over")
        },
    ));
    let agent = Agent::builder("a")
        .model(model.clone())
        .tools(tools)
        .build()
        .unwrap();
    let run = agent.run("help").await.unwrap();
    let RunStatus::Stopped(stop) = &run.status else {
        panic!("expected a stopped run, got {:?}", run.status)
    };
    assert_eq!(stop.reason, "needs a human");
    assert_eq!(stop.by.as_deref(), Some("tool:escalate"));
    assert_eq!(model.remaining(), 1, "no model call after the stop");
    assert_eq!(run.messages.last().unwrap().text(), "handed over");
}

#[tokio::test(start_paused = true)]
async fn cancellation_during_a_model_call_ends_the_run() {
    let model = ScriptedModel::new([ScriptedTurn::text("late").delay(Duration::from_secs(60))]);
    let agent = Agent::builder("a").model(model).build().unwrap();
    let ctx = RunContext::new();
    let canceller = ctx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        canceller.cancel();
    });
    let started = tokio::time::Instant::now();
    let err = agent
        .oneshot(RunRequest::new("hi").context(ctx))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert_eq!(started.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn cancellation_during_a_tool_call_cancels_the_nested_run_too() {
    // The child agent's model takes a minute; its tool-call parent is
    // cancelled after a second, and the child must see its token fire.
    let child_ctx = std::sync::Arc::new(std::sync::Mutex::new(None::<RunContext>));
    let seen = child_ctx.clone();
    let child_model =
        ScriptedModel::from_fn(|_| ScriptedTurn::text("slow").delay(Duration::from_secs(60)));
    let spy = tower::service_fn(move |call: ModelCall| {
        *seen.lock().unwrap() = Some(call.context.clone());
        child_model.clone().oneshot(call)
    });
    let child = Agent::builder("child").model(spy).build().unwrap();
    let tools = ToolRouter::new().tool(tower_agent::AgentTool::new("child", "A child", child));
    let parent = Agent::builder("parent")
        .model(ScriptedModel::new([ScriptedTurn::tool_call(
            "child",
            r#"{"input": "work"}"#,
        )]))
        .tools(tools)
        .build()
        .unwrap();
    let ctx = RunContext::new();
    let canceller = ctx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        canceller.cancel();
    });
    let err = parent
        .oneshot(RunRequest::new("go").context(ctx.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "CANCELLED");
    let child_ctx = child_ctx.lock().unwrap().clone().expect("the child ran");
    assert!(child_ctx.is_cancelled());
    assert_eq!(child_ctx.parent_run_id(), Some(ctx.run_id()));
}

#[tokio::test(start_paused = true)]
async fn the_run_deadline_fails_with_timeout() {
    let model = ScriptedModel::new([ScriptedTurn::text("late").delay(Duration::from_secs(10))]);
    let agent = Agent::builder("a").model(model).build().unwrap();
    let ctx = RunContext::builder()
        .timeout(Duration::from_secs(2))
        .build();
    let err = agent
        .oneshot(RunRequest::new("hi").context(ctx))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "TIMEOUT");
}

#[derive(Deserialize, JsonSchema, Debug, PartialEq)]
struct Verdict {
    label: String,
    score: u8,
}

#[tokio::test]
async fn structured_output_is_parsed_and_validated() {
    let model = ScriptedModel::new([ScriptedTurn::text(r#"{"label": "spam", "score": 9}"#)]);
    let agent = Agent::builder("classifier")
        .model(model.clone())
        .output_type::<Verdict>()
        .build()
        .unwrap();
    let run = agent.run("classify this").await.unwrap();
    let verdict: Verdict = serde_json::from_value(run.structured.unwrap()).unwrap();
    assert_eq!(
        verdict,
        Verdict {
            label: "spam".into(),
            score: 9
        }
    );
    // The provider was asked for the schema.
    let format = model.requests()[0]
        .settings
        .response_format
        .clone()
        .unwrap();
    let format = serde_json::to_value(format).unwrap();
    assert_eq!(format["type"], "json_schema");
    assert_eq!(
        format["json_schema"]["schema"]["required"],
        json!(["label", "score"])
    );
}

#[tokio::test]
async fn a_mismatch_goes_back_to_the_model_then_fails_typed() {
    let model = ScriptedModel::new([
        ScriptedTurn::text(r#"{"label": "spam"}"#),
        ScriptedTurn::text(r#"{"label": "spam", "score": 9}"#),
    ]);
    let agent = Agent::builder("classifier")
        .model(model.clone())
        .output_type::<Verdict>()
        .build()
        .unwrap();
    let run = agent.run("classify").await.unwrap();
    assert!(run.structured.is_some());
    let retry_prompt = model.requests()[1]
        .messages
        .last()
        .unwrap()
        .text()
        .into_owned();
    assert!(retry_prompt.contains("score"), "{retry_prompt}");

    let model = ScriptedModel::from_fn(|_| ScriptedTurn::text("not json at all"));
    let agent = Agent::builder("classifier")
        .model(model)
        .output_type::<Verdict>()
        .output_retries(2)
        .build()
        .unwrap();
    let err = agent.run("classify").await.unwrap_err();
    let AgentError::StructuredOutput { attempts, raw, .. } = &err else {
        panic!("expected StructuredOutput, got {err:?}")
    };
    assert_eq!((*attempts, raw.as_str()), (3, "not json at all"));
    assert_eq!(err.code(), "STRUCTURED_OUTPUT");
}

#[tokio::test]
async fn provider_errors_fail_the_run_classified() {
    let model = ScriptedModel::new([ScriptedTurn::rate_limited(Duration::from_secs(7))]);
    let agent = Agent::builder("a").model(model).build().unwrap();
    let err = agent.run("hi").await.unwrap_err();
    assert_eq!(err.code(), "RATE_LIMITED");
    assert_eq!(
        tower_agent::error::retry_after(&err),
        Some(Duration::from_secs(7))
    );
}

#[tokio::test]
async fn add_context_reaches_the_next_model_call_and_the_transcript() {
    #[derive(Deserialize, JsonSchema)]
    struct Empty {}
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("note", "{}"),
        ScriptedTurn::text("ok"),
    ]);
    let tools = ToolRouter::new().tool(tool_fn_ctx(
        "note",
        "Notes",
        |_: Empty, ctx: RunContext| async move {
            ctx.add_context("The user is on the premium plan.");
            Ok::<_, BoxError>("noted")
        },
    ));
    let agent = Agent::builder("a")
        .model(model.clone())
        .tools(tools)
        .build()
        .unwrap();
    let run = agent.run("hi").await.unwrap();
    let second: &ModelRequest = &model.requests()[1];
    let last = second.messages.last().unwrap();
    assert_eq!(
        (last.role, last.text().as_ref()),
        (Role::System, "The user is on the premium plan.")
    );
    assert!(run
        .messages
        .iter()
        .any(|m| m.text() == "The user is on the premium plan."));
}

#[tokio::test]
async fn events_bracket_the_run_and_every_call() {
    let sink = CollectingSink::new();
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("wait", r#"{"ms": 0, "tag": "t"}"#),
        ScriptedTurn::text("ok"),
    ]);
    let agent = Agent::builder("a")
        .model(model)
        .tools(sleeper())
        .build()
        .unwrap();
    let ctx = RunContext::builder().events(sink.clone()).build();
    agent
        .oneshot(RunRequest::new("hi").context(ctx))
        .await
        .unwrap();
    let names: Vec<&str> = sink
        .events()
        .iter()
        .map(|e| match e {
            AgentEvent::RunStarted { .. } => "run+",
            AgentEvent::RunCompleted { .. } => "run-",
            AgentEvent::ModelCallStarted { .. } => "model+",
            AgentEvent::ModelCallCompleted { .. } => "model-",
            AgentEvent::ToolCallStarted { .. } => "tool+",
            AgentEvent::ToolCallCompleted { .. } => "tool-",
            _ => "other",
        })
        .collect();
    assert_eq!(
        names,
        ["run+", "model+", "model-", "tool+", "tool-", "model+", "model-", "run-"]
    );
    let usage = sink.events().iter().find_map(|e| match e {
        AgentEvent::RunCompleted { usage, status, .. } => Some((*usage, *status)),
        _ => None,
    });
    assert!(matches!(usage, Some((u, "completed")) if u != Usage::default()));
}

#[tokio::test]
async fn a_thread_continues_from_the_previous_transcript() {
    let model = ScriptedModel::new([ScriptedTurn::text("first"), ScriptedTurn::text("second")]);
    let agent = Agent::builder("a")
        .instructions("Be brief.")
        .model(model.clone())
        .build()
        .unwrap();
    let first = agent.run("one").await.unwrap();
    assert_eq!(first.messages.len(), 3);
    let history = first.messages;
    let second = agent
        .clone()
        .oneshot(RunRequest::new("two").history(history))
        .await
        .unwrap();
    let roles: Vec<Role> = second.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            Role::System,
            Role::User,
            Role::Assistant,
            Role::User,
            Role::Assistant
        ],
        "the system prompt is not repeated"
    );
    assert_eq!(second.messages[1].text(), "one");
    assert_eq!(second.output, "second");
}

#[test]
fn a_zero_latency_model_sets_no_timer() {
    // A runtime without a timer: any sleep, even of zero, would panic.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::text("ok").delay(Duration::ZERO))
        .latency(Duration::ZERO);
    let agent = Agent::builder("a").model(model).build().unwrap();
    runtime.block_on(async {
        for _ in 0..3 {
            assert_eq!(agent.run("hi").await.unwrap().output, "ok");
        }
    });
}
