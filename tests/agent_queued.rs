//! Messages queued into a running run through its `RunHandle`, end to end
//! on ScriptedModel and tokio's paused clock: where they join, the input
//! guard, late messages (continuation or unread), order, cancellation, and
//! the events and stream that report them.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use tokio::time::sleep;
use tower::Layer;
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::lifecycle::MiddlewareStack;
use tower_agent::types::{History, ModelDelta, Role};
use tower_agent::{
    tool_fn, tripwire, Agent, AgentError, AgentExt, BoxError, DeltaSink, LateMessages,
    LifecycleLayer, RunContext, RunRequest, ScriptedModel, ScriptedTurn, ToolRouter, Unsent,
};

#[derive(Deserialize, JsonSchema)]
struct Wait {
    ms: u64,
}

fn sleeper() -> ToolRouter {
    ToolRouter::new().tool(tool_fn("wait", "Waits", |w: Wait| async move {
        sleep(Duration::from_millis(w.ms)).await;
        Ok::<_, BoxError>("waited")
    }))
}

fn texts(messages: &History) -> Vec<String> {
    messages.iter().map(|m| m.text().into_owned()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_message_sent_during_a_tool_call_joins_after_its_result() {
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("wait", r#"{"ms": 100}"#),
        ScriptedTurn::text("done"),
    ]);
    let agent = Agent::builder("a")
        .model(model.clone())
        .tools(sleeper())
        .build()
        .unwrap();
    let sink = CollectingSink::new();
    let ctx = RunContext::builder().events(sink.clone()).build();
    let (deltas, mut rx) = DeltaSink::channel();
    let handle = agent.start(RunRequest::new("go").context(ctx).stream(deltas));
    let sender = handle.sender();
    let (finished, ()) = tokio::join!(handle, async move {
        sleep(Duration::from_millis(50)).await;
        sender.send("and also this").unwrap();
    });
    assert!(finished.unread.is_empty());
    let run = finished.result.unwrap();
    assert_eq!(run.output, "done");

    let second = &model.requests()[1].messages;
    assert_eq!(second.len(), 4);
    assert_eq!(second[1].tool_calls[0].name, "wait");
    assert_eq!(second[2].role, Role::Tool);
    assert_eq!(second[3].role, Role::User);
    assert_eq!(second[3].text(), "and also this");

    // Reported when taken in: after the tool call, before the next model call.
    let events = sink.events();
    let at = |f: &dyn Fn(&AgentEvent) -> bool| events.iter().position(f).unwrap();
    let queued =
        at(&|e| matches!(e, AgentEvent::QueuedMessage { text, .. } if text == "and also this"));
    let tool_done = at(&|e| matches!(e, AgentEvent::ToolCallCompleted { .. }));
    let second_call = events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e, AgentEvent::ModelCallStarted { .. }))
        .nth(1)
        .unwrap()
        .0;
    assert!(tool_done < queued && queued < second_call);
    let mut streamed = Vec::new();
    while let Ok(delta) = rx.try_recv() {
        streamed.push(delta);
    }
    assert!(streamed.contains(&ModelDelta::UserMessage {
        text: "and also this".into()
    }));
}

#[tokio::test(start_paused = true)]
async fn queued_messages_keep_their_order() {
    let model = ScriptedModel::new([ScriptedTurn::text("noted")]);
    let agent = Agent::builder("a").model(model.clone()).build().unwrap();
    let handle = agent.start(RunRequest::new("one"));
    for text in ["two", "three", "four"] {
        handle.send(text).unwrap();
    }
    let run = handle.await.into_result().unwrap();
    assert_eq!(
        texts(&model.requests()[0].messages),
        ["one", "two", "three", "four"]
    );
    assert_eq!(run.messages.len(), 5);
}

#[tokio::test(start_paused = true)]
async fn the_input_guard_sees_each_queued_message_and_a_tripwire_ends_the_run() {
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("wait", r#"{"ms": 100}"#),
        ScriptedTurn::text("never"),
    ]);
    let agent = Agent::builder("a")
        .model(model.clone())
        .tools(sleeper())
        .build()
        .unwrap();
    let guard = MiddlewareStack::new().before_run("refund-guard", |_, input| {
        if input.text().contains("refund") {
            return Err(tripwire("refunds go to a person").into());
        }
        Ok(())
    });
    // A layered agent starts the same way.
    let agent = LifecycleLayer::new(guard).layer(agent);
    let handle = agent.start(RunRequest::new("Where is my order?"));
    let sender = handle.sender();
    let (finished, ()) = tokio::join!(handle, async move {
        sleep(Duration::from_millis(50)).await;
        sender.send("Actually, I want a refund").unwrap();
    });
    let err = finished.result.unwrap_err();
    assert!(matches!(err, AgentError::Tripwire { .. }), "{err}");
    assert_eq!(model.requests().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_late_message_starts_a_continuation() {
    let model = ScriptedModel::new([
        ScriptedTurn::text("Booked for Monday.").delay(Duration::from_millis(100)),
        ScriptedTurn::text("Moved to Tuesday."),
    ]);
    let agent = Agent::builder("a").model(model.clone()).build().unwrap();
    let handle = agent.start(RunRequest::new("Book Monday"));
    let sender = handle.sender();
    let (finished, ()) = tokio::join!(handle, async move {
        sleep(Duration::from_millis(50)).await;
        sender.send("Make that Tuesday").unwrap();
    });
    assert!(finished.unread.is_empty());
    let run = finished.result.unwrap();
    assert_eq!(run.output, "Moved to Tuesday.");
    assert_eq!(
        texts(&model.requests()[1].messages),
        ["Book Monday", "Booked for Monday.", "Make that Tuesday"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_late_message_comes_back_unread_when_asked() {
    let model = ScriptedModel::new([
        ScriptedTurn::text("Booked for Monday.").delay(Duration::from_millis(100)),
        ScriptedTurn::text("never"),
    ]);
    let agent = Agent::builder("a").model(model.clone()).build().unwrap();
    let handle = agent
        .start(RunRequest::new("Book Monday"))
        .late_messages(LateMessages::Return);
    let sender = handle.sender();
    let (finished, ()) = tokio::join!(handle, async move {
        sleep(Duration::from_millis(50)).await;
        sender.send("Make that Tuesday").unwrap();
        sender.send("For two").unwrap();
    });
    let unread: Vec<_> = finished
        .unread
        .iter()
        .map(|m| m.text().into_owned())
        .collect();
    assert_eq!(unread, ["Make that Tuesday", "For two"]);
    assert_eq!(finished.result.unwrap().output, "Booked for Monday.");
    assert_eq!(model.requests().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_message_sent_after_the_end_comes_back() {
    let agent = Agent::builder("a")
        .model(ScriptedModel::new([ScriptedTurn::text("hi")]))
        .build()
        .unwrap();
    let handle = agent.start(RunRequest::new("hello"));
    let sender = handle.sender();
    let finished = handle.await;
    assert!(finished.result.is_ok());
    let Err(Unsent(message)) = sender.send("too late") else {
        panic!("the run had ended");
    };
    assert_eq!(message.text(), "too late");
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_run_returns_what_it_did_not_take_in() {
    let model = ScriptedModel::new([
        ScriptedTurn::text("slow").delay(Duration::from_secs(10)),
        ScriptedTurn::text("never"),
    ]);
    let agent = Agent::builder("a").model(model).build().unwrap();
    let handle = agent.start(RunRequest::new("hello"));
    let sender = handle.sender();
    let (finished, ()) = tokio::join!(handle, async move {
        sleep(Duration::from_millis(50)).await;
        sender.send("are you there?").unwrap();
        sender.cancel();
    });
    assert!(matches!(finished.result, Err(AgentError::Cancelled)));
    assert_eq!(finished.unread.len(), 1);
    assert_eq!(finished.unread[0].text(), "are you there?");
}

#[tokio::test(start_paused = true)]
async fn a_paused_run_returns_its_queued_messages() {
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("wait", r#"{"ms": 100}"#).delay(Duration::from_millis(100))
    ]);
    let defer = MiddlewareStack::new().before_tool("defer", |_, _| {
        Ok(tower_agent::hooks::ToolVerdict::decision(
            tower_agent::hooks::ToolDecision::Defer,
        ))
    });
    let agent = Agent::builder("a")
        .model(model)
        .tools(sleeper())
        .middleware(defer)
        .build()
        .unwrap();
    let handle = agent.start(RunRequest::new("hello"));
    let sender = handle.sender();
    let (finished, ()) = tokio::join!(handle, async move {
        sleep(Duration::from_millis(50)).await;
        sender.send("hurry").unwrap();
    });
    assert!(finished.result.unwrap().checkpoint().is_some());
    assert_eq!(finished.unread[0].text(), "hurry");
}
