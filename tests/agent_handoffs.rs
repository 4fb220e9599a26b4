//! Handoffs end to end on ScriptedModel: the run goes on as the target
//! agent (prompt, model, tools, its own middleware), `before_model_switch`
//! may refuse, the input filter, typed reasons, events, and a paused run
//! that resumes as the agent it was handed to.

use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tower::{Layer, ServiceExt};
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::hooks::{RunOutcome, RunStart};
use tower_agent::lifecycle::{Hook, Middleware, MiddlewareStack, RunRequestExt, Runtime};
use tower_agent::types::{ApprovalDecision, History, Message, Role, ToolCall};
use tower_agent::{
    tool_fn_ctx, tool_sync, Agent, AgentError, BoxError, Handoff, RunContext, RunRequest,
    ScriptedModel, ScriptedTurn, ToolDef,
};

type Log = Arc<Mutex<Vec<String>>>;

/// Notes its hooks, with the agent the run is at.
#[derive(Clone)]
struct Trace {
    name: &'static str,
    log: Log,
    /// What `before_model_switch` answers.
    allow_switch: bool,
}

impl Trace {
    fn note(&self, ctx: &RunContext, what: &str) {
        let agent = ctx.agent_name().map(|a| a.to_string()).unwrap_or_default();
        self.log
            .lock()
            .unwrap()
            .push(format!("{} {what} @{agent}", self.name));
    }
}

impl Middleware for Trace {
    fn name(&self) -> &str {
        self.name
    }

    fn before_agent<'a>(&'a self, ctx: &'a RunContext, _: RunStart) -> Hook<'a, Option<String>> {
        self.note(ctx, "before_agent");
        Hook::ok(None)
    }

    fn before_model<'a>(&'a self, ctx: &'a RunContext, _: &'a mut History) -> Hook<'a, ()> {
        self.note(ctx, "before_model");
        Hook::ok(())
    }

    fn before_model_switch<'a>(
        &'a self,
        ctx: &'a RunContext,
        from: &'a str,
        to: &'a str,
    ) -> Hook<'a, bool> {
        self.note(ctx, &format!("switch {from}->{to}"));
        Hook::ok(self.allow_switch)
    }

    fn after_agent<'a>(&'a self, ctx: &'a RunContext, _: RunOutcome<'a>) -> Hook<'a, ()> {
        self.note(ctx, "after_agent");
        Hook::ok(())
    }
}

fn trace(name: &'static str, log: &Log) -> MiddlewareStack {
    MiddlewareStack::new().push(Trace {
        name,
        log: log.clone(),
        allow_switch: true,
    })
}

fn texts(messages: &History) -> Vec<String> {
    messages.iter().map(|m| m.text().into_owned()).collect()
}

fn tool_names(specs: &[tower_agent::types::ToolSpec]) -> Vec<&str> {
    specs.iter().map(|s| s.name.as_str()).collect()
}

#[derive(Deserialize, JsonSchema)]
struct Invoice {
    id: u32,
}

fn billing(model: ScriptedModel) -> tower_agent::AgentBuilder {
    Agent::builder("billing")
        .instructions("You sort out invoices.")
        .model(model)
        .model_name("model-b")
        .tool(tool_fn_ctx(
            "invoice",
            "Looks an invoice up",
            |i: Invoice, ctx: RunContext| async move {
                let agent = ctx.agent_name().map(|a| a.to_string()).unwrap_or_default();
                Ok::<_, BoxError>(format!("invoice {} (asked by {agent})", i.id))
            },
        ))
}

fn triage(model: ScriptedModel, to: Handoff) -> tower_agent::AgentBuilder {
    Agent::builder("triage")
        .instructions("You send each customer to the right desk.")
        .model(model)
        .model_name("model-a")
        .tool(tool_sync("faq", "Answers FAQs", |_: serde_json::Value| {
            Ok::<_, BoxError>("see the FAQ")
        }))
        .handoff(to)
}

#[tokio::test]
async fn the_run_goes_on_as_the_target_agent() {
    let b_model = ScriptedModel::new([
        ScriptedTurn::tool_call("invoice", r#"{"id": 7}"#),
        ScriptedTurn::text("Invoice 7 is paid."),
    ]);
    let billing = billing(b_model.clone()).build().unwrap();
    let a_model = ScriptedModel::new([ScriptedTurn::tool_call(
        "transfer_to_billing",
        r#"{"reason": "an invoice question"}"#,
    )]);
    let triage = triage(
        a_model.clone(),
        Handoff::to(&billing).description("Invoices and payments"),
    )
    .build()
    .unwrap();
    assert_eq!(
        tool_names(triage.tool_specs()),
        ["faq", "transfer_to_billing"]
    );
    assert!(triage.tool_specs()[1]
        .description
        .contains("Invoices and payments"));

    let sink = CollectingSink::new();
    let ctx = RunContext::builder().events(sink.clone()).build();
    let run = triage
        .run_with(RunRequest::new("Is invoice 7 paid?").context(ctx.clone()))
        .await
        .unwrap();

    assert_eq!(run.agent.as_ref(), "billing");
    assert_eq!(run.output, "Invoice 7 is paid.");
    assert_eq!(ctx.agent_name().as_deref(), Some("billing"));
    // The handoff is not a tool call; billing's invoice lookup is.
    assert_eq!(run.counters.tool_calls, 1);
    assert_eq!(run.counters.turns, 3);

    // Billing's model saw billing's prompt and tools, and the transcript.
    let seen = b_model.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].model.as_str(), "model-b");
    assert_eq!(tool_names(&seen[0].tools), ["invoice"]);
    let first = &seen[0].messages;
    assert_eq!(first[0].role, Role::System);
    assert_eq!(first[0].text(), "You sort out invoices.");
    assert_eq!(first[1].text(), "Is invoice 7 paid?");
    assert_eq!(first[2].tool_calls[0].name, "transfer_to_billing");
    assert_eq!(first[3].role, Role::Tool);
    assert!(first[3].text().contains("Transferred to `billing`"));
    assert_eq!(first.len(), 4);
    assert!(texts(&run.messages)[5].contains("asked by billing"));
    assert_eq!(a_model.requests().len(), 1);
    assert_eq!(a_model.requests()[0].model.as_str(), "model-a");

    let handoffs: Vec<_> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::Handoff {
                from, to, reason, ..
            } => Some((from.to_string(), to.to_string(), reason)),
            _ => None,
        })
        .collect();
    assert_eq!(
        handoffs,
        [(
            "triage".to_string(),
            "billing".to_string(),
            Some(json!({"reason": "an invoice question"}))
        )]
    );
}

#[tokio::test]
async fn the_targets_middleware_replaces_the_first_agents_and_the_bracket_stays() {
    let log: Log = Arc::default();
    let billing = billing(ScriptedModel::new([ScriptedTurn::text("Paid.")]))
        .middleware(trace("billing-mw", &log))
        .build()
        .unwrap();
    let triage = triage(
        ScriptedModel::new([ScriptedTurn::tool_call("transfer_to_billing", "{}")]),
        Handoff::to(&billing),
    )
    .middleware(trace("triage-mw", &log))
    .build()
    .unwrap();
    let runtime = Runtime::new(trace("runtime", &log));
    let service = runtime.layer(MiddlewareStack::new()).layer(triage);
    let sink = CollectingSink::new();
    let ctx = RunContext::builder().events(sink.clone()).build();
    let run = service
        .oneshot(
            RunRequest::new("Is it paid?")
                .context(ctx)
                .with_middleware(trace("run", &log)),
        )
        .await
        .unwrap();
    assert_eq!(run.output, "Paid.");
    assert_eq!(
        *log.lock().unwrap(),
        [
            // Before the loop names the agent.
            "runtime before_agent @",
            "run before_agent @",
            "triage-mw before_agent @",
            "runtime before_model @triage",
            "run before_model @triage",
            "triage-mw before_model @triage",
            "runtime switch model-a->model-b @triage",
            "run switch model-a->model-b @triage",
            "triage-mw switch model-a->model-b @triage",
            // Turn 2: the runtime's and the run's stay, billing's replace triage's.
            "runtime before_model @billing",
            "billing-mw before_model @billing",
            "run before_model @billing",
            // The run closes once, by the middleware that opened it.
            "triage-mw after_agent @billing",
            "run after_agent @billing",
            "runtime after_agent @billing",
        ]
    );
    let events = sink.events();
    let started = events
        .iter()
        .filter(|e| matches!(e, AgentEvent::MiddlewareStarted { .. }))
        .count();
    let completed = events
        .iter()
        .filter(|e| matches!(e, AgentEvent::MiddlewareCompleted { .. }))
        .count();
    assert_eq!(started, completed);
    assert_eq!(started, 15);
}

#[tokio::test]
async fn a_layers_agent_middleware_is_replaced_in_its_place() {
    let log: Log = Arc::default();
    let billing = billing(ScriptedModel::new([ScriptedTurn::text("Paid.")]))
        .middleware(trace("billing-mw", &log))
        .build()
        .unwrap();
    let triage = triage(
        ScriptedModel::new([ScriptedTurn::tool_call("transfer_to_billing", "{}")]),
        Handoff::to(&billing),
    )
    .build()
    .unwrap();
    let runtime = Runtime::new(trace("runtime", &log));
    let service = runtime.layer(trace("triage-layer", &log)).layer(triage);
    let run = service
        .oneshot(RunRequest::new("Is it paid?").with_middleware(trace("run", &log)))
        .await
        .unwrap();
    assert_eq!(run.agent.as_ref(), "billing");
    let log = log.lock().unwrap();
    let turn_two: Vec<_> = log
        .iter()
        .filter(|l| l.contains("before_model @billing"))
        .cloned()
        .collect();
    assert_eq!(
        turn_two,
        [
            "runtime before_model @billing",
            "billing-mw before_model @billing",
            "run before_model @billing",
        ]
    );
    assert_eq!(
        log.iter().filter(|l| l.contains("after_agent")).count(),
        3,
        "{log:?}"
    );
}

#[tokio::test]
async fn before_model_switch_may_refuse_and_the_model_reads_it() {
    let log: Log = Arc::default();
    let billing = billing(ScriptedModel::new([ScriptedTurn::text("never")]))
        .build()
        .unwrap();
    let a_model = ScriptedModel::new([
        ScriptedTurn::tool_call("transfer_to_billing", "{}"),
        ScriptedTurn::text("I will help you myself."),
    ]);
    let stay = MiddlewareStack::new().push(Trace {
        name: "stay",
        log: log.clone(),
        allow_switch: false,
    });
    let triage = triage(a_model.clone(), Handoff::to(&billing))
        .middleware(stay)
        .build()
        .unwrap();
    let sink = CollectingSink::new();
    let ctx = RunContext::builder().events(sink.clone()).build();
    let run = triage
        .run_with(RunRequest::new("Is it paid?").context(ctx))
        .await
        .unwrap();
    assert_eq!(run.agent.as_ref(), "triage");
    assert_eq!(run.output, "I will help you myself.");
    let second = &a_model.requests()[1].messages;
    let refusal = second.last().unwrap();
    assert_eq!(refusal.role, Role::Tool);
    assert!(refusal.text().contains("was refused"), "{}", refusal.text());
    assert!(sink
        .events()
        .iter()
        .any(|e| matches!(e, AgentEvent::HandoffRefused { to, .. } if &**to == "billing")));
    assert!(!sink
        .events()
        .iter()
        .any(|e| matches!(e, AgentEvent::Handoff { .. })));
    assert!(log
        .lock()
        .unwrap()
        .contains(&"stay switch model-a->model-b @triage".to_string()));
}

#[tokio::test]
async fn the_same_model_asks_no_switch() {
    let log: Log = Arc::default();
    let target = Agent::builder("echo")
        .model(ScriptedModel::new([ScriptedTurn::text("echo")]))
        .model_name("model-a")
        .build()
        .unwrap();
    let blocker = MiddlewareStack::new().push(Trace {
        name: "stay",
        log: log.clone(),
        allow_switch: false,
    });
    let triage = triage(
        ScriptedModel::new([ScriptedTurn::tool_call("transfer_to_echo", "")]),
        Handoff::to(&target),
    )
    .middleware(blocker)
    .build()
    .unwrap();
    let run = triage.run("hi").await.unwrap();
    assert_eq!(run.agent.as_ref(), "echo");
    // No instructions on the target: the first agent's prompt is gone.
    assert_eq!(run.messages[0].role, Role::User);
    assert!(!log.lock().unwrap().iter().any(|l| l.contains("switch")));
}

#[tokio::test]
async fn an_input_filter_changes_what_the_target_reads() {
    let b_model = ScriptedModel::new([ScriptedTurn::text("Paid.")]);
    let billing = billing(b_model.clone()).build().unwrap();
    let only_the_question = Handoff::to(&billing).input_filter(|input| {
        assert_eq!((&*input.from, &*input.to), ("triage", "billing"));
        let keep: Vec<Message> = input
            .history
            .iter()
            .filter(|m| m.role == Role::System || (m.role == Role::User))
            .cloned()
            .collect();
        History::from(keep)
    });
    let triage = triage(
        ScriptedModel::new([
            ScriptedTurn::tool_call("faq", "{}"),
            ScriptedTurn::tool_call("transfer_to_billing", "{}"),
        ]),
        only_the_question,
    )
    .build()
    .unwrap();
    let run = triage
        .run_with(RunRequest::new("Is it paid?").history(vec![Message::user("earlier")]))
        .await
        .unwrap();
    assert_eq!(run.output, "Paid.");
    assert_eq!(
        texts(&b_model.requests()[0].messages),
        ["You sort out invoices.", "earlier", "Is it paid?"]
    );
}

#[tokio::test]
async fn a_filter_that_breaks_the_history_fails_clearly() {
    let billing = billing(ScriptedModel::new([ScriptedTurn::text("Paid.")]))
        .build()
        .unwrap();
    // Keeps the handoff call, drops its result.
    let broken = Handoff::to(&billing).input_filter(|input| {
        let keep: Vec<Message> = input
            .history
            .iter()
            .filter(|m| m.role != Role::Tool)
            .cloned()
            .collect();
        History::from(keep)
    });
    let triage = triage(
        ScriptedModel::new([ScriptedTurn::tool_call("transfer_to_billing", "{}")]),
        broken,
    )
    .build()
    .unwrap();
    let err = triage.run("Is it paid?").await.unwrap_err();
    assert!(matches!(err, AgentError::HistoryIntegrity(_)), "{err}");
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Escalation {
    /// 1 (low) to 3 (urgent).
    priority: u8,
    summary: String,
}

#[tokio::test]
async fn a_typed_reason_is_checked_and_the_model_may_try_again() {
    let billing = billing(ScriptedModel::new([ScriptedTurn::text("On it.")]))
        .build()
        .unwrap();
    let a_model = ScriptedModel::new([
        ScriptedTurn::tool_call("escalate", r#"{"priority": "high"}"#),
        ScriptedTurn::tool_call("escalate", r#"{"priority": 3, "summary": "double charge"}"#),
    ]);
    let triage = triage(
        a_model.clone(),
        Handoff::to(&billing)
            .tool_name("escalate")
            .reason::<Escalation>(),
    )
    .build()
    .unwrap();
    let spec = &triage.tool_specs()[1];
    assert_eq!(spec.name, "escalate");
    assert!(spec.parameters["properties"]["priority"].is_object());

    let sink = CollectingSink::new();
    let ctx = RunContext::builder().events(sink.clone()).build();
    let run = triage
        .run_with(RunRequest::new("I was charged twice!").context(ctx))
        .await
        .unwrap();
    assert_eq!(run.agent.as_ref(), "billing");
    let retry = &a_model.requests()[1].messages;
    assert!(retry
        .last()
        .unwrap()
        .text()
        .contains("do not match the schema"));
    let events = sink.events();
    assert!(events
        .iter()
        .any(|e| matches!(e, AgentEvent::HandoffRefused { .. })));
    let reason = events.iter().find_map(|e| match e {
        AgentEvent::Handoff { reason, .. } => reason.clone(),
        _ => None,
    });
    assert_eq!(
        reason,
        Some(json!({"priority": 3, "summary": "double charge"}))
    );
}

#[tokio::test]
async fn only_the_first_handoff_of_a_turn_counts() {
    let billing = billing(ScriptedModel::new([ScriptedTurn::text("billing here")]))
        .build()
        .unwrap();
    let support = Agent::builder("support")
        .model(ScriptedModel::new([ScriptedTurn::text("support here")]))
        .model_name("model-b")
        .build()
        .unwrap();
    let triage = triage(
        ScriptedModel::new([ScriptedTurn::tool_calls([
            ToolCall::new("c1", "transfer_to_support", "{}"),
            ToolCall::new("c2", "faq", "{}"),
            ToolCall::new("c3", "transfer_to_billing", "{}"),
        ])]),
        Handoff::to(&billing),
    )
    .handoff(&support)
    .build()
    .unwrap();
    let run = triage.run("help").await.unwrap();
    assert_eq!(run.agent.as_ref(), "support");
    assert_eq!(run.output, "support here");
    // Results in call order: the handoff, the tool, the refused handoff.
    let results: Vec<_> = run
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| (m.tool_call_id.clone().unwrap(), m.text().into_owned()))
        .collect();
    assert_eq!(results[0].0, "c1");
    assert_eq!(results[1], ("c2".to_string(), "see the FAQ".to_string()));
    assert!(results[2].1.contains("already handed over to `support`"));
}

#[tokio::test]
async fn a_handoff_tool_name_must_be_unique() {
    let faq = Agent::builder("faq")
        .model(ScriptedModel::new([]))
        .build()
        .unwrap();
    let err = triage(ScriptedModel::new([]), Handoff::to(&faq).tool_name("faq"))
        .build()
        .unwrap_err();
    assert!(matches!(err, AgentError::Config(_)), "{err}");
}

#[tokio::test]
async fn a_paused_run_that_was_handed_over_resumes_as_that_agent() {
    let log: Log = Arc::default();
    let b_model = ScriptedModel::new([
        ScriptedTurn::tool_call("refund", r#"{"id": 7}"#),
        ScriptedTurn::text("Refunded."),
    ]);
    let refund = ToolDef::from(tool_sync("refund", "Refunds an invoice", |i: Invoice| {
        Ok::<_, BoxError>(format!("refunded {}", i.id))
    }))
    .requires_approval();
    // Billing's own middleware defers the refund to a person.
    let billing_mw = trace("billing-mw", &log).before_tool("defer", |_, _| {
        Ok(tower_agent::hooks::ToolVerdict::decision(
            tower_agent::hooks::ToolDecision::Defer,
        ))
    });
    let billing = billing(b_model.clone())
        .tool(refund)
        .middleware(billing_mw)
        .build()
        .unwrap();
    let triage = triage(
        ScriptedModel::new([ScriptedTurn::tool_call("transfer_to_billing", "{}")]),
        Handoff::to(&billing),
    )
    .build()
    .unwrap();
    let paused = triage.run("Refund invoice 7").await.unwrap();
    assert_eq!(paused.agent.as_ref(), "billing");
    let checkpoint = paused.checkpoint().unwrap().clone();
    assert_eq!(checkpoint.agent, "billing");
    // Across a process boundary.
    let checkpoint = serde_json::from_str(&serde_json::to_string(&checkpoint).unwrap()).unwrap();

    let call = paused.checkpoint().unwrap().pending[0].call.clone();
    let resumed = triage
        .run_with(RunRequest::resume(
            checkpoint,
            vec![ApprovalDecision::approve(&call)],
        ))
        .await
        .unwrap();
    assert!(resumed.is_completed());
    assert_eq!(resumed.agent.as_ref(), "billing");
    assert_eq!(resumed.output, "Refunded.");
    assert_eq!(b_model.requests().len(), 2);
    assert_eq!(
        b_model.requests()[1].messages[0].text(),
        "You sort out invoices."
    );
    // Billing's own middleware runs in the resumed run's turns.
    assert!(
        log.lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("billing-mw before_model"))
            .count()
            >= 2
    );
}

#[tokio::test]
async fn a_handoff_in_a_paused_turn_happens_on_resume() {
    let b_model = ScriptedModel::new([ScriptedTurn::text("billing here")]);
    let billing = billing(b_model.clone()).build().unwrap();
    let ask = ToolDef::from(tool_sync("note", "Notes", |_: serde_json::Value| {
        Ok::<_, BoxError>("noted")
    }))
    .requires_approval();
    let triage = triage(
        ScriptedModel::new([ScriptedTurn::tool_calls([
            ToolCall::new("c1", "note", "{}"),
            ToolCall::new("c2", "transfer_to_billing", "{}"),
        ])]),
        Handoff::to(&billing),
    )
    .tool(ask)
    .middleware(MiddlewareStack::new().before_tool("defer", |_, _| {
        Ok(tower_agent::hooks::ToolVerdict::decision(
            tower_agent::hooks::ToolDecision::Defer,
        ))
    }))
    .build()
    .unwrap();
    let paused = triage.run("note it and pass me on").await.unwrap();
    let checkpoint = paused.checkpoint().unwrap().clone();
    assert_eq!(checkpoint.agent, "triage");
    assert_eq!(checkpoint.handoff.as_deref(), Some("billing"));
    let call = checkpoint.pending[0].call.clone();
    let run = triage
        .run_with(RunRequest::resume(
            checkpoint,
            vec![ApprovalDecision::approve(&call)],
        ))
        .await
        .unwrap();
    assert_eq!(run.agent.as_ref(), "billing");
    assert_eq!(run.output, "billing here");
    let seen = &b_model.requests()[0].messages;
    let results: Vec<_> = seen
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.tool_call_id.clone().unwrap())
        .collect();
    assert_eq!(results, ["c1", "c2"]);
}

#[tokio::test]
async fn a_nested_run_hands_over_inside_the_middleware_it_inherited() {
    let log: Log = Arc::default();
    let billing = billing(ScriptedModel::new([ScriptedTurn::text("Paid.")]))
        .middleware(trace("billing-mw", &log))
        .build()
        .unwrap();
    let desk = triage(
        ScriptedModel::new([ScriptedTurn::tool_call("transfer_to_billing", "{}")]),
        Handoff::to(&billing),
    )
    .build()
    .unwrap();
    let parent = Agent::builder("parent")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call("desk", r#"{"input": "Is it paid?"}"#),
            ScriptedTurn::text("The desk says: paid."),
        ]))
        .tool(tower_agent::AgentTool::new("desk", "Asks the desk", desk))
        .middleware(trace("parent-mw", &log))
        .build()
        .unwrap();
    let run = parent.run("Is my invoice paid?").await.unwrap();
    assert_eq!(run.agent.as_ref(), "parent");
    assert_eq!(run.output, "The desk says: paid.");
    let log = log.lock().unwrap();
    let at_billing: Vec<_> = log
        .iter()
        .filter(|l| l.ends_with("@billing"))
        .cloned()
        .collect();
    assert_eq!(
        at_billing,
        [
            // The parent's hooks stay outside; billing's join inside them.
            "parent-mw before_model @billing",
            "billing-mw before_model @billing",
            // The nested run closes once, with the hooks it started with.
            "parent-mw after_agent @billing",
        ]
    );
    assert_eq!(
        log.iter().filter(|l| l.contains("after_agent")).count(),
        2,
        "{log:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_queued_message_after_a_handoff_meets_the_targets_input_guard() {
    let guarded: Log = Arc::default();
    let seen = guarded.clone();
    let guard = MiddlewareStack::new().before_run("billing-guard", move |ctx, input| {
        let agent = ctx.agent_name().map(|a| a.to_string()).unwrap_or_default();
        seen.lock()
            .unwrap()
            .push(format!("{} @{agent}", input.text()));
        Ok(())
    });
    let b_model = ScriptedModel::new([
        ScriptedTurn::text("Looking.").delay(std::time::Duration::from_millis(100)),
        ScriptedTurn::text("Invoice 7 is paid."),
    ]);
    let billing = billing(b_model.clone()).middleware(guard).build().unwrap();
    let triage = triage(
        ScriptedModel::new([ScriptedTurn::tool_call("transfer_to_billing", "{}")]),
        Handoff::to(&billing),
    )
    .build()
    .unwrap();
    let handle = triage.start(RunRequest::new("Is my invoice paid?"));
    let sender = handle.sender();
    let (finished, ()) = tokio::join!(handle, async move {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        sender.send("It is invoice 7.").unwrap();
    });
    let run = finished.result.unwrap();
    assert_eq!(run.output, "Invoice 7 is paid.");
    assert_eq!(*guarded.lock().unwrap(), ["It is invoice 7. @billing"]);
    assert_eq!(
        b_model.requests()[1].messages.last().unwrap().text(),
        "It is invoice 7."
    );
}
