//! What each hook may do, in full runs on ScriptedModel.

mod lifecycle_support;

use std::sync::{Arc, Mutex};

use lifecycle_support::{lookup_tools, run_with};
use tower_agent::hooks::{Notification, RunStart, ToolCallResult};
use tower_agent::lifecycle::{Hook, Middleware, MiddlewareStack};
use tower_agent::types::{
    ApprovalDecision, History, Message, ModelResponse, Role, RunStatus, ToolCall,
};
use tower_agent::{
    tool_sync, Agent, AgentError, BoxError, RunContext, RunRequest, ScriptedModel, ScriptedTurn,
    ToolOutput, ToolRouter,
};

/// A middleware built from closures, one per hook it declares.
type Texts = Arc<Mutex<Vec<String>>>;

fn texts() -> Texts {
    Arc::default()
}

fn tool_then_text(text: &'static str) -> ScriptedModel {
    ScriptedModel::from_fn(move |request| {
        if request.messages.iter().any(|m| m.role == Role::Tool) {
            ScriptedTurn::text(text)
        } else {
            ScriptedTurn::tool_call("lookup", r#"{"id": "7"}"#)
        }
    })
}

fn agent(model: ScriptedModel) -> Agent {
    Agent::builder("a")
        .instructions("Be brief.")
        .model(model)
        .tools(lookup_tools())
        .build()
        .unwrap()
}

struct Context;

impl Middleware for Context {
    fn name(&self) -> &str {
        "context"
    }
    fn before_agent<'a>(&'a self, _: &'a RunContext, start: RunStart) -> Hook<'a, Option<String>> {
        Hook::ok(Some(format!("started, resumed={}", start.resumed)))
    }
    fn before_run<'a>(
        &'a self,
        _: &'a RunContext,
        input: &'a mut Message,
        messages: &'a History,
    ) -> Hook<'a, Option<String>> {
        let text = input.text().trim().to_owned();
        input.set_text(text);
        Hook::ok(Some(format!(
            "{} messages before the input",
            messages.len()
        )))
    }
}

#[tokio::test]
async fn before_agent_context_is_for_this_run_and_before_run_context_is_kept() {
    let model = ScriptedModel::new([ScriptedTurn::text("hi")]);
    let run = run_with(
        agent(model.clone()),
        MiddlewareStack::new().push(Context),
        RunRequest::new("  hello  "),
    )
    .await
    .unwrap();
    let sent: Vec<(Role, String)> = model.requests()[0]
        .messages
        .iter()
        .map(|m| (m.role, m.text().into_owned()))
        .collect();
    assert_eq!(
        sent,
        [
            (Role::System, "Be brief.".to_owned()),
            (Role::System, "started, resumed=false".to_owned()),
            (Role::User, "hello".to_owned()),
            (Role::System, "1 messages before the input".to_owned()),
        ]
    );
    // The transcript keeps the input guard's context, not the run's own.
    let kept: Vec<String> = run.messages.iter().map(|m| m.text().into_owned()).collect();
    assert_eq!(
        kept,
        ["Be brief.", "hello", "1 messages before the input", "hi"]
    );
}

/// Keeps only the system prompt and the last message for the model.
struct Trim {
    break_integrity: bool,
}

impl Middleware for Trim {
    fn name(&self) -> &str {
        "trim"
    }
    fn before_model<'a>(&'a self, _: &'a RunContext, messages: &'a mut History) -> Hook<'a, ()> {
        if self.break_integrity {
            // Drops the tool results but keeps the calls: a provider's 400.
            messages.to_mut().retain(|m| m.role != Role::Tool);
        } else if messages.len() > 2 {
            let keep = vec![messages[0].clone(), messages[messages.len() - 1].clone()];
            *messages = History::from(keep);
        }
        Hook::ok(())
    }
}

#[tokio::test]
async fn before_model_changes_the_messages_from_then_on_and_integrity_is_checked() {
    let model = ScriptedModel::new([ScriptedTurn::text("one")]);
    let run = run_with(
        agent(model.clone()),
        MiddlewareStack::new().push(Trim {
            break_integrity: false,
        }),
        RunRequest::new("q").history(vec![Message::user("old"), Message::assistant("older")]),
    )
    .await
    .unwrap();
    assert_eq!(model.requests()[0].messages.len(), 2);
    assert_eq!(
        run.messages.len(),
        3,
        "the kept conversation continues from the edit"
    );

    let err = run_with(
        agent(tool_then_text("done")),
        MiddlewareStack::new().push(Trim {
            break_integrity: true,
        }),
        RunRequest::new("q"),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "HISTORY_INTEGRITY");
    assert!(err.to_string().contains("has no result"), "{err}");
}

struct Rewriter;

impl Middleware for Rewriter {
    fn name(&self) -> &str {
        "rewriter"
    }
    fn after_model<'a>(
        &'a self,
        _: &'a RunContext,
        response: &'a mut ModelResponse,
    ) -> Hook<'a, ()> {
        let calls = &mut response.message.tool_calls;
        if calls.iter().any(|c| c.name == "dangerous") {
            // No calls left: the answer becomes final.
            calls.clear();
            response.message.set_text("I will not do that.");
        }
        Hook::ok(())
    }
    fn after_tool<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a ToolCall,
        output: &'a mut ToolOutput,
    ) -> Hook<'a, ()> {
        output.content = output.content.replace("7", "[redacted]");
        Hook::ok(())
    }
}

#[tokio::test]
async fn after_model_and_after_tool_replace_what_the_run_uses() {
    let model = tool_then_text("done");
    let run = run_with(
        agent(model.clone()),
        MiddlewareStack::new().push(Rewriter),
        RunRequest::new("q"),
    )
    .await
    .unwrap();
    let result = run.messages.iter().find(|m| m.role == Role::Tool).unwrap();
    assert_eq!(result.text(), "found [redacted]");
    assert_eq!(
        model.requests()[1].messages.last().unwrap().text(),
        "found [redacted]"
    );

    let model = ScriptedModel::new([ScriptedTurn::tool_call("dangerous", "{}")]);
    let run = run_with(
        agent(model),
        MiddlewareStack::new().push(Rewriter),
        RunRequest::new("q"),
    )
    .await
    .unwrap();
    assert!(run.is_completed());
    assert_eq!(run.output, "I will not do that.");
    assert_eq!(run.counters.tool_calls, 0);
}

struct Batch {
    stop: bool,
    seen: Texts,
}

impl Middleware for Batch {
    fn name(&self) -> &str {
        "batch"
    }
    fn after_tool_batch<'a>(
        &'a self,
        ctx: &'a RunContext,
        results: &'a [ToolCallResult<'a>],
    ) -> Hook<'a, ()> {
        self.seen
            .lock()
            .unwrap()
            .extend(results.iter().map(|r| r.output.content.clone()));
        if self.stop {
            ctx.stop("one lookup is enough");
        } else {
            ctx.add_context("Answer in one word.");
        }
        Hook::ok(())
    }
}

#[tokio::test]
async fn after_tool_batch_adds_context_or_stops_the_run_attributed() {
    let seen = texts();
    let model = tool_then_text("done");
    let run = run_with(
        agent(model.clone()),
        MiddlewareStack::new().push(Batch {
            stop: false,
            seen: seen.clone(),
        }),
        RunRequest::new("q"),
    )
    .await
    .unwrap();
    assert_eq!(*seen.lock().unwrap(), ["found 7"]);
    let second = &model.requests()[1].messages;
    assert_eq!(second.last().unwrap().text(), "Answer in one word.");
    assert!(run.is_completed());

    let model = tool_then_text("never");
    let run = run_with(
        agent(model.clone()),
        MiddlewareStack::new().push(Batch {
            stop: true,
            seen: texts(),
        }),
        RunRequest::new("q"),
    )
    .await
    .unwrap();
    let RunStatus::Stopped(stop) = &run.status else {
        panic!("expected a stop, got {:?}", run.status);
    };
    assert_eq!(stop.reason, "one lookup is enough");
    assert_eq!(
        stop.by.as_deref(),
        Some("batch"),
        "the stack names who stopped it"
    );
    assert_eq!(model.requests().len(), 1);
}

/// `after_tool_batch` reads every result wherever its middleware sits: in a
/// stack whose other middleware never read a step (and are skipped at it
/// once the stack learned so), run after run, and as the parent's hook
/// around a sub-agent whose own stack reads no step.
#[tokio::test]
async fn after_tool_batch_reads_every_step_beside_middleware_that_do_not() {
    let seen = texts();
    let child = Agent::builder("child")
        .model(tool_then_text("child done"))
        .tools(lookup_tools())
        .middleware(MiddlewareStack::new().before_model("noop", |_, _| Ok(())))
        .build()
        .unwrap();
    let parent = Agent::builder("parent")
        .model(ScriptedModel::from_fn(|request| {
            if request.messages.iter().any(|m| m.role == Role::Tool) {
                ScriptedTurn::text("parent done")
            } else {
                ScriptedTurn::tool_call("child", r#"{"input": "go"}"#)
            }
        }))
        .tools(ToolRouter::new().tool(tower_agent::AgentTool::new("child", "A child", child)))
        .build()
        .unwrap();
    let stack = MiddlewareStack::new()
        .before_model("first", |_, _| Ok(()))
        .push(Batch {
            stop: false,
            seen: seen.clone(),
        })
        .before_model("last", |_, _| Ok(()));
    let layer = tower_agent::lifecycle::LifecycleLayer::new(stack);
    let service = tower::Layer::layer(&layer, parent);
    for round in 1..=2 {
        let run = tower::ServiceExt::oneshot(service.clone(), RunRequest::new("q"))
            .await
            .unwrap();
        assert_eq!(run.output, "parent done");
        // The child's step, then the parent's: the stack's hooks also see
        // the steps of nested runs.
        let expected: Vec<&str> = ["found 7", "child done"]
            .into_iter()
            .cycle()
            .take(2 * round)
            .collect();
        assert_eq!(*seen.lock().unwrap(), expected, "round {round}");
    }
}

struct KeepGoing {
    asked: Arc<Mutex<Vec<u32>>>,
}

impl Middleware for KeepGoing {
    fn name(&self) -> &str {
        "keep-going"
    }
    fn before_stop<'a>(
        &'a self,
        _: &'a RunContext,
        output: &'a Message,
        continuations: u32,
    ) -> Hook<'a, Option<String>> {
        self.asked.lock().unwrap().push(continuations);
        if output.text().len() < 6 {
            return Hook::ok(Some("Say more.".into()));
        }
        Hook::ok(None)
    }
}

#[tokio::test]
async fn before_stop_continues_counts_and_is_not_asked_past_the_last_turn() {
    let asked = Arc::default();
    let model = ScriptedModel::new([
        ScriptedTurn::text("hm"),
        ScriptedTurn::text("well"),
        ScriptedTurn::text("a full answer"),
    ]);
    let run = run_with(
        agent(model.clone()),
        MiddlewareStack::new().push(KeepGoing {
            asked: Arc::clone(&asked),
        }),
        RunRequest::new("q"),
    )
    .await
    .unwrap();
    assert_eq!(run.output, "a full answer");
    assert_eq!(*asked.lock().unwrap(), [0, 1, 2]);
    assert_eq!(
        model.requests()[1].messages.last().unwrap().text(),
        "Say more."
    );

    // With two turns, the second answer is final: nobody is asked.
    let asked = Arc::default();
    let limited = Agent::builder("a")
        .model(ScriptedModel::new([
            ScriptedTurn::text("hm"),
            ScriptedTurn::text("ok"),
        ]))
        .max_turns(2)
        .build()
        .unwrap();
    let run = run_with(
        limited,
        MiddlewareStack::new().push(KeepGoing {
            asked: Arc::clone(&asked),
        }),
        RunRequest::new("q"),
    )
    .await
    .unwrap();
    assert_eq!(run.output, "ok");
    assert_eq!(*asked.lock().unwrap(), [0]);
}

struct Notified(Arc<Mutex<Vec<String>>>);

impl Middleware for Notified {
    fn name(&self) -> &str {
        "pager"
    }
    fn on_notification<'a>(&'a self, _: &'a RunContext, n: &'a Notification) -> Hook<'a, ()> {
        if let Notification::ApprovalRequested { call } = n {
            self.0.lock().unwrap().push(call.name.clone());
        }
        Hook::ok(())
    }
}

#[tokio::test]
async fn on_notification_hears_of_approvals_it_cannot_change() {
    let paged = Arc::default();
    let agent = Agent::builder("a")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call("wire", r#"{"id": "1"}"#),
            ScriptedTurn::text("done"),
        ]))
        .tools(
            ToolRouter::new().tool(
                tool_sync("wire", "Wires money", |l: lifecycle_support::Lookup| {
                    Ok::<_, BoxError>(format!("wired {}", l.id))
                })
                .requires_approval(),
            ),
        )
        .approver(|call, _| async move { Some(ApprovalDecision::approve(&call)) })
        .build()
        .unwrap();
    let run = run_with(
        agent,
        MiddlewareStack::new().push(Notified(Arc::clone(&paged))),
        RunRequest::new("q"),
    )
    .await
    .unwrap();
    assert_eq!(*paged.lock().unwrap(), ["wire"]);
    assert_eq!(run.counters.tool_calls, 1);
}

#[tokio::test]
async fn an_error_in_a_hook_fails_the_run_as_a_middleware_error() {
    struct Broken;
    impl Middleware for Broken {
        fn name(&self) -> &str {
            "broken"
        }
        fn before_model<'a>(&'a self, _: &'a RunContext, _: &'a mut History) -> Hook<'a, ()> {
            Hook::new(async { Err("disk full".into()) })
        }
    }
    let err = run_with(
        agent(ScriptedModel::new([ScriptedTurn::text("x")])),
        MiddlewareStack::new().push(Broken),
        RunRequest::new("q"),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "middleware `broken` failed in before_model: disk full"
    );
    assert!(matches!(err, AgentError::Middleware { .. }));
}
