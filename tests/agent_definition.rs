//! An agent's wire format: a definition round-trips through JSON, rebuilds
//! against a registry into an agent that runs, and fails with a typed error
//! when the registry lacks a model, a tool or a handoff target.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tower_agent::service::definition::{AgentDefinition, DefinitionError, Registry};
use tower_agent::types::ModelSettings;
use tower_agent::{
    tool_sync, Agent, AgentBuilder, BoxError, FnTool, Handoff, MiddlewareStack, ScriptedModel,
    ScriptedTurn,
};

#[derive(Deserialize, JsonSchema)]
struct City {
    city: String,
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Forecast {
    city: String,
    sunny: bool,
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Why {
    topic: String,
}

fn weather() -> FnTool {
    tool_sync("weather", "The weather in a city", |c: City| {
        Ok::<_, BoxError>(format!("Sunny in {}", c.city))
    })
}

fn clock() -> FnTool {
    tool_sync("clock", "The time", |_: serde_json::Value| {
        Ok::<_, BoxError>("noon")
    })
}

fn expert(model: ScriptedModel) -> Agent {
    Agent::builder("expert")
        .model(model)
        .model_name("big-model")
        .build()
        .unwrap()
}

fn forecaster(model: ScriptedModel, expert: &Agent) -> AgentBuilder {
    Agent::builder("forecaster")
        .instructions("You tell the weather.")
        .model(model)
        .model_name("small-model")
        .settings(ModelSettings {
            temperature: Some(0.2),
            max_tokens: Some(300),
            ..ModelSettings::default()
        })
        .tool(weather())
        .tool(clock())
        .handoff(
            Handoff::to(expert)
                .description("Hard questions")
                .reason::<Why>(),
        )
        .output_type::<Forecast>()
        .output_retries(1)
        .max_turns(4)
        .parallel_tool_calls(false)
        .max_tool_result_bytes(4096)
}

#[tokio::test]
async fn a_definition_round_trips_and_rebuilds_into_an_agent_that_runs() {
    let expert = expert(ScriptedModel::new([]));
    let agent = forecaster(ScriptedModel::new([]), &expert).build().unwrap();
    let definition = agent.definition();

    assert_eq!(definition.name, "forecaster");
    assert_eq!(
        definition.instructions.as_deref(),
        Some("You tell the weather.")
    );
    assert_eq!(definition.model, "small-model");
    assert_eq!(definition.settings.temperature, Some(0.2));
    assert!(definition.settings.response_format.is_none());
    let tools: Vec<_> = definition.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(tools, ["weather", "clock"]);
    assert_eq!(definition.handoffs.len(), 1);
    assert_eq!(definition.handoffs[0].agent, "expert");
    assert_eq!(definition.handoffs[0].tool_name, "transfer_to_expert");
    assert!(definition.handoffs[0].reason_schema["properties"]["topic"].is_object());
    assert!(definition.response_schema.as_ref().unwrap()["properties"]["sunny"].is_object());
    assert_eq!(definition.output_retries, 1);
    assert_eq!(definition.max_turns, 4);
    assert!(!definition.parallel_tool_calls);
    assert_eq!(definition.max_tool_result_bytes, 4096);

    let wire = serde_json::to_string(&definition).unwrap();
    let received: AgentDefinition = serde_json::from_str(&wire).unwrap();
    assert_eq!(received, definition);

    // The receiving side: its own services, and its own middleware.
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("weather", r#"{"city": "Oslo"}"#),
        ScriptedTurn::text(r#"{"city": "Oslo", "sunny": true}"#),
    ]);
    let registry = Registry::new()
        .model("small-model", model.clone())
        .tool(weather())
        .tool(clock())
        .agent(&expert);
    let log = tower_agent::lifecycle::LoggingMiddleware::named("receiver");
    let rebuilt = received
        .builder(&registry)
        .unwrap()
        .middleware(MiddlewareStack::new().push(log.clone()))
        .build()
        .unwrap();
    assert_eq!(rebuilt.definition(), definition);
    assert_eq!(rebuilt.tool_specs(), agent.tool_specs());

    let run = rebuilt.run("Weather in Oslo?").await.unwrap();
    assert_eq!(run.structured, Some(json!({"city": "Oslo", "sunny": true})));
    let seen = &model.requests()[0];
    assert_eq!(seen.model.as_str(), "small-model");
    assert_eq!(seen.settings.max_tokens, Some(300));
    assert!(seen.settings.response_format.is_some());
    assert_eq!(seen.messages[0].text(), "You tell the weather.");
    assert_eq!(
        log.counts()
            .get(tower_agent::lifecycle::HookPoint::AfterAgent),
        1
    );
}

#[test]
fn a_definition_with_defaults_reads_from_little_json() {
    let definition: AgentDefinition =
        serde_json::from_value(json!({"name": "tiny", "model": "m"})).unwrap();
    let registry = Registry::new().model("m", ScriptedModel::new([]));
    let agent = definition.build(&registry).unwrap();
    assert_eq!(agent.definition(), definition);
    assert_eq!(definition.max_turns, 10);
    assert!(definition.parallel_tool_calls);
}

fn registry_without(missing: &str) -> Registry {
    let mut registry = Registry::new();
    if missing != "model" {
        registry = registry.model("small-model", ScriptedModel::new([]));
    }
    if missing != "tool" {
        registry = registry.tool(weather());
    }
    registry = registry.tool(clock());
    if missing != "agent" {
        registry = registry.agent(&expert(ScriptedModel::new([])));
    }
    registry
}

#[test]
fn rebuilding_names_what_the_registry_lacks() {
    let expert = expert(ScriptedModel::new([]));
    let definition = forecaster(ScriptedModel::new([]), &expert)
        .build()
        .unwrap()
        .definition();

    let err = definition.build(&registry_without("model")).unwrap_err();
    assert!(
        matches!(&err, DefinitionError::MissingModel { model, .. } if model == "small-model"),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "agent `forecaster` runs on model `small-model`, which the registry does not have"
    );

    let err = definition.build(&registry_without("tool")).unwrap_err();
    assert!(
        matches!(&err, DefinitionError::MissingTool { tool, .. } if tool == "weather"),
        "{err}"
    );

    let err = definition.build(&registry_without("agent")).unwrap_err();
    assert!(
        matches!(&err, DefinitionError::MissingAgent { target, .. } if target == "expert"),
        "{err}"
    );
}

#[test]
fn a_tool_that_takes_other_arguments_is_refused() {
    let expert = expert(ScriptedModel::new([]));
    let definition = forecaster(ScriptedModel::new([]), &expert)
        .build()
        .unwrap()
        .definition();
    let other_weather = tool_sync("weather", "The weather", |_: Why| Ok::<_, BoxError>("rain"));
    let registry = registry_without("tool").tool(other_weather);
    let err = definition.build(&registry).unwrap_err();
    assert!(
        matches!(&err, DefinitionError::ToolMismatch { tool, .. } if tool == "weather"),
        "{err}"
    );
}

#[test]
fn a_definition_that_does_not_build_says_why() {
    let definition: AgentDefinition =
        serde_json::from_value(json!({"name": "tiny", "model": "m", "max_turns": 0})).unwrap();
    let registry = Registry::new().model("m", ScriptedModel::new([]));
    let err = definition.build(&registry).unwrap_err();
    assert!(matches!(err, DefinitionError::Build(_)), "{err}");
}
