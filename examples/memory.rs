//! Memory across runs in a SQLite file. Run it twice: the second process
//! continues the thread the first saved, and recalls what it learned.
//!
//! ```sh
//! cargo run --example memory --features sqlite -- /tmp/agent-memory.db "My name is Ada."
//! cargo run --example memory --features sqlite -- /tmp/agent-memory.db "What is my name?"
//! ```
//!
//! The model is scripted (no network): it answers with what it reads in its
//! `<memory_context>` block, and the extraction model keeps the user's name.

use tower::{ServiceBuilder, ServiceExt};
use tower_agent::lifecycle::builtin::{MemoryMiddleware, ModelExtractor};
use tower_agent::lifecycle::{LifecycleLayer, MiddlewareStack};
use tower_agent::memory::{Memory, SqliteMemory};
use tower_agent::types::Role;
use tower_agent::{Agent, RunContext, RunRequest, ScriptedModel, ScriptedTurn};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "agent-memory.db".into());
    let input = args.next().unwrap_or_else(|| "My name is Ada.".into());
    let memory = SqliteMemory::open(&path)?;

    // Answers from the recalled memory when there is some.
    let model = ScriptedModel::from_fn(|request| {
        let recalled = request
            .messages
            .iter()
            .find(|m| m.role == Role::System && m.text().contains("<memory_context>"))
            .map(|m| m.text().into_owned());
        ScriptedTurn::text(match recalled {
            Some(block) => format!("From memory:\n{block}"),
            None => "Nice to meet you.".to_owned(),
        })
    });
    // Keeps a name the user gives.
    let extractor = ModelExtractor::new(ScriptedModel::from_fn(|request| {
        let prompt = request.messages[1].text().into_owned();
        let name = prompt
            .split("My name is ")
            .nth(1)
            .and_then(|rest| rest.split(['.', ' ', '\n']).next())
            .filter(|name| !name.is_empty());
        ScriptedTurn::text(match name {
            Some(name) => format!(
                r#"{{"memories": [{{"kind": "fact", "text": "The user's name is {name}"}}]}}"#
            ),
            None => r#"{"memories": []}"#.to_owned(),
        })
    }));

    let stack = MiddlewareStack::new().push(
        MemoryMiddleware::new(memory.clone())
            .namespace("example")
            .extractor(extractor),
    );
    let agent = ServiceBuilder::new()
        .layer(LifecycleLayer::new(stack))
        .service(
            Agent::builder("assistant")
                .instructions("You are a helpful assistant.")
                .model(model)
                .build()?,
        );
    let ctx = RunContext::builder().thread_id("example-thread").build();
    let run = agent.oneshot(RunRequest::new(input).context(ctx)).await?;
    println!("{}", run.output);
    println!(
        "\nThe thread has {} messages; memory items: {:?}",
        memory.load_thread("example-thread").await?.len(),
        memory
            .items("example")
            .await?
            .iter()
            .map(|i| i.text.as_str())
            .collect::<Vec<_>>()
    );
    Ok(())
}
