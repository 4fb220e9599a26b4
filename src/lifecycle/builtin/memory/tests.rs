//! Full runs on `ScriptedModel` through a lifecycle layer with the memory
//! middleware.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;
use tower::{ServiceBuilder, ServiceExt};

use super::*;
use crate::event::{AgentEvent, CollectingSink};
use crate::lifecycle::builtin::ConcatSummarizer;
use crate::lifecycle::{LifecycleLayer, MiddlewareStack};
use crate::memory::{InProcessMemory, MemoryError};
use crate::request::RunRequest;
use crate::service::{Agent, ScriptedModel, ScriptedTurn};
use crate::types::{Role, Usage};
use crate::AgentError;

fn agent(
    model: ScriptedModel,
    stack: MiddlewareStack,
) -> impl tower::Service<RunRequest, Response = AgentRun, Error = AgentError, Future: Send> + Clone
{
    ServiceBuilder::new()
        .layer(LifecycleLayer::new(stack))
        .service(
            Agent::builder("support")
                .instructions("You help.")
                .model(model)
                .build()
                .unwrap(),
        )
}

/// A model that answers every call with `answer`.
fn echo(answer: &'static str) -> ScriptedModel {
    ScriptedModel::from_fn(move |_| ScriptedTurn::text(answer).usage(Usage::new(10, 2)))
}

fn on_thread(thread: &str, sink: &CollectingSink) -> RunContext {
    RunContext::builder()
        .thread_id(thread)
        .events(sink.clone())
        .build()
}

fn custom(sink: &CollectingSink, name: &str) -> Vec<Value> {
    sink.events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::Custom { name: n, data, .. } if n == name => Some(data),
            _ => None,
        })
        .collect()
}

fn clock() -> impl Fn() -> Timestamp + Send + Sync + 'static {
    let now = Arc::new(AtomicU64::new(1_000));
    move || now.fetch_add(1, Ordering::Relaxed)
}

#[tokio::test(start_paused = true)]
async fn a_thread_is_loaded_and_saved_and_recall_stays_out_of_it() {
    let store = InProcessMemory::new();
    store
        .add_items(vec![MemoryItem::new(
            "default",
            "fact",
            "The user lives in Lyon",
            1,
        )])
        .await
        .unwrap();
    let model = echo("ok");
    let memory = MemoryMiddleware::new(store.clone()).clock(clock());
    let agent = agent(model.clone(), MiddlewareStack::new().push(memory));
    let sink = CollectingSink::new();

    let first = agent
        .clone()
        .oneshot(RunRequest::new("hello").context(on_thread("t", &sink)))
        .await
        .unwrap();
    assert_eq!(first.messages.len(), 3);
    assert_eq!(
        store.load_thread("t").await.unwrap(),
        first.messages.to_vec()
    );

    let second = agent
        .oneshot(RunRequest::new("What is the weather in Lyon?").context(on_thread("t", &sink)))
        .await
        .unwrap();
    // The thread was loaded: prompt, first run, this input and answer.
    assert_eq!(second.messages.len(), 5);
    assert_eq!(second.messages[1].text(), "hello");
    let sent = &model.requests()[1].messages;
    assert_eq!(sent[0].text(), "You help.");
    assert!(sent[1].text().starts_with("<memory_context>"));
    assert!(sent[1].text().contains("- [fact] The user lives in Lyon"));
    assert_eq!(
        sent[2].text(),
        "hello",
        "the block is in front of the thread"
    );
    // The block is for this run only: neither the transcript nor the thread keep it.
    let thread = store.load_thread("t").await.unwrap();
    assert_eq!(thread, second.messages.to_vec());
    assert!(thread.iter().all(|m| !m.text().contains("memory_context")));
    // Only the new messages were written the second time.
    let saved = custom(&sink, "memory_saved");
    assert_eq!(
        (saved[1]["kept"].as_u64(), saved[1]["written"].as_u64()),
        (Some(3), Some(2))
    );
    // Recall touched the item.
    assert!(store.items("default").await.unwrap()[0].last_used_at >= 1_000);
    // The first run's input shared no word with the item: nothing recalled.
    assert!(!model.requests()[0].messages[1]
        .text()
        .contains("memory_context"));
}

#[tokio::test(start_paused = true)]
async fn a_history_the_caller_passes_wins_and_the_thread_follows_it() {
    let store = InProcessMemory::new();
    store
        .save_thread(
            "t",
            0,
            &[Message::system("You help."), Message::user("old")],
        )
        .await
        .unwrap();
    let model = echo("ok");
    let agent = agent(
        model.clone(),
        MiddlewareStack::new().push(MemoryMiddleware::new(store.clone())),
    );
    let sink = CollectingSink::new();
    let run = agent
        .oneshot(
            RunRequest::new("new")
                .history(vec![Message::user("mine")])
                .context(on_thread("t", &sink)),
        )
        .await
        .unwrap();
    assert_eq!(run.messages[1].text(), "mine");
    let thread = store.load_thread("t").await.unwrap();
    assert_eq!(
        thread,
        run.messages.to_vec(),
        "the transcript replaced the thread"
    );
    assert_eq!(custom(&sink, "memory_saved")[0]["kept"], 0);
}

#[tokio::test(start_paused = true)]
async fn extraction_writes_items_with_provenance_and_its_usage_is_attributed() {
    let store = InProcessMemory::new();
    let extraction = ScriptedModel::new([ScriptedTurn::text(
        r#"{"memories": [{"kind": "preference", "text": "Prefers metric units", "message": 1},
                         {"kind": "preference", "text": "prefers metric units."}]}"#,
    )
    .usage(Usage::new(40, 6))]);
    let memory = MemoryMiddleware::new(store.clone())
        .namespace("support")
        .clock(clock())
        .extractor(ModelExtractor::new(extraction.clone()));
    let agent = agent(echo("Sure."), MiddlewareStack::new().push(memory));
    let sink = CollectingSink::new();
    let ctx = on_thread("t", &sink);
    let run = agent
        .oneshot(RunRequest::new("Use metric units please").context(ctx.clone()))
        .await
        .unwrap();
    let items = store.items("support").await.unwrap();
    assert_eq!(items.len(), 1, "the duplicate was dropped");
    assert_eq!(items[0].kind, "preference");
    assert_eq!(
        items[0].provenance,
        Provenance {
            run_id: run.run_id.to_string(),
            thread_id: Some("t".into()),
            message: Some(1),
        }
    );
    assert_eq!(items[0].created_at, items[0].last_used_at);
    // The run's own usage is the agent's; the ledger also has the extraction's, under "memory".
    assert_eq!(run.usage, Usage::new(10, 2));
    assert_eq!(ctx.total_usage(), Usage::new(50, 8));
    let entries = ctx.usage_entries();
    let extraction_entry = entries
        .iter()
        .find(|e| e.agent.as_deref() == Some("memory"))
        .expect("an entry under the middleware's name");
    assert_eq!(extraction_entry.usage, Usage::new(40, 6));
    assert_eq!(entries.len(), 2);
    // The extraction read the run's messages, numbered from the transcript.
    let prompt = extraction.requests()[0].messages[1].text().into_owned();
    assert!(prompt.contains("[1] user: Use metric units please"));
    assert!(prompt.contains("[2] assistant: Sure."));
}

#[tokio::test(start_paused = true)]
async fn runs_that_did_not_complete_are_not_extracted_and_failed_ones_not_saved() {
    let store = InProcessMemory::new();
    let extraction = ScriptedModel::new([]);
    let stack = MiddlewareStack::new()
        .push(
            MemoryMiddleware::new(store.clone()).extractor(ModelExtractor::new(extraction.clone())),
        )
        .before_run("stopper", |ctx: &RunContext, _: &mut Message| {
            if ctx.thread_id() == Some("stopped") {
                ctx.stop("enough");
            }
            Ok(())
        });
    let failing = ScriptedModel::new([ScriptedTurn::error(crate::ErrorKind::Unavailable, "down")]);
    let sink = CollectingSink::new();

    let stopped = agent(echo("x"), stack.clone())
        .oneshot(RunRequest::new("hi").context(on_thread("stopped", &sink)))
        .await
        .unwrap();
    assert_eq!(stopped.status.as_str(), "stopped");
    assert_eq!(
        store.load_thread("stopped").await.unwrap().len(),
        2,
        "saved"
    );
    let failed = agent(failing, stack)
        .oneshot(RunRequest::new("hi").context(on_thread("failed", &sink)))
        .await;
    assert!(failed.is_err());
    assert!(store.load_thread("failed").await.unwrap().is_empty());
    assert!(extraction.requests().is_empty(), "no extraction for either");
}

#[tokio::test(start_paused = true)]
async fn an_extraction_that_fails_is_logged_keeps_the_result_and_stops_compaction() {
    let store = InProcessMemory::new();
    let memory = MemoryMiddleware::new(store.clone())
        .extractor(ModelExtractor::new(ScriptedModel::new([
            ScriptedTurn::text("I cannot do that"),
        ])))
        .compaction(ThreadCompaction::default().max_messages(0).keep_last(1));
    let agent = agent(echo("fine"), MiddlewareStack::new().push(memory));
    let sink = CollectingSink::new();
    let run = agent
        .clone()
        .oneshot(RunRequest::new("a").context(on_thread("t", &sink)))
        .await
        .unwrap();
    assert_eq!(run.output, "fine");
    let failures = custom(&sink, "memory_failed");
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0]["phase"], "extraction");
    assert!(custom(&sink, "memory_compacted").is_empty());
    assert_eq!(
        store.load_thread("t").await.unwrap().len(),
        3,
        "saved uncompacted"
    );
}

/// Records compaction hooks; says no when told to.
struct Watch {
    allow: bool,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Middleware for Watch {
    fn name(&self) -> &str {
        "watch"
    }

    fn before_compaction<'a>(&'a self, _: &'a RunContext, m: &'a History) -> Hook<'a, bool> {
        self.seen
            .lock()
            .unwrap()
            .push(format!("before {}", m.len()));
        Hook::ok(self.allow)
    }

    fn after_compaction<'a>(&'a self, _: &'a RunContext, c: &'a Compaction) -> Hook<'a, ()> {
        self.seen.lock().unwrap().push(format!(
            "after {} {}->{}",
            c.by, c.messages_before, c.messages_after
        ));
        Hook::ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn the_thread_is_compacted_after_extraction_asking_the_hooks() {
    let store = InProcessMemory::new();
    let mut old = vec![Message::system("You help.")];
    for i in 0..6 {
        old.push(Message::user(format!("question {i}")));
        old.push(Message::assistant(format!("answer {i}")));
    }
    store.save_thread("t", 0, &old).await.unwrap();
    let extraction = ScriptedModel::new([ScriptedTurn::text(r#"{"memories": []}"#)]);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let memory = MemoryMiddleware::new(store.clone())
        .extractor(ModelExtractor::new(extraction.clone()))
        .compaction(
            ThreadCompaction::new(ConcatSummarizer::new(40))
                .max_messages(10)
                .keep_last(2),
        );
    let stack = MiddlewareStack::new().push(Watch {
        allow: true,
        seen: seen.clone(),
    });
    let sink = CollectingSink::new();
    let run = agent(echo("answer 6"), stack.push(memory))
        .oneshot(RunRequest::new("question 6").context(on_thread("t", &sink)))
        .await
        .unwrap();
    assert_eq!(
        run.messages.len(),
        15,
        "the run itself sees the whole thread"
    );
    // Extraction read the run's own messages before compaction.
    let prompt = extraction.requests()[0].messages[1].text().into_owned();
    assert!(prompt.contains("[13] user: question 6"));
    let thread = store.load_thread("t").await.unwrap();
    assert_eq!(thread.len(), 4, "prompt, summary, last two");
    assert_eq!(thread[0].text(), "You help.");
    assert!(thread[1].text().starts_with(compact::SUMMARY_HEADER));
    assert!(thread[1].text().contains("user: question 0"));
    assert_eq!(thread[3].text(), "answer 6");
    assert_eq!(
        *seen.lock().unwrap(),
        ["before 15".to_owned(), "after memory 15->4".to_owned()]
    );
    assert_eq!(thread[1].role, Role::System);

    // A before_compaction hook that says no keeps the thread as it is.
    let store = InProcessMemory::new();
    store.save_thread("t", 0, &old).await.unwrap();
    let memory = MemoryMiddleware::new(store.clone())
        .compaction(ThreadCompaction::default().max_messages(10).keep_last(2));
    let stack = MiddlewareStack::new().push(Watch {
        allow: false,
        seen: Arc::new(Mutex::new(Vec::new())),
    });
    let sink = CollectingSink::new();
    agent(echo("a"), stack.push(memory))
        .oneshot(RunRequest::new("q").context(on_thread("t", &sink)))
        .await
        .unwrap();
    assert_eq!(store.load_thread("t").await.unwrap().len(), 15);
    assert_eq!(custom(&sink, "memory_compaction_skipped").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn slow_extraction_is_skipped_once_the_caller_stops_waiting() {
    let store = InProcessMemory::new();
    let extraction =
        ScriptedModel::new([
            ScriptedTurn::text(r#"{"memories": [{"text": "never stored"}]}"#)
                .delay(Duration::from_secs(30)),
        ]);
    let memory = MemoryMiddleware::new(store.clone())
        .extractor(ModelExtractor::new(extraction))
        .compaction(ThreadCompaction::default().max_messages(0).keep_last(1));
    let agent = agent(echo("done"), MiddlewareStack::new().push(memory));
    let sink = CollectingSink::new();
    let ctx = on_thread("t", &sink);
    let cancel = ctx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        cancel.cancel();
    });
    let started = tokio::time::Instant::now();
    let run = agent
        .oneshot(RunRequest::new("remember this").context(ctx))
        .await
        .unwrap();
    assert_eq!(run.output, "done");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "it did not wait for the model"
    );
    assert!(store.items("default").await.unwrap().is_empty());
    let failures = custom(&sink, "memory_failed");
    assert_eq!(failures[0]["phase"], "extraction");
    assert!(failures[0]["error"].as_str().unwrap().contains("cancelled"));
    assert_eq!(
        store.load_thread("t").await.unwrap().len(),
        3,
        "saved, not compacted"
    );
}

/// A store whose every operation fails.
struct Broken;

impl Memory for Broken {
    fn load_thread<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<Message>, MemoryError>> {
        Box::pin(async { Err(MemoryError::Store("disk gone".into())) })
    }
    fn save_thread<'a>(
        &'a self,
        _: &'a str,
        _: usize,
        _: &'a [Message],
    ) -> BoxFuture<'a, Result<(), MemoryError>> {
        Box::pin(async { Err(MemoryError::Store("disk gone".into())) })
    }
    fn add_items(&self, _: Vec<MemoryItem>) -> BoxFuture<'_, Result<Vec<u64>, MemoryError>> {
        Box::pin(async { Err(MemoryError::Store("disk gone".into())) })
    }
    fn items<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<MemoryItem>, MemoryError>> {
        Box::pin(async { Err(MemoryError::Store("disk gone".into())) })
    }
    fn touch<'a>(&'a self, _: &'a [u64], _: Timestamp) -> BoxFuture<'a, Result<(), MemoryError>> {
        Box::pin(async { Err(MemoryError::Store("disk gone".into())) })
    }
    fn remove_item(&self, _: u64) -> BoxFuture<'_, Result<bool, MemoryError>> {
        Box::pin(async { Err(MemoryError::Store("disk gone".into())) })
    }
}

#[tokio::test(start_paused = true)]
async fn a_thread_that_cannot_load_fails_the_run_other_failures_only_log() {
    let stack = MiddlewareStack::new().push(MemoryMiddleware::new(Broken));
    let sink = CollectingSink::new();
    let err = agent(echo("x"), stack.clone())
        .oneshot(RunRequest::new("hi").context(on_thread("t", &sink)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::Middleware { middleware, hook, .. } if middleware == "memory" && hook == "before_agent"),
        "{err:?}"
    );
    // Without a thread, recall fails open.
    let ctx = RunContext::builder().events(sink.clone()).build();
    let run = agent(echo("x"), stack)
        .oneshot(RunRequest::new("hi").context(ctx))
        .await
        .unwrap();
    assert_eq!(run.output, "x");
    assert_eq!(custom(&sink, "memory_failed")[0]["phase"], "recall");
}

#[tokio::test(start_paused = true)]
async fn a_run_namespace_overrides_the_middleware_s() {
    let store = InProcessMemory::new();
    store
        .add_items(vec![
            MemoryItem::new("user-1", "fact", "Owns a cat named Tom", 1),
            MemoryItem::new("default", "fact", "Owns a cat named Felix", 1),
        ])
        .await
        .unwrap();
    let model = echo("ok");
    let agent = agent(
        model.clone(),
        MiddlewareStack::new().push(MemoryMiddleware::new(store)),
    );
    let ctx = RunContext::builder()
        .state(MemoryNamespace::new("user-1"))
        .build();
    agent
        .oneshot(RunRequest::new("What is my cat called?").context(ctx))
        .await
        .unwrap();
    let block = model.requests()[0].messages[1].text().into_owned();
    assert!(block.contains("Tom") && !block.contains("Felix"), "{block}");
}
