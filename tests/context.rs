//! The context built-ins in full runs: trimming by tokens, compaction
//! written by a model, clearing old tool outputs with recall (also across a
//! pause), the dynamic system prompt, and the token-counted budget.

mod lifecycle_support;

use std::sync::{Arc, Mutex};

use lifecycle_support::{lookup_tools, observed, run_with};
use proptest::prelude::*;
use tower::{Layer, ServiceExt};
use tower_agent::event::AgentEvent;
use tower_agent::hooks::{ToolDecision, ToolVerdict};
use tower_agent::layers::budget::{Budget, BudgetLayer, UnknownModel};
use tower_agent::lifecycle::builtin::{
    trim_messages, ClearToolOutputsMiddleware, CompactionScope, ContextCompressionMiddleware,
    DynamicSystemPromptMiddleware, MessageTrimMiddleware, ModelSummarizer,
    PromptCacheGuardMiddleware, SummarizationPolicy, TrimStrategy, RECALL_TOOL,
};
use tower_agent::lifecycle::{Hook, Middleware, MiddlewareStack};
use tower_agent::tokens::{
    EstimateCounter, ModelInfo, ModelInfoTable, TokenCounter, TokenCounters,
};
use tower_agent::types::{
    ApprovalDecision, Checkpoint, History, Message, ModelRequest, PriceTable, Role, ToolCall,
};
use tower_agent::{
    tool_sync, Agent, BoxError, ModelCall, RunContext, RunRequest, ScriptedModel, ScriptedTurn,
    ToolRouter, Usage,
};

/// Looks up `turns - 1` times, then answers; each answer costs (10, 2).
fn looping_model(turns: usize) -> ScriptedModel {
    ScriptedModel::new((0..turns).map(|turn| {
        let step = if turn + 1 == turns {
            ScriptedTurn::text("all done")
        } else {
            ScriptedTurn::tool_call("lookup", format!(r#"{{"id": "{turn}"}}"#))
        };
        step.usage(Usage::new(10, 2))
    }))
}

fn agent(model: ScriptedModel) -> Agent {
    Agent::builder("a")
        .instructions("You look things up.")
        .model(model)
        .tools(lookup_tools())
        .max_turns(30)
        .build()
        .unwrap()
}

fn estimate() -> TokenCounters {
    TokenCounters::new(EstimateCounter::new())
}

#[tokio::test]
async fn trimming_by_tokens_keeps_each_request_in_budget_and_the_transcript_whole() {
    let model = looping_model(12);
    let stack = MiddlewareStack::new().push_model(
        MessageTrimMiddleware::new(TrimStrategy::MaxTokens(90))
            .counters(estimate())
            .retain(0.7),
    );
    let run = run_with(agent(model.clone()), stack, RunRequest::new("go"))
        .await
        .unwrap();
    assert_eq!(run.output, "all done");
    assert_eq!(
        run.messages.len(),
        2 + 11 * 2 + 1,
        "the run keeps every message"
    );
    let counter = EstimateCounter::new();
    let requests = model.requests();
    assert!(requests.iter().any(|r| r.messages.len() < 12), "it trimmed");
    for request in &requests {
        let messages = request.messages.to_vec();
        assert!(counter.count_messages(&messages) <= 90);
        assert_eq!(request.messages.check_integrity(), Ok(()));
        assert_eq!(messages[0].text(), "You look things up.");
        assert!(messages
            .iter()
            .any(|m| m.role == Role::User && m.text() == "go"));
    }
    // Cutting to 70% leaves room: some turns only append to the last request.
    let extended = requests
        .windows(2)
        .filter(|w| w[1].messages.shares_prefix_with(&w[0].messages))
        .count();
    assert!(extended >= 3, "{extended} requests extended the one before");
}

/// Random conversations with system messages among the turns.
fn conversation() -> impl Strategy<Value = Vec<Message>> {
    prop::collection::vec((0u8..4, 1usize..4, 1usize..40), 1..16).prop_map(|steps| {
        let mut messages = vec![Message::system("sys")];
        let mut id = 0;
        for (kind, n, len) in steps {
            match kind {
                0 => messages.push(Message::user("q".repeat(len))),
                1 => messages.push(Message::assistant("a".repeat(len))),
                2 => messages.push(Message::system("note")),
                _ => {
                    let calls: Vec<ToolCall> = (0..n)
                        .map(|_| {
                            id += 1;
                            ToolCall::new(format!("c{id}"), "lookup", "{}")
                        })
                        .collect();
                    let results: Vec<Message> = calls
                        .iter()
                        .map(|c| Message::tool(c.id.clone(), "r".repeat(len)))
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
    fn token_trimming_keeps_system_messages_the_last_user_message_and_every_pair(
        messages in conversation(),
        budget in 0usize..300,
        n in 0usize..10,
    ) {
        let systems = messages.iter().filter(|m| m.role == Role::System).count();
        let last_user = messages.iter().rev().find(|m| m.role == Role::User);
        for strategy in [TrimStrategy::MaxTokens(budget), TrimStrategy::LastMessages(n)] {
            let Some(kept) = trim_messages(&messages, strategy) else { continue };
            prop_assert!(kept.len() < messages.len());
            prop_assert_eq!(kept.iter().filter(|m| m.role == Role::System).count(), systems);
            prop_assert_eq!(kept.last(), messages.last());
            if let Some(user) = last_user {
                prop_assert!(kept.contains(user));
            }
            let history = History::from(kept.clone());
            prop_assert_eq!(history.check_integrity(), Ok(()));
            // What is kept is in the original order.
            let mut at = 0;
            for message in &kept {
                let found = messages[at..].iter().position(|m| m == message);
                prop_assert!(found.is_some());
                at += found.unwrap() + 1;
            }
        }
    }
}

/// A summary writer whose answers cost (40, 9).
fn writer() -> ScriptedModel {
    ScriptedModel::from_fn(|_| {
        ScriptedTurn::text("They looked things up.").usage(Usage::new(40, 9))
    })
}

#[tokio::test]
async fn a_model_summary_compacts_the_thread_and_its_usage_is_exact_and_named() {
    let summaries = writer();
    let compaction =
        ContextCompressionMiddleware::new(SummarizationPolicy::tokens(120).keep_last(2))
            .counters(estimate())
            .summarizer(ModelSummarizer::new(summaries.clone(), "writer"));
    let (ctx, sink) = observed();
    let run = run_with(
        agent(looping_model(10)),
        MiddlewareStack::new().push(compaction.clone()),
        RunRequest::new("go").context(ctx),
    )
    .await
    .unwrap();
    let records = compaction.records();
    assert!(!records.is_empty());
    assert_eq!(
        records.len(),
        summaries.requests().len(),
        "one call a compaction"
    );
    assert!(records.iter().all(|r| r.tokens_after < r.tokens_before));
    assert!(records.iter().all(|r| r.scope == CompactionScope::Thread));
    // The run's own calls, and the compactions' beside them.
    assert_eq!(run.usage, Usage::new(100, 20));
    let written = Usage::new(40 * records.len() as u64, 9 * records.len() as u64);
    assert_eq!(run.usage_total, run.usage + written);
    // The thread went on from the summary.
    assert!(run
        .messages
        .iter()
        .any(|m| m.text().contains("They looked things up.")));
    assert_eq!(run.messages.check_integrity(), Ok(()));
    let events = sink.events();
    let compressed: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Custom { name, data, .. } if name == "compressed" => Some(data.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(compressed.len(), records.len());
    assert_eq!(compressed[0]["tokens_before"], records[0].tokens_before);
    assert_eq!(compressed[0]["tokens_after"], records[0].tokens_after);
}

#[tokio::test]
async fn a_turn_compaction_keeps_the_transcript_and_reuses_its_summary() {
    let summaries = writer();
    let compaction = ContextCompressionMiddleware::new(
        SummarizationPolicy::messages(8)
            .keep_last(2)
            .scope(CompactionScope::Turn),
    )
    .summarizer(ModelSummarizer::new(summaries.clone(), "writer"));
    let model = looping_model(12);
    let ctx = RunContext::new();
    let run = run_with(
        agent(model.clone()),
        MiddlewareStack::new().push(compaction.clone()),
        RunRequest::new("go").context(ctx.clone()),
    )
    .await
    .unwrap();
    assert_eq!(
        run.messages.len(),
        2 + 11 * 2 + 1,
        "nothing of the run was lost"
    );
    assert!(!run
        .messages
        .iter()
        .any(|m| m.text().contains("They looked")));
    let requests = model.requests();
    let summarized = requests
        .iter()
        .filter(|r| r.messages.iter().any(|m| m.text().contains("They looked")))
        .count();
    let calls = summaries.requests().len();
    assert!(
        calls >= 1 && calls < summarized,
        "{calls} summaries for {summarized} requests"
    );
    assert!(requests.iter().all(|r| r.messages.len() <= 9));
    assert!(requests
        .iter()
        .all(|r| r.messages.check_integrity().is_ok()));
    let entries = ctx.usage_entries();
    let named = entries
        .iter()
        .filter(|e| e.agent.as_deref() == Some("compaction"))
        .count();
    assert_eq!(named, calls);
}

/// Skips every compaction.
struct NoCompaction;

impl Middleware for NoCompaction {
    fn name(&self) -> &str {
        "no-compaction"
    }
    fn before_compaction<'a>(&'a self, _: &'a RunContext, _: &'a History) -> Hook<'a, bool> {
        Hook::ok(false)
    }
}

#[tokio::test]
async fn a_context_fraction_needs_a_known_window_and_a_hook_may_skip() {
    let tiny = ModelInfoTable::new().model("tiny", ModelInfo::new(200, 50));
    let summaries = writer();
    let compaction = ContextCompressionMiddleware::new(SummarizationPolicy::context_fraction(0.5))
        .models(tiny.clone())
        .model("tiny")
        .counters(estimate())
        .summarizer(ModelSummarizer::new(summaries.clone(), "writer"));
    let run = run_with(
        agent(looping_model(8)),
        MiddlewareStack::new().push(compaction.clone()),
        RunRequest::new("go"),
    )
    .await
    .unwrap();
    assert!(!compaction.records().is_empty());
    assert!(compaction.records().iter().all(|r| r.tokens_before > 100));

    let skipped = ContextCompressionMiddleware::new(SummarizationPolicy::context_fraction(0.5))
        .models(tiny)
        .model("tiny")
        .counters(estimate())
        .summarizer(ModelSummarizer::new(writer(), "writer"));
    let stack = MiddlewareStack::new()
        .push(NoCompaction)
        .push(skipped.clone());
    run_with(agent(looping_model(8)), stack, RunRequest::new("go"))
        .await
        .unwrap();
    assert!(skipped.records().is_empty());
    drop(run);

    let unknown = ContextCompressionMiddleware::new(SummarizationPolicy::context_fraction(0.5))
        .models(ModelInfoTable::new())
        .model("mystery");
    let err = run_with(
        agent(looping_model(2)),
        MiddlewareStack::new().push(unknown),
        RunRequest::new("go"),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "INVALID_CONFIG");
    assert!(err.to_string().contains("mystery"), "{err}");
}

#[tokio::test]
async fn clearing_moves_the_cached_prefix_only_on_the_turns_that_clear() {
    let clearing = ClearToolOutputsMiddleware::new()
        .keep_turns(1)
        .clear_at_least(3);
    let guard = PromptCacheGuardMiddleware::new();
    let stack = MiddlewareStack::new()
        .push(clearing)
        .push_model(guard.clone());
    let model = looping_model(9);
    run_with(agent(model.clone()), stack, RunRequest::new("go"))
        .await
        .unwrap();
    let events = guard.events();
    let turns: Vec<u32> = events.iter().map(|e| e.iteration).collect();
    assert_eq!(turns, [5, 8], "{events:?}");
    assert!(events
        .iter()
        .all(|e| e.moved_by.as_deref() == Some("clear-tool-outputs")));
    let requests = model.requests();
    assert!(
        requests[3].tools.iter().all(|t| t.name != RECALL_TOOL),
        "nothing cleared yet"
    );
    assert!(requests[4].tools.iter().any(|t| t.name == RECALL_TOOL));
    let cleared = |r: &ModelRequest| {
        r.messages
            .iter()
            .filter(|m| m.text().starts_with("[cleared"))
            .count()
    };
    assert_eq!(cleared(&requests[4]), 3);
    assert_eq!(cleared(&requests[7]), 6);
}

/// Defers every `approve_me` call.
struct Deferring;

impl Middleware for Deferring {
    fn name(&self) -> &str {
        "deferring"
    }
    fn before_tool<'a>(
        &'a self,
        _: &'a RunContext,
        call: &'a ToolCall,
        resumed: bool,
    ) -> Hook<'a, ToolVerdict> {
        if call.name == "approve_me" && !resumed {
            return Hook::ok(ToolVerdict::decision(ToolDecision::Defer));
        }
        Hook::ok(ToolVerdict::proceed())
    }
}

#[tokio::test]
async fn recall_works_after_a_resume_from_a_serialized_checkpoint() {
    let page = "line of the page\n".repeat(50);
    let tools = {
        let page = page.clone();
        ToolRouter::new()
            .tool(tool_sync(
                "fetch",
                "Fetches",
                move |_: serde_json::Value| Ok::<_, BoxError>(page.clone()),
            ))
            .tool(tool_sync(
                "approve_me",
                "Needs a person",
                |_: serde_json::Value| Ok::<_, BoxError>("approved and done"),
            ))
    };
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("fetch", "{}"),
        ScriptedTurn::tool_call("approve_me", "{}"),
        ScriptedTurn::tool_call(RECALL_TOOL, r#"{"id": "call_1"}"#),
        ScriptedTurn::text("done"),
    ]);
    let build = || {
        Agent::builder("a")
            .model(model.clone())
            .tools(tools.clone())
            .middleware(
                MiddlewareStack::new()
                    .push(Deferring)
                    .push(ClearToolOutputsMiddleware::new().keep_turns(1)),
            )
            .build()
            .unwrap()
    };
    let paused = build().run("fetch it").await.unwrap();
    let checkpoint = paused.checkpoint().expect("paused").clone();
    assert!(
        checkpoint.messages.iter().any(|m| m.text() == page),
        "the original is kept"
    );
    let json = serde_json::to_string(&checkpoint).unwrap();
    let checkpoint: Checkpoint = serde_json::from_str(&json).unwrap();
    let call = checkpoint.pending[0].call.clone();
    // Another agent value, as another process would build it.
    let resumed = build()
        .run_with(RunRequest::resume(
            checkpoint,
            vec![ApprovalDecision::approve(&call)],
        ))
        .await
        .unwrap();
    assert_eq!(resumed.output, "done");
    let requests = model.requests();
    assert!(requests[2]
        .messages
        .iter()
        .any(|m| m.text().starts_with("[cleared the output of fetch")));
    assert_eq!(
        requests[3].messages.last().unwrap().text(),
        page,
        "recalled"
    );
    assert!(resumed.messages.iter().filter(|m| m.text() == page).count() == 2);
}

#[tokio::test]
async fn the_guard_names_the_dynamic_prompt_only_when_its_text_changes() {
    let prompt = DynamicSystemPromptMiddleware::new(|ctx: &RunContext| {
        let phase = if ctx.iteration() >= 3 {
            "wrapping up"
        } else {
            "exploring"
        };
        format!("Phase: {phase}.")
    });
    let guard = PromptCacheGuardMiddleware::new();
    let stack = MiddlewareStack::new()
        .push(prompt)
        .push_model(guard.clone());
    let model = looping_model(5);
    let run = run_with(agent(model.clone()), stack, RunRequest::new("go"))
        .await
        .unwrap();
    let events = guard.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].iteration, 3);
    assert_eq!(events[0].moved_by.as_deref(), Some("dynamic-system-prompt"));
    assert_eq!(events[0].kept, 1, "the stable prompt stayed cached");
    let requests = model.requests();
    assert_eq!(requests[0].messages[1].text(), "Phase: exploring.");
    assert_eq!(requests[4].messages[1].text(), "Phase: wrapping up.");
    assert!(!run.messages.iter().any(|m| m.text().starts_with("Phase")));
}

#[tokio::test(start_paused = true)]
async fn a_budget_with_a_token_counter_reserves_counted_tokens() {
    // 400 bytes: 100 tokens at four bytes a token; counted, 3 + 100 + 3.
    let call = |ctx: &RunContext| {
        let mut request = ModelRequest::new("m", vec![Message::user("x".repeat(400))]);
        request.settings_mut().max_tokens = Some(50);
        ModelCall::new(request, ctx.clone())
    };
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::text("ok").usage(Usage::new(1, 1)));
    let budget = || {
        BudgetLayer::new(PriceTable::new())
            .unknown_models(UnknownModel::CountTokens)
            .per_run(Budget::new("run").max_tokens(155))
    };
    let ctx = RunContext::new();
    budget()
        .layer(model.clone())
        .oneshot(call(&ctx))
        .await
        .unwrap();
    let counted = budget().token_counter(estimate());
    let err = counted
        .layer(model)
        .oneshot(call(&RunContext::new()))
        .await
        .unwrap_err();
    assert_eq!(
        tower_agent::AgentError::classify(err).code(),
        "BUDGET_EXCEEDED"
    );
    assert_eq!(
        EstimateCounter::new().count_messages(&[Message::user("x".repeat(400))]),
        106
    );
}

/// Keeps the texts it was asked to summarise: the summarizer is usable
/// outside a middleware, over a stored thread.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<usize>>);

#[tokio::test]
async fn a_summarizer_runs_on_its_own_over_a_stored_thread() {
    use tower_agent::lifecycle::builtin::Summarizer;
    let seen = Seen::default();
    let counting = seen.clone();
    let model = ScriptedModel::from_fn(move |request| {
        *counting.0.lock().unwrap() += request.messages.len();
        ScriptedTurn::text("short")
    });
    let ctx = RunContext::new();
    let thread = vec![Message::user("a"), Message::assistant("b")];
    let summary = ModelSummarizer::new(model, "m")
        .summarize(&ctx, &thread)
        .await
        .unwrap();
    assert_eq!(summary, "short");
    assert_eq!(*seen.0.lock().unwrap(), 2, "the prompt and the transcript");
}
