//! The built-in middleware in full runs.

mod lifecycle_support;

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use lifecycle_support::{lookup_tools, observed, run_with};
use proptest::prelude::*;
use tower_agent::event::AgentEvent;
use tower_agent::hooks::Compaction;
use tower_agent::lifecycle::builtin::{
    trim_messages, ContextCompressionMiddleware, MessageTrimMiddleware, PromptCacheGuardMiddleware,
    SummarizationPolicy, TrimStrategy, UsageAccountingMiddleware,
};
use tower_agent::lifecycle::{Hook, Middleware, MiddlewareStack, ModelMiddleware, ModelNext};
use tower_agent::types::{History, Message, ModelResponse, Role, ToolCall};
use tower_agent::{
    Agent, BoxError, ModelCall, RunContext, RunRequest, ScriptedModel, ScriptedTurn, Usage,
};

/// A model that looks up `turns - 1` times, then answers. It counts its
/// calls, not the tool results it is sent: middleware may trim those.
fn looping_model(turns: usize) -> ScriptedModel {
    ScriptedModel::new((0..turns).map(|turn| {
        if turn + 1 == turns {
            ScriptedTurn::text("all done")
        } else {
            ScriptedTurn::tool_call("lookup", format!(r#"{{"id": "{turn}"}}"#))
        }
    }))
}

fn agent(model: ScriptedModel) -> Agent {
    Agent::builder("a")
        .instructions("You look things up.")
        .model(model)
        .tools(lookup_tools())
        .max_turns(20)
        .build()
        .unwrap()
}

/// Random conversations: user turns, answers, and tool-call groups.
fn conversation() -> impl Strategy<Value = Vec<Message>> {
    prop::collection::vec((0u8..3, 1usize..4), 1..12).prop_map(|steps| {
        let mut messages = vec![Message::system("sys")];
        let mut id = 0;
        for (kind, n) in steps {
            match kind {
                0 => messages.push(Message::user("question")),
                1 => messages.push(Message::assistant("answer")),
                _ => {
                    let calls: Vec<ToolCall> = (0..n)
                        .map(|_| {
                            id += 1;
                            ToolCall::new(format!("c{id}"), "lookup", "{}")
                        })
                        .collect();
                    let results: Vec<Message> = calls
                        .iter()
                        .map(|c| Message::tool(c.id.clone(), "r"))
                        .collect();
                    messages.push(Message::assistant_tool_calls(calls));
                    messages.extend(results);
                }
            }
        }
        messages
    })
}

proptest! {
    #[test]
    fn trimming_never_separates_a_call_from_its_result(
        messages in conversation(),
        n in 0usize..10,
        budget in 0usize..200,
    ) {
        for strategy in [TrimStrategy::LastMessages(n), TrimStrategy::MaxTextLen(budget)] {
            if let Some(kept) = trim_messages(&messages, strategy) {
                prop_assert!(kept.len() < messages.len());
                prop_assert_eq!(kept[0].role, Role::System);
                prop_assert_eq!(History::from(kept.clone()).check_integrity(), Ok(()));
                prop_assert_eq!(kept.last(), messages.last());
            }
        }
    }
}

#[tokio::test]
async fn trimming_per_request_keeps_the_transcript_trimming_in_before_model_does_not() {
    let model = looping_model(4);
    let per_request = MiddlewareStack::new()
        .push_model(MessageTrimMiddleware::new(TrimStrategy::LastMessages(3)));
    let run = run_with(agent(model.clone()), per_request, RunRequest::new("go"))
        .await
        .unwrap();
    // The system prompt and the last 3, widened back to a whole tool turn.
    for request in model.requests() {
        assert!(request.messages.len() <= 5, "{}", request.messages.len());
        assert_eq!(request.messages.check_integrity(), Ok(()));
    }
    assert_eq!(
        run.messages.len(),
        9,
        "system, user, 3 x (call, result), answer"
    );

    let model = looping_model(4);
    let persisting =
        MiddlewareStack::new().push(MessageTrimMiddleware::new(TrimStrategy::LastMessages(3)));
    let run = run_with(agent(model.clone()), persisting, RunRequest::new("go"))
        .await
        .unwrap();
    assert!(model.requests().iter().all(|r| r.messages.len() <= 5));
    assert!(run.messages.len() < 9);
    assert_eq!(run.messages.check_integrity(), Ok(()));
}

/// Blocks compactions until the conversation is long, and hears of them.
#[derive(Clone, Default)]
struct CompactionWatch(Arc<Mutex<Vec<Compaction>>>);

impl Middleware for CompactionWatch {
    fn name(&self) -> &str {
        "watch"
    }
    fn before_compaction<'a>(&'a self, _: &'a RunContext, messages: &'a History) -> Hook<'a, bool> {
        Hook::ok(messages.len() >= 8)
    }
    fn after_compaction<'a>(&'a self, _: &'a RunContext, c: &'a Compaction) -> Hook<'a, ()> {
        self.0.lock().unwrap().push(c.clone());
        Hook::ok(())
    }
}

#[tokio::test]
async fn compression_asks_the_hooks_summarizes_and_keeps_the_window() {
    let model = looping_model(6);
    let compression = ContextCompressionMiddleware::new(SummarizationPolicy::new(60).keep_last(2));
    let watch = CompactionWatch::default();
    let stack = MiddlewareStack::new()
        .push(watch.clone())
        .push(compression.clone());
    let (ctx, sink) = observed();
    let run = run_with(
        agent(model.clone()),
        stack,
        RunRequest::new("go").context(ctx),
    )
    .await
    .unwrap();
    assert_eq!(run.output, "all done");

    let records = compression.records();
    assert!(!records.is_empty());
    let compactions = watch.0.lock().unwrap().clone();
    assert_eq!(
        compactions.len(),
        records.len(),
        "after_compaction heard each one"
    );
    assert!(compactions.iter().all(|c| c.by == "context-compression"));
    // The watch skipped compactions of short conversations.
    assert!(records.iter().all(|r| r.messages_before >= 8));
    // What the model got: the system prompt, the summary, the recent window.
    let last = model.requests().last().unwrap().messages.clone();
    assert_eq!(last[0].text(), "You look things up.");
    let summaries = last
        .iter()
        .filter(|m| {
            m.role == Role::System && m.text().starts_with("Summary of the earlier conversation:")
        })
        .count();
    assert_eq!(
        summaries, 1,
        "a later compression folds the earlier summary in"
    );
    assert_eq!(last.check_integrity(), Ok(()));
    assert!(
        records[0].summary.contains("user: go"),
        "{}",
        records[0].summary
    );
    assert!(sink.events().iter().any(|e| matches!(e,
        AgentEvent::Custom { name, .. } if name == "compressed")));
}

#[tokio::test]
async fn compression_is_a_no_op_below_the_threshold() {
    let compression = ContextCompressionMiddleware::new(SummarizationPolicy::new(100_000));
    let model = looping_model(3);
    run_with(
        agent(model.clone()),
        MiddlewareStack::new().push(compression.clone()),
        RunRequest::new("go"),
    )
    .await
    .unwrap();
    assert!(compression.records().is_empty());
    assert_eq!(model.requests().last().unwrap().messages.len(), 6);
}

/// Stamps the system prompt with the turn: moves the cached prefix.
struct Clock;

impl Middleware for Clock {
    fn name(&self) -> &str {
        "clock"
    }
    fn before_model<'a>(&'a self, ctx: &'a RunContext, messages: &'a mut History) -> Hook<'a, ()> {
        let stamped = format!("You look things up. Turn {}.", ctx.iteration());
        messages.to_mut()[0].set_text(stamped);
        Hook::ok(())
    }
}

/// Appends a reminder to each request: keeps the prefix.
struct Reminder;

impl Middleware for Reminder {
    fn name(&self) -> &str {
        "reminder"
    }
    fn before_model<'a>(&'a self, _: &'a RunContext, messages: &'a mut History) -> Hook<'a, ()> {
        messages.push(Message::user("Be quick."));
        Hook::ok(())
    }
}

/// Rewrites the first message of each request it passes on.
struct Rephrase;

impl ModelMiddleware for Rephrase {
    fn name(&self) -> &str {
        "rephrase"
    }
    fn wrap_model<'a>(
        &'a self,
        mut call: ModelCall,
        next: ModelNext,
    ) -> BoxFuture<'a, Result<ModelResponse, BoxError>> {
        if call.context.iteration() > 1 {
            call.request.messages.to_mut()[0].set_text("Rephrased.");
        }
        Box::pin(next.run(call))
    }
}

#[tokio::test]
async fn the_cache_guard_names_the_middleware_that_moved_the_prefix() {
    // Appending keeps the prefix: no event.
    let guard = PromptCacheGuardMiddleware::new();
    let stack = MiddlewareStack::new()
        .push(Reminder)
        .push_model(guard.clone());
    run_with(agent(looping_model(3)), stack, RunRequest::new("go"))
        .await
        .unwrap();
    assert_eq!(guard.events(), []);

    // An edit in before_model, among harmless ones.
    let guard = PromptCacheGuardMiddleware::new();
    let stack = MiddlewareStack::new()
        .push(Reminder)
        .push(Clock)
        .push_model(guard.clone());
    let (ctx, sink) = observed();
    run_with(
        agent(looping_model(3)),
        stack,
        RunRequest::new("go").context(ctx),
    )
    .await
    .unwrap();
    let events = guard.events();
    assert_eq!(events.len(), 2, "turns 2 and 3 moved it: {events:?}");
    assert!(events
        .iter()
        .all(|e| e.moved_by.as_deref() == Some("clock") && e.kept == 0));
    assert!(sink.events().iter().any(|e| matches!(e,
        AgentEvent::Custom { name, .. } if name == "prompt_cache_moved")));

    // A wrap middleware outside the guard.
    let guard = PromptCacheGuardMiddleware::new();
    let stack = MiddlewareStack::new()
        .push_model(Rephrase)
        .push_model(guard.clone());
    run_with(agent(looping_model(3)), stack, RunRequest::new("go"))
        .await
        .unwrap();
    let moved: Vec<_> = guard.events().into_iter().map(|e| e.moved_by).collect();
    assert_eq!(moved.first(), Some(&Some("rephrase".to_owned())));

    // A sliding trim window moves it too, and is named.
    let guard = PromptCacheGuardMiddleware::new();
    let stack = MiddlewareStack::new()
        .push(MessageTrimMiddleware::new(TrimStrategy::LastMessages(2)))
        .push_model(guard.clone());
    run_with(agent(looping_model(4)), stack, RunRequest::new("go"))
        .await
        .unwrap();
    assert!(!guard.events().is_empty());
    assert!(guard
        .events()
        .iter()
        .all(|e| e.moved_by.as_deref() == Some("message-trim")));
}

#[tokio::test]
async fn usage_accounting_matches_the_ledger() {
    let accounting = UsageAccountingMiddleware::new();
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("lookup", r#"{"id": "1"}"#).usage(Usage::new(10, 2)),
        ScriptedTurn::text("done").usage(Usage::new(15, 3)),
    ]);
    let run = run_with(
        agent(model),
        MiddlewareStack::new().push(accounting.clone()),
        RunRequest::new("go"),
    )
    .await
    .unwrap();
    let totals = accounting.totals();
    assert_eq!(totals.usage, Usage::new(25, 5));
    assert_eq!(totals.usage, run.usage);
    assert_eq!(totals.responses, 2);
    assert_eq!(totals.by_model.get("scripted"), Some(&Usage::new(25, 5)));
}
