//! An agent's wire format: [`AgentDefinition`] is what an agent is made of
//! as data (its name, instructions, model name, settings, tools' names and
//! specs, handoff targets and response schema), serialised with serde so
//! that it can be sent to another process and rebuilt there against a
//! [`Registry`] of the tools, models and agents that process has.
//!
//! Code does not travel: the model and tool services, middleware, tool
//! layers, the approver and handoff input filters are the receiving side's
//! own. [`AgentDefinition::builder`] returns an [`AgentBuilder`] for it to
//! add them before it builds. A tool or model the registry lacks, or a tool
//! that takes other arguments there, is a [`DefinitionError`], never a
//! silently different agent.
//!
//! ```
//! use tower_agent::service::definition::{AgentDefinition, Registry};
//! use tower_agent::{tool_sync, Agent, BoxError, ScriptedModel, ScriptedTurn};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct City { city: String }
//! let weather = || tool_sync("weather", "The weather in a city", |c: City| {
//!     Ok::<_, BoxError>(format!("Sunny in {}", c.city))
//! });
//!
//! // One process defines the agent and sends it.
//! let agent = Agent::builder("forecaster")
//!     .instructions("You tell the weather.")
//!     .model(ScriptedModel::new([]))
//!     .model_name("small-model")
//!     .tool(weather())
//!     .build()?;
//! let wire = serde_json::to_string(&agent.definition())?;
//!
//! // Another rebuilds it with its own services, and its own middleware.
//! let definition: AgentDefinition = serde_json::from_str(&wire)?;
//! let model = ScriptedModel::new([
//!     ScriptedTurn::tool_call("weather", r#"{"city": "Oslo"}"#),
//!     ScriptedTurn::text("Sunny in Oslo."),
//! ]);
//! let registry = Registry::new().model("small-model", model).tool(weather());
//! let rebuilt = definition.builder(&registry)?.build()?;
//! assert_eq!(rebuilt.definition(), definition);
//! assert_eq!(rebuilt.run("Weather in Oslo?").await?.output, "Sunny in Oslo.");
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tower::Service;

use super::limits::{DEFAULT_MAX_ARGUMENT_BYTES, DEFAULT_MAX_RESULT_BYTES};
use super::{box_model, Agent, AgentBuilder, BoxModel, Handoff, ToolDef, ToolRouter};
use crate::error::{AgentError, BoxError};
use crate::request::ModelCall;
use crate::types::{ModelResponse, ModelSettings, ToolSpec};

/// An agent as data. See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentDefinition {
    /// The agent's name.
    pub name: String,
    /// Its system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// The model's name: the registry's model of that name runs it, and
    /// each request names it.
    pub model: String,
    /// Sampling and shape settings (the response format comes from
    /// `response_schema`).
    #[serde(default)]
    pub settings: ModelSettings,
    /// The tools, by name, with the spec the model sees.
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    /// The agents it may hand the run over to.
    #[serde(default)]
    pub handoffs: Vec<HandoffDefinition>,
    /// The JSON schema a final answer must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_schema: Option<Value>,
    /// How often a final answer that misses the schema is sent back.
    #[serde(default = "default_output_retries")]
    pub output_retries: u32,
    /// The most model turns a run may take.
    #[serde(default = "default_max_turns")]
    pub max_turns: u32,
    /// Whether a turn's tool calls run concurrently.
    #[serde(default = "default_true")]
    pub parallel_tool_calls: bool,
    /// The most bytes of arguments a tool call may send.
    #[serde(default = "default_max_argument_bytes")]
    pub max_tool_argument_bytes: usize,
    /// The most bytes of a tool result written into the conversation.
    #[serde(default = "default_max_result_bytes")]
    pub max_tool_result_bytes: usize,
    /// Whether the model reads a tool's panic message.
    #[serde(default)]
    pub show_tool_panics: bool,
}

/// A handoff as data: the target agent by name, and the tool the model
/// calls. The input filter is code and is not carried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandoffDefinition {
    /// The agent the run is handed to, by name.
    pub agent: String,
    /// The tool the model calls (`transfer_to_<name>` by default).
    pub tool_name: String,
    /// What the model reads about the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema of the handoff's reason.
    pub reason_schema: Value,
}

fn default_output_retries() -> u32 {
    2
}

fn default_max_turns() -> u32 {
    10
}

fn default_true() -> bool {
    true
}

fn default_max_argument_bytes() -> usize {
    DEFAULT_MAX_ARGUMENT_BYTES
}

fn default_max_result_bytes() -> usize {
    DEFAULT_MAX_RESULT_BYTES
}

/// What a process can rebuild agents with: model services by name, tools
/// by name, and the agents a definition may hand over to, by name.
///
/// # Clone
///
/// Cheap: the services are shared.
#[derive(Clone, Default)]
pub struct Registry {
    models: HashMap<String, BoxModel>,
    tools: HashMap<String, ToolDef>,
    agents: HashMap<String, Agent>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The model service that runs the model called `name`.
    pub fn model<S>(mut self, name: impl Into<String>, model: S) -> Self
    where
        S: Service<ModelCall, Response = ModelResponse> + Clone + Send + Sync + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        self.models.insert(name.into(), box_model(model));
        self
    }

    /// A tool, by its spec's name: a function tool, an
    /// [`AgentTool`](crate::AgentTool) or any [`ToolDef`].
    pub fn tool(mut self, tool: impl Into<ToolDef>) -> Self {
        let tool = tool.into();
        self.tools.insert(tool.spec.name.clone(), tool);
        self
    }

    /// Every tool of `router`.
    pub fn tools(mut self, router: &ToolRouter) -> Self {
        for spec in router.specs().iter() {
            if let Some(tool) = router.get(&spec.name) {
                self.tools.insert(spec.name.clone(), tool.clone());
            }
        }
        self
    }

    /// An agent a definition may hand the run over to, by its name.
    pub fn agent(mut self, agent: &Agent) -> Self {
        self.agents.insert(agent.name().to_string(), agent.clone());
        self
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |map: Vec<&String>| {
            let mut names: Vec<_> = map.into_iter().cloned().collect();
            names.sort();
            names
        };
        f.debug_struct("Registry")
            .field("models", &names(self.models.keys().collect()))
            .field("tools", &names(self.tools.keys().collect()))
            .field("agents", &names(self.agents.keys().collect()))
            .finish()
    }
}

/// Why a definition could not be rebuilt.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DefinitionError {
    /// The registry has no model of that name.
    #[error("agent `{agent}` runs on model `{model}`, which the registry does not have")]
    MissingModel {
        /// The agent.
        agent: String,
        /// The model.
        model: String,
    },
    /// The registry has no tool of that name.
    #[error("agent `{agent}` uses the tool `{tool}`, which the registry does not have")]
    MissingTool {
        /// The agent.
        agent: String,
        /// The tool.
        tool: String,
    },
    /// The registry's tool of that name takes other arguments.
    #[error(
        "agent `{agent}` uses the tool `{tool}` with other arguments than the registry's tool takes"
    )]
    ToolMismatch {
        /// The agent.
        agent: String,
        /// The tool.
        tool: String,
    },
    /// The registry has no agent of that name to hand over to.
    #[error("agent `{agent}` hands over to agent `{target}`, which the registry does not have")]
    MissingAgent {
        /// The agent.
        agent: String,
        /// The handoff's target.
        target: String,
    },
    /// The agent did not build (a response schema that does not compile, a
    /// limit of 0, ...).
    #[error(transparent)]
    Build(#[from] AgentError),
}

impl AgentDefinition {
    /// A builder for the agent, its services taken from `registry`: add
    /// middleware, tool layers or an approver, then
    /// [`build`](AgentBuilder::build).
    ///
    /// # Errors
    ///
    /// A [`DefinitionError`] naming the model, tool or agent that the
    /// registry lacks, or the tool whose arguments differ.
    pub fn builder(&self, registry: &Registry) -> Result<AgentBuilder, DefinitionError> {
        let agent = || self.name.clone();
        let model =
            registry
                .models
                .get(&self.model)
                .ok_or_else(|| DefinitionError::MissingModel {
                    agent: agent(),
                    model: self.model.clone(),
                })?;
        let mut builder = Agent::builder(self.name.as_str())
            .model(model.clone())
            .model_name(self.model.as_str())
            .settings(self.settings.clone())
            .output_retries(self.output_retries)
            .max_turns(self.max_turns)
            .parallel_tool_calls(self.parallel_tool_calls)
            .max_tool_argument_bytes(self.max_tool_argument_bytes)
            .max_tool_result_bytes(self.max_tool_result_bytes)
            .show_tool_panics(self.show_tool_panics);
        if let Some(instructions) = &self.instructions {
            builder = builder.instructions(instructions.as_str());
        }
        if let Some(schema) = &self.response_schema {
            builder = builder.response_schema(schema.clone());
        }
        for spec in &self.tools {
            let tool =
                registry
                    .tools
                    .get(&spec.name)
                    .ok_or_else(|| DefinitionError::MissingTool {
                        agent: agent(),
                        tool: spec.name.clone(),
                    })?;
            if tool.spec.parameters != spec.parameters {
                return Err(DefinitionError::ToolMismatch {
                    agent: agent(),
                    tool: spec.name.clone(),
                });
            }
            builder = builder.tool(tool.clone());
        }
        for handoff in &self.handoffs {
            let target = registry.agents.get(&handoff.agent).ok_or_else(|| {
                DefinitionError::MissingAgent {
                    agent: agent(),
                    target: handoff.agent.clone(),
                }
            })?;
            let mut rebuilt = Handoff::to(target)
                .tool_name(handoff.tool_name.as_str())
                .reason_schema(handoff.reason_schema.clone());
            if let Some(description) = &handoff.description {
                rebuilt = rebuilt.description(description.as_str());
            }
            builder = builder.handoff(rebuilt);
        }
        Ok(builder)
    }

    /// The agent, its services taken from `registry`, without middleware.
    ///
    /// # Errors
    ///
    /// See [`builder`](Self::builder); and the agent's build error.
    pub fn build(&self, registry: &Registry) -> Result<Agent, DefinitionError> {
        Ok(self.builder(registry)?.build()?)
    }
}

impl Agent {
    /// The agent as data, to send to another process. See
    /// [`definition`](crate::service::definition).
    pub fn definition(&self) -> AgentDefinition {
        let config = &self.config;
        let handoffs: Vec<HandoffDefinition> = config
            .handoffs
            .iter()
            .map(|h| HandoffDefinition {
                agent: h.target().name().to_string(),
                tool_name: h.tool_name.clone(),
                description: h.about().map(str::to_owned),
                reason_schema: h.schema.clone(),
            })
            .collect();
        let tools = config
            .specs
            .iter()
            .filter(|s| !handoffs.iter().any(|h| h.tool_name == s.name))
            .cloned()
            .collect();
        let mut settings = ModelSettings::clone(&config.settings);
        if config.output.is_some() {
            settings.response_format = None;
        }
        AgentDefinition {
            name: config.name.to_string(),
            instructions: config.instructions.clone(),
            model: config.model_name.to_string(),
            settings,
            tools,
            handoffs,
            response_schema: config.output.as_ref().map(|o| o.schema().clone()),
            output_retries: config
                .output
                .as_ref()
                .map_or(default_output_retries(), |o| o.retries),
            max_turns: config.max_turns,
            parallel_tool_calls: config.parallel_tool_calls,
            max_tool_argument_bytes: config.limits.max_argument_bytes,
            max_tool_result_bytes: config.limits.max_result_bytes,
            show_tool_panics: config.limits.show_panics,
        }
    }
}
