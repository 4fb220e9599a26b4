//! Threads persist across processes: two child processes (this test binary
//! started again) run one after the other on the same SQLite file; the
//! second continues the thread the first saved and recalls the item the
//! first extracted.
#![cfg(feature = "sqlite")]

use std::path::{Path, PathBuf};
use std::process::Command;

use tower::{ServiceBuilder, ServiceExt};
use tower_agent::lifecycle::builtin::{MemoryMiddleware, ModelExtractor};
use tower_agent::lifecycle::{LifecycleLayer, MiddlewareStack};
use tower_agent::memory::{Memory, SqliteMemory};
use tower_agent::{Agent, RunContext, RunRequest, ScriptedModel, ScriptedTurn};

const DB: &str = "TOWER_AGENT_MEMORY_TEST_DB";
const STEP: &str = "TOWER_AGENT_MEMORY_TEST_STEP";

fn temp_db() -> PathBuf {
    std::env::temp_dir().join(format!(
        "tower-agent-memory-procs-{}-{}.db",
        std::process::id(),
        rand::random::<u32>()
    ))
}

fn cleanup(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// Runs step `step` in a new process of this test binary.
fn child(db: &Path, step: &str) {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "one_process_step", "--ignored", "--nocapture"])
        .env(DB, db)
        .env(STEP, step)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "step {step} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("1 passed"),
        "step {step} did not run"
    );
}

#[test]
fn a_second_process_continues_the_thread_and_recalls_what_the_first_learned() {
    let db = temp_db();
    child(&db, "first");
    child(&db, "second");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let memory = SqliteMemory::open(&db).unwrap();
        let thread: Vec<String> = memory
            .load_thread("customer-7")
            .await
            .unwrap()
            .iter()
            .map(|m| m.text().into_owned())
            .collect();
        assert_eq!(
            thread,
            [
                "You are a support agent.",
                "My name is Ada.",
                "Hello Ada.",
                "What is my name?",
                "Your name is Ada."
            ]
        );
        let items = memory.items("support").await.unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].text, "The user's name is Ada");
    });
    cleanup(&db);
}

/// One process's part: started by the test above with the file and the step.
#[tokio::test]
#[ignore = "a child process of a_second_process_continues_the_thread_and_recalls_what_the_first_learned"]
async fn one_process_step() {
    let db = std::env::var(DB).expect("started by the cross-process test, with its file");
    let step = std::env::var(STEP).expect("started by the cross-process test, with its step");
    let memory = SqliteMemory::open(&db).unwrap();
    let (answer, extracted) = match step.as_str() {
        "first" => (
            "Hello Ada.",
            r#"{"memories": [{"kind": "fact", "text": "The user's name is Ada", "message": 1}]}"#,
        ),
        _ => ("Your name is Ada.", r#"{"memories": []}"#),
    };
    let model = ScriptedModel::new([ScriptedTurn::text(answer)]);
    let extractor = ModelExtractor::new(ScriptedModel::new([ScriptedTurn::text(extracted)]));
    let stack = MiddlewareStack::new().push(
        MemoryMiddleware::new(memory.clone())
            .namespace("support")
            .extractor(extractor),
    );
    let agent = ServiceBuilder::new()
        .layer(LifecycleLayer::new(stack))
        .service(
            Agent::builder("support")
                .instructions("You are a support agent.")
                .model(model.clone())
                .build()
                .unwrap(),
        );
    let ctx = RunContext::builder().thread_id("customer-7").build();
    let input = if step == "first" {
        "My name is Ada."
    } else {
        "What is my name?"
    };
    let run = agent
        .oneshot(RunRequest::new(input).context(ctx))
        .await
        .unwrap();
    let sent = &model.requests()[0].messages;
    if step == "first" {
        assert_eq!(run.messages.len(), 3);
        assert!(sent.iter().all(|m| !m.text().contains("<memory_context>")));
    } else {
        // This process never saw the first run: the thread came from the file.
        assert_eq!(run.messages.len(), 5);
        assert_eq!(run.messages[1].text(), "My name is Ada.");
        assert!(sent[1].text().contains("- [fact] The user's name is Ada"));
    }
}
