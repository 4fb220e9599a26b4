//! Model and tool calls with nothing of the hooks around them (a closure
//! middleware's, or a middleware that overrides no wrap hook) are made as a
//! run without hooks makes them: the hooks before and after them still run
//! every time, `after_model` reads and changes the answer before it joins
//! the conversation, verdicts still hold, a tool's panic is still its error
//! result, and events still balance.

mod lifecycle_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use lifecycle_support::{lookup_tools, observed, run_with};
use tower_agent::event::AgentEvent;
use tower_agent::hooks::ToolVerdict;
use tower_agent::lifecycle::{Hook, Middleware, MiddlewareStack};
use tower_agent::types::{History, Role, ToolCall};
use tower_agent::{
    tool_sync, Agent, AgentRun, BoxError, RunContext, RunRequest, ScriptedModel, ScriptedTurn,
    ToolRouter,
};

/// Two tool steps, then an answer: each run asks the model three times.
fn three_turns() -> ScriptedModel {
    ScriptedModel::from_fn(|request| {
        let answered = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .count();
        match answered {
            0 => ScriptedTurn::tool_calls([
                ToolCall::new("a", "lookup", r#"{"id": "7"}"#),
                ToolCall::new("b", "lookup", r#"{"id": "secret"}"#),
            ]),
            2 => ScriptedTurn::tool_call("lookup", r#"{"id": "8"}"#),
            _ => ScriptedTurn::text("done"),
        }
    })
}

fn agent(model: ScriptedModel, tools: ToolRouter) -> Agent {
    Agent::builder("bare")
        .model(model)
        .tools(tools)
        .build()
        .unwrap()
}

/// The text of the tool result for call `id` the model read last.
fn tool_result(model: &ScriptedModel, id: &str) -> String {
    let requests = model.requests();
    let last = requests.last().expect("the model was called");
    last.messages
        .iter()
        .find(|m| m.role == Role::Tool && m.tool_call_id.as_deref() == Some(id))
        .map(|m| m.text().into_owned())
        .unwrap_or_else(|| panic!("no result for {id}"))
}

/// One run of `model` with `tools` under `stack`, and its events.
async fn observed_run(
    model: &ScriptedModel,
    tools: ToolRouter,
    stack: &MiddlewareStack,
) -> (AgentRun, Vec<AgentEvent>) {
    let (ctx, sink) = observed();
    let done = run_with(
        agent(model.clone(), tools),
        stack.clone(),
        RunRequest::new("go").context(ctx),
    )
    .await
    .unwrap();
    (done, sink.events())
}

/// Model and tool calls started as often as they completed.
fn calls_balance(events: &[AgentEvent]) -> (usize, usize) {
    let count = |f: fn(&AgentEvent) -> bool| events.iter().filter(|e| f(e)).count();
    let models = count(|e| matches!(e, AgentEvent::ModelCallStarted { .. }));
    let tools = count(|e| matches!(e, AgentEvent::ToolCallStarted { .. }));
    assert_eq!(
        models,
        count(|e| matches!(e, AgentEvent::ModelCallCompleted { .. }))
    );
    assert_eq!(
        tools,
        count(|e| matches!(e, AgentEvent::ToolCallCompleted { .. }))
    );
    (models, tools)
}

#[tokio::test]
async fn closure_hooks_run_around_calls_made_without_a_frame() {
    let turns = Arc::new(AtomicUsize::new(0));
    let counted = turns.clone();
    let stack = MiddlewareStack::new()
        .before_model("count", move |_ctx: &RunContext, _: &mut History| {
            counted.fetch_add(1, Ordering::Relaxed);
            Ok::<_, BoxError>(())
        })
        .before_tool("no-secrets", |_ctx: &RunContext, call: &ToolCall| {
            Ok::<_, BoxError>(if call.arguments.contains("secret") {
                ToolVerdict::deny("secret ids are not looked up")
            } else {
                ToolVerdict::proceed()
            })
        })
        .after_tool("mark", |_ctx, _call, output| {
            output.content.push_str(" (seen)");
            Ok::<_, BoxError>(())
        });
    let model = three_turns();
    for run in 1..=2 {
        let (done, events) = observed_run(&model, lookup_tools(), &stack).await;
        assert_eq!(done.output, "done");
        assert_eq!(
            turns.load(Ordering::Relaxed),
            3 * run,
            "before_model every turn"
        );
        assert_eq!(tool_result(&model, "a"), "found 7 (seen)");
        assert!(
            tool_result(&model, "b").contains("secret ids are not looked up"),
            "{}",
            tool_result(&model, "b")
        );
        // The denied call never started.
        assert_eq!(calls_balance(&events), (3, 2));
    }
}

/// Overrides `before_model` only: from its first run on the stack knows
/// its `after_model` and wrap hooks are absent.
struct CountTurns(Arc<AtomicUsize>);

impl Middleware for CountTurns {
    fn name(&self) -> &str {
        "count-turns"
    }

    fn before_model<'a>(&'a self, _: &'a RunContext, _: &'a mut History) -> Hook<'a, ()> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Hook::ok(())
    }
}

#[tokio::test]
async fn a_middleware_seen_without_after_model_keeps_every_turn_and_its_answers() {
    let turns = Arc::new(AtomicUsize::new(0));
    let stack = MiddlewareStack::new().push(CountTurns(turns.clone()));
    let model = three_turns();
    for run in 1..=3 {
        let (done, events) = observed_run(&model, lookup_tools(), &stack).await;
        assert_eq!(done.output, "done");
        assert_eq!(turns.load(Ordering::Relaxed), 3 * run);
        // The answers are in the conversation, each once, in order.
        let roles: Vec<Role> = done.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Tool,
                Role::Assistant,
                Role::Tool,
                Role::Assistant
            ]
        );
        assert_eq!(done.usage, done.usage_total);
        assert_eq!(calls_balance(&events), (3, 3));
    }
}

#[tokio::test]
async fn a_tool_panic_without_a_frame_is_the_models_error_result() {
    let tools = ToolRouter::new().tool(tool_sync(
        "lookup",
        "Panics",
        |_: lifecycle_support::Lookup| -> Result<String, BoxError> { panic!("index out of range") },
    ));
    let stack = MiddlewareStack::new().before_model("noop", |_, _| Ok::<_, BoxError>(()));
    let model = three_turns();
    let (done, events) = observed_run(&model, tools, &stack).await;
    assert_eq!(done.output, "done");
    let result = tool_result(&model, "a");
    assert!(result.contains("failed"), "{result}");
    assert!(!result.contains("index out of range"), "{result}");
    assert_eq!(calls_balance(&events), (3, 3));
}

/// The events of the model calls and of the `after_model` hooks, by name.
fn model_call_events(events: &[AgentEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match event {
            AgentEvent::ModelCallStarted { .. } => Some("started".to_owned()),
            AgentEvent::ModelCallCompleted { error, .. } => {
                Some(format!("completed {}", error.unwrap_or("ok")))
            }
            AgentEvent::MiddlewareCompleted { hook, outcome, .. } if *hook == "after_model" => {
                Some(format!("after_model {outcome}"))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn after_model_reads_and_changes_each_answer_before_it_joins_the_conversation() {
    let stack = MiddlewareStack::new().after_model("sign", |_ctx, response| {
        if response.message.tool_calls.is_empty() {
            let text = format!("{} (checked)", response.message.text());
            response.message = tower_agent::types::Message::assistant(text);
        }
        Ok::<_, BoxError>(())
    });
    let model = three_turns();
    for _ in 0..2 {
        let (done, events) = observed_run(&model, lookup_tools(), &stack).await;
        assert_eq!(done.output, "done (checked)");
        assert_eq!(
            done.messages.last().map(|m| m.text().into_owned()),
            Some("done (checked)".to_owned())
        );
        assert_eq!(done.usage, done.usage_total);
        // The hook runs inside each call's bracket, before it completes.
        let turn = ["started", "after_model ok", "completed ok"];
        assert_eq!(model_call_events(&events), turn.repeat(3));
        assert_eq!(calls_balance(&events), (3, 3));
    }
}

#[tokio::test]
async fn an_after_model_that_fails_fails_the_call_and_the_run() {
    let seen = Arc::new(AtomicUsize::new(0));
    let counted = seen.clone();
    let stack = MiddlewareStack::new().after_model("reject", move |_ctx, _response| {
        if counted.fetch_add(1, Ordering::Relaxed) == 1 {
            return Err::<(), BoxError>("the answer leaks a secret".into());
        }
        Ok(())
    });
    let (ctx, sink) = observed();
    let err = run_with(
        agent(three_turns(), lookup_tools()),
        stack,
        RunRequest::new("go").context(ctx),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "MIDDLEWARE_FAILED");
    assert!(
        err.to_string().contains("the answer leaks a secret"),
        "{err}"
    );
    let events = sink.events();
    assert_eq!(
        model_call_events(&events),
        [
            "started",
            "after_model ok",
            "completed ok",
            "started",
            "after_model error",
            "completed MIDDLEWARE_FAILED"
        ]
    );
    // The rejected answer never joined the conversation: the second turn's
    // tool calls were not made.
    let tools_started = events
        .iter()
        .filter(|e| matches!(e, AgentEvent::ToolCallStarted { .. }))
        .count();
    assert_eq!(tools_started, 2);
}
