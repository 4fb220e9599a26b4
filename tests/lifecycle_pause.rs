//! Defer, pause, serialize, resume in a new agent; decisions bound to the
//! call and its arguments.

mod lifecycle_support;

use std::sync::{Arc, Mutex};

use lifecycle_support::{observed, Lookup};
use tower::{Layer, ServiceExt};
use tower_agent::event::AgentEvent;
use tower_agent::hooks::{Notification, ToolDecision, ToolVerdict};
use tower_agent::lifecycle::{Hook, LifecycleLayer, Middleware, MiddlewareStack, RunRequestExt};
use tower_agent::types::{ApprovalDecision, Checkpoint, Role, ToolCall};
use tower_agent::{
    tool_sync, Agent, AgentRun, BoxError, RunContext, RunRequest, ScriptedModel, ScriptedTurn,
    ToolRouter,
};

/// Defers every call of `pay`; records how it was asked.
#[derive(Clone, Default)]
struct Deferrer {
    asked: Arc<Mutex<Vec<(String, bool)>>>,
    notified: Arc<Mutex<Vec<String>>>,
}

impl Middleware for Deferrer {
    fn name(&self) -> &str {
        "deferrer"
    }

    fn before_tool<'a>(
        &'a self,
        _: &'a RunContext,
        call: &'a ToolCall,
        resumed: bool,
    ) -> Hook<'a, ToolVerdict> {
        self.asked.lock().unwrap().push((call.id.clone(), resumed));
        if call.name == "pay" {
            Hook::ok(ToolVerdict::decision(ToolDecision::Defer))
        } else {
            Hook::ok(ToolVerdict::proceed())
        }
    }

    fn on_notification<'a>(&'a self, _: &'a RunContext, n: &'a Notification) -> Hook<'a, ()> {
        if let Notification::Paused { pending } = n {
            let mut notified = self.notified.lock().unwrap();
            notified.extend(pending.iter().map(|c| c.id.clone()));
        }
        Hook::ok(())
    }
}

/// A fresh agent: the model looks up and pays in one turn, then answers.
/// Built anew for each run, as another process would.
fn build_agent() -> Agent {
    let model = ScriptedModel::from_fn(|request| {
        if request
            .messages
            .last()
            .is_some_and(|m| m.role == Role::Tool)
        {
            ScriptedTurn::text("paid and looked up")
        } else {
            ScriptedTurn::tool_calls([
                ToolCall::new("call_lookup", "lookup", r#"{"id": "inv-7"}"#),
                ToolCall::new("call_pay", "pay", r#"{"id": "inv-7"}"#),
            ])
        }
    });
    let tools = ToolRouter::new()
        .tool(tool_sync("lookup", "Finds an invoice", |l: Lookup| {
            Ok::<_, BoxError>(format!("invoice {} is 30 EUR", l.id))
        }))
        .tool(
            tool_sync("pay", "Pays an invoice", |l: Lookup| {
                Ok::<_, BoxError>(format!("paid {}", l.id))
            })
            .requires_approval(),
        );
    Agent::builder("billing")
        .instructions("You pay invoices.")
        .model(model)
        .tools(tools)
        .approver(|call, _| async move { Some(ApprovalDecision::approve(&call)) })
        .build()
        .unwrap()
}

async fn run(request: RunRequest) -> Result<AgentRun, tower_agent::AgentError> {
    LifecycleLayer::new(MiddlewareStack::new())
        .layer(build_agent())
        .oneshot(request)
        .await
}

#[tokio::test]
async fn pause_serialize_resume_in_a_new_agent_matches_an_uninterrupted_run() {
    // Uninterrupted: the approver grants the payment.
    let baseline = run(RunRequest::new("Pay invoice inv-7")).await.unwrap();
    assert!(baseline.is_completed());

    // Paused: a run-level middleware defers it.
    let deferrer = Deferrer::default();
    let (ctx, sink) = observed();
    let paused = run(RunRequest::new("Pay invoice inv-7")
        .context(ctx)
        .with_middleware(MiddlewareStack::new().push(deferrer.clone())))
    .await
    .unwrap();
    assert_eq!(paused.status.as_str(), "paused");
    assert!(sink
        .events()
        .iter()
        .any(|e| matches!(e, AgentEvent::RunPaused { pending, .. } if pending == &["call_pay"])));
    assert_eq!(*deferrer.notified.lock().unwrap(), ["call_pay"]);
    let json = serde_json::to_string(paused.checkpoint().unwrap()).unwrap();
    let pending_call = paused.checkpoint().unwrap().pending[0].call.clone();
    let run_id = paused.run_id.clone();
    drop(paused);

    // Another process: a new agent, the checkpoint from JSON, the run's
    // middleware given again, a decision bound to the call.
    let checkpoint: Checkpoint = serde_json::from_str(&json).unwrap();
    let decision = ApprovalDecision::approve(&pending_call);
    let resumed = run(RunRequest::resume(checkpoint, vec![decision])
        .with_middleware(MiddlewareStack::new().push(deferrer.clone())))
    .await
    .unwrap();

    assert!(resumed.is_completed());
    assert_eq!(resumed.run_id, run_id, "the resumed run keeps its id");
    assert_eq!(resumed.output, baseline.output);
    assert_eq!(resumed.usage, baseline.usage);
    assert_eq!(resumed.usage_total, baseline.usage_total);
    assert_eq!(resumed.counters, baseline.counters);
    assert_eq!(resumed.messages, baseline.messages);
    // before_tool ran again for the waiting call, knowing it resumed; the
    // call that already ran was not asked again.
    assert_eq!(
        *deferrer.asked.lock().unwrap(),
        [
            ("call_lookup".to_owned(), false),
            ("call_pay".to_owned(), false),
            ("call_pay".to_owned(), true)
        ]
    );
}

async fn paused_checkpoint() -> Checkpoint {
    let paused = run(RunRequest::new("Pay invoice inv-7")
        .with_middleware(MiddlewareStack::new().push(Deferrer::default())))
    .await
    .unwrap();
    paused.checkpoint().unwrap().clone()
}

#[tokio::test]
async fn a_decision_for_other_arguments_is_refused_on_resume() {
    let checkpoint = paused_checkpoint().await;
    let other = ToolCall::new("call_pay", "pay", r#"{"id": "inv-9"}"#);
    let err = run(
        RunRequest::resume(checkpoint, vec![ApprovalDecision::approve(&other)])
            .with_middleware(MiddlewareStack::new().push(Deferrer::default())),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "APPROVAL_MISMATCH");
    assert!(err.to_string().contains("call_pay"), "{err}");
}

#[tokio::test]
async fn a_declined_decision_is_read_by_the_model() {
    let checkpoint = paused_checkpoint().await;
    let call = checkpoint.pending[0].call.clone();
    let (ctx, sink) = observed();
    let resumed = run(RunRequest::resume(
        checkpoint,
        vec![ApprovalDecision::decline(&call, "over budget")],
    )
    .context(ctx)
    .with_middleware(MiddlewareStack::new().push(Deferrer::default())))
    .await
    .unwrap();
    assert!(resumed.is_completed());
    let result = resumed
        .messages
        .iter()
        .find(|m| m.tool_call_id.as_deref() == Some("call_pay"))
        .unwrap();
    assert_eq!(result.text(), "The call was declined: over budget");
    assert!(sink.events().iter().any(|e| matches!(e,
        AgentEvent::ToolDecision { decision: "declined", decided_by, .. } if decided_by == "resume")));
}

#[tokio::test]
async fn without_a_decision_the_call_waits_again() {
    let checkpoint = paused_checkpoint().await;
    let again = run(RunRequest::resume(checkpoint.clone(), Vec::new())
        .with_middleware(MiddlewareStack::new().push(Deferrer::default())))
    .await
    .unwrap();
    let second = again.checkpoint().expect("paused again");
    assert_eq!(second.pending, checkpoint.pending);
    assert_eq!(second.usage, checkpoint.usage, "no model call was made");
}
