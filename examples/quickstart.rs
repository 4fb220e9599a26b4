//! A support agent with two tools and a sub-agent, on the embedded
//! `ScriptedModel`: no key and no network.
//!
//! ```sh
//! cargo run --example quickstart
//! ```
//!
//! The answer is printed as it streams in; then the transcript, counters
//! and usage. With `RUST_LOG=tower_agent=info` (or `debug`) the run's
//! progress is logged as well: each run, model call and tool call, with
//! its model or tool, tokens and duration.
//!
//! With `OPENAI_BASE_URL` set (and `OPENAI_API_KEY`, `OPENAI_MODEL` as the
//! endpoint needs), both agents talk to that OpenAI-compatible endpoint
//! instead: OpenAI, vLLM, Ollama, llama.cpp, OpenRouter, Groq, …

use std::io::Write;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use tower_agent::lifecycle::builtin::limits::{ModelCallLimitMiddleware, ModelLimitAction};
use tower_agent::prelude::*;
use tower_agent::service::{box_model, BoxModel};
use tower_agent::types::ModelDelta;

#[derive(Deserialize, JsonSchema)]
struct OrderId {
    /// The order's id, such as `A-1042`.
    id: String,
}

#[derive(Deserialize, JsonSchema)]
struct Customer {
    /// The customer's e-mail address.
    email: String,
}

/// The endpoint of `OPENAI_BASE_URL` if it is set, else the scripted model.
fn model_or(scripted: ScriptedModel) -> Result<BoxModel, AgentError> {
    #[cfg(feature = "openai")]
    if let Some(chat) = tower_agent::OpenAiChat::from_env() {
        return Ok(box_model(chat?));
    }
    Ok(box_model(scripted))
}

/// The billing specialist: a whole agent, used by the support agent as a tool.
fn billing_agent() -> Result<Agent, AgentError> {
    let model = model_or(
        ScriptedModel::new([ScriptedTurn::text(
            "A-1042 was paid in full on 2 November; no refund is due.",
        )])
        .name("scripted-billing"),
    )?;
    Agent::builder("billing")
        .instructions("You answer billing questions.")
        .model(model)
        .build()
}

/// The support agent's model: scripted turns, wrapped in tower's own layers.
fn support_model() -> ScriptedModel {
    ScriptedModel::new([
        // Turn 1: two tool calls at once.
        ScriptedTurn::tool_calls([
            ToolCall::new("call_1", "order_status", r#"{"id": "A-1042"}"#),
            ToolCall::new("call_2", "customer", r#"{"email": "ada@example.com"}"#),
        ]),
        // Turn 2: ask the billing specialist.
        ScriptedTurn::tool_call(
            "billing",
            r#"{"input": "Was order A-1042 paid, and is a refund due?"}"#,
        ),
        // Turn 3: the answer.
        ScriptedTurn::text(
            "Hi Ada! Order A-1042 left our warehouse yesterday and should arrive on Thursday. \
             It was paid in full, so there is nothing to refund.",
        ),
    ])
    .name("scripted-support")
}

fn print_transcript(messages: &[Message]) {
    for message in messages {
        let who = match message.role {
            Role::System => "system   ",
            Role::User => "user     ",
            Role::Assistant => "assistant",
            Role::Tool => "tool     ",
        };
        let text = message.text();
        if !text.is_empty() {
            println!("  {who} │ {text}");
        }
        for call in &message.tool_calls {
            println!(
                "  {who} │ → {}({}) [{}]",
                call.name, call.arguments, call.id
            );
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), AgentError> {
    // Logs nothing unless `RUST_LOG` asks, e.g. `RUST_LOG=tower_agent=info`.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();

    let tools = ToolRouter::new()
        .tool(
            tool_sync("order_status", "Where an order is", |order: OrderId| {
                Ok::<_, BoxError>(format!("{}: shipped yesterday, arrives Thursday", order.id))
            })
            .idempotent(),
        )
        .tool(tool_fn(
            "customer",
            "A customer's name and plan",
            |customer: Customer| async move {
                Ok::<_, BoxError>(
                    serde_json::json!({"email": customer.email, "name": "Ada", "plan": "premium"}),
                )
            },
        ))
        .tool(AgentTool::new(
            "billing",
            "Ask the billing specialist",
            billing_agent()?,
        ));

    // The model stack: any tower layers, composed with ServiceBuilder. The
    // retry sends a call that failed transiently (a 5xx, a timeout, a 429)
    // again, unless part of its answer had already streamed.
    let model = ServiceBuilder::new()
        .layer(LlmRetryLayer::new())
        .timeout(Duration::from_secs(30))
        .service(model_or(support_model())?);

    let agent = Agent::builder("support")
        .instructions("You help customers with their orders. Be brief and kind.")
        .model(model)
        .tools(tools)
        .max_turns(6)
        // A real model may keep calling tools; after five calls the run
        // stops gracefully (status *stopped*) instead of failing.
        .middleware(
            ModelCallLimitMiddleware::new()
                .run_limit(5)
                .on_limit(ModelLimitAction::Stop),
        )
        .build()?;

    // The answer's text, printed as the model streams it.
    let stream = DeltaSink::new(|delta| {
        if let ModelDelta::Text { text } = delta {
            print!("{text}");
            let _ = std::io::stdout().flush();
        }
    });
    let ctx = RunContext::builder().thread_id("thread-7").build();
    let request = RunRequest::new("Hi, where is my order A-1042? Do I get a refund?")
        .context(ctx.clone())
        .stream(stream);
    print!("Streaming the answer: ");
    let run = agent.run_with(request).await?;
    println!();

    println!(
        "\nTranscript of run {} ({}):",
        run.run_id,
        run.status.as_str()
    );
    print_transcript(&run.messages.to_contiguous());

    println!(
        "\nCounters: {} turns, {} model calls, {} tool calls",
        run.counters.turns, run.counters.model_calls, run.counters.tool_calls
    );
    println!("\nUsage, one line per model call that reached a backend:");
    for entry in ctx.usage_entries() {
        println!(
            "  {:<8} {:<17} in {:>4}  out {:>4}",
            entry.agent.as_deref().unwrap_or("?"),
            entry.model,
            entry.usage.input_tokens,
            entry.usage.output_tokens
        );
    }
    println!(
        "  support alone: in {:>4}  out {:>4}",
        run.usage.input_tokens, run.usage.output_tokens
    );
    println!(
        "  with billing:  in {:>4}  out {:>4}",
        run.usage_total.input_tokens, run.usage_total.output_tokens
    );
    println!("\nFinal answer: {}", run.output);
    Ok(())
}
