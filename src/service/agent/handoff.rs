//! Handoffs: the model hands the run over to another agent, which runs the
//! rest of it.
//!
//! Each [`Handoff`] an agent has becomes a tool the model sees,
//! `transfer_to_<name>`, with an optional reason. When the model calls it,
//! the run goes on *as the target agent*: from the next turn on, its
//! instructions (in place of the system prompt), its model, its tools, its
//! response schema and its own middleware, with the transcript so far
//! (through the handoff's [input filter](Handoff::input_filter), if it has
//! one). [`RunContext::agent_name`](crate::RunContext::agent_name) names the
//! agent the run is now, the [`AgentEvent::Handoff`] event records the move,
//! and [`AgentRun::agent`](crate::AgentRun::agent) is the agent that
//! answered.
//!
//! ```
//! use tower_agent::{Agent, Handoff, ScriptedModel, ScriptedTurn};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::AgentError> {
//! let billing = Agent::builder("billing")
//!     .instructions("You sort out invoices.")
//!     .model(ScriptedModel::new([ScriptedTurn::text("Your invoice is on its way.")]))
//!     .build()?;
//! let triage = Agent::builder("triage")
//!     .instructions("You send each customer to the right desk.")
//!     .model(ScriptedModel::new([ScriptedTurn::tool_call(
//!         "transfer_to_billing",
//!         r#"{"reason": "an invoice question"}"#,
//!     )]))
//!     .handoff(Handoff::to(&billing).description("Invoices and payments"))
//!     .build()?;
//!
//! let run = triage.run("Where is my invoice?").await?;
//! assert_eq!(run.agent.as_ref(), "billing");
//! assert_eq!(run.output, "Your invoice is on its way.");
//! // The system prompt is billing's now.
//! assert_eq!(run.messages[0].text(), "You sort out invoices.");
//! # Ok(()) }
//! ```
//!
//! # A handoff or an [`AgentTool`](crate::AgentTool)?
//!
//! | | handoff | `AgentTool` |
//! | --- | --- | --- |
//! | who answers the user | the target agent, for the rest of the run | the calling agent; the sub-agent answers it |
//! | the conversation | the target reads the transcript so far (filtered, if asked) | the sub-agent reads only its `input` |
//! | the run | one run, one run id, one `AgentRun` | a nested run with its own id, its usage rolled up |
//! | instructions, model, tools | the target's, from the next turn | the caller's stay; the sub-agent uses its own inside |
//! | middleware | the runtime's and the run's stay; the target's own replace the first agent's | the nested run inherits all of the caller's, inside them its own |
//! | `before_agent` / `after_agent` | once for the run, by the middleware in place when it started | once more for the nested run |
//! | when it fits | triage, escalation, a specialist taking over | a question to an expert, a step of a plan |
//!
//! # Hooks
//!
//! A handoff call is answered by the run loop, not by the tool stack: no
//! `before_tool`, approval or `wrap_tool` sees it, and it does not count as
//! a tool call. When the target has another model (its
//! [`model_name`](crate::AgentBuilder::model_name) differs),
//! `before_model_switch` is asked first; a middleware that answers `false`
//! keeps the run where it is, and the model reads that the handoff was
//! refused ([`AgentEvent::HandoffRefused`]).
//!
//! `before_agent` and `after_agent` bracket the run once: they belong to the
//! middleware in place when it started (the runtime's, the first agent's and
//! the run's), and `after_agent` runs exactly once, at the end, whichever
//! agent answered. The target's own middleware joins for the turns of the
//! run handed over to it: from the next turn on, every hook point sees it
//! (`before_run` for [queued messages](crate::RunHandle), `before_model`,
//! `wrap_model`, the tool hooks, `before_stop`, ...) in the agent's place,
//! inside the runtime's and outside the run's.
//!
//! A paused run that had been handed over resumes as the agent it was handed
//! to: resume it through the agent it started with (or through that agent).

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use schemars::JsonSchema;
use serde_json::{json, Value};

use super::state::{Decided, Run};
use super::{Agent, Config};
use crate::error::AgentError;
use crate::event::AgentEvent;
use crate::types::{History, Message, Role, ToolCall, ToolSpec};

/// What a handoff's [input filter](Handoff::input_filter) gets: the
/// transcript so far, and who hands it to whom.
#[derive(Debug, Clone)]
pub struct HandoffInput {
    /// The agent handing the run over.
    pub from: Arc<str>,
    /// The agent taking it.
    pub to: Arc<str>,
    /// The conversation so far, with the target's system prompt first and
    /// the handoff call answered.
    pub history: History,
}

type InputFilter = dyn Fn(HandoffInput) -> History + Send + Sync;

/// A handoff to another agent, offered to the model as the tool
/// `transfer_to_<name>`. See the [module docs](self).
///
/// # Clone
///
/// Cheap: the target agent and the filter are shared.
#[derive(Clone)]
pub struct Handoff {
    pub(super) target: Agent,
    pub(super) tool_name: String,
    description: Option<String>,
    pub(super) schema: Value,
    validator: Option<Arc<jsonschema::Validator>>,
    filter: Option<Arc<InputFilter>>,
}

impl Handoff {
    /// A handoff to `agent`, called `transfer_to_<name>` (the agent's name
    /// in lower case, other characters than letters, digits, `_` and `-` as
    /// `_`), with an optional `reason` string.
    pub fn to(agent: &Agent) -> Self {
        Self {
            tool_name: default_tool_name(agent.name()),
            target: agent.clone(),
            description: None,
            schema: json!({
                "type": "object",
                "properties": {
                    "reason": {
                        "type": "string",
                        "description": "Why the conversation goes to this agent."
                    }
                },
                "additionalProperties": false
            }),
            validator: None,
            filter: None,
        }
    }

    /// The tool's name instead of `transfer_to_<name>`.
    pub fn tool_name(mut self, name: impl Into<String>) -> Self {
        self.tool_name = name.into();
        self
    }

    /// What the model reads about the target, for when to hand over.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// The reason's type: the model fills in `T`'s JSON schema, and a reason
    /// that does not match it is refused with what is wrong (the model may
    /// try again). The parsed value is in the [`AgentEvent::Handoff`] event.
    pub fn reason<T: JsonSchema>(self) -> Self {
        self.reason_schema(super::super::tool_fn::parameters_schema::<T>())
    }

    /// The reason's JSON schema (an object schema), for a reason described
    /// in data rather than a Rust type.
    pub fn reason_schema(mut self, schema: Value) -> Self {
        self.schema = schema;
        self
    }

    /// Changes the transcript the target reads: `filter` gets it (and who
    /// hands over to whom) and returns the history the run goes on with.
    /// Every tool call in it must still have its result.
    pub fn input_filter<F>(mut self, filter: F) -> Self
    where
        F: Fn(HandoffInput) -> History + Send + Sync + 'static,
    {
        self.filter = Some(Arc::new(filter));
        self
    }

    /// The agent the run is handed to.
    pub fn target(&self) -> &Agent {
        &self.target
    }

    /// The tool the model calls.
    pub fn spec(&self) -> ToolSpec {
        let name = self.target.name();
        let description = match &self.description {
            Some(about) => format!("Hand the conversation over to the agent `{name}`: {about}"),
            None => format!("Hand the conversation over to the agent `{name}`."),
        };
        ToolSpec::new(self.tool_name.clone(), description, self.schema.clone())
    }

    /// The description given with [`description`](Self::description).
    pub(super) fn about(&self) -> Option<&str> {
        self.description.as_deref()
    }

    /// Compiles the reason's schema.
    pub(super) fn compile(mut self) -> Result<Self, AgentError> {
        let validator = jsonschema::validator_for(&self.schema).map_err(|e| {
            AgentError::Config(format!(
                "the reason schema of handoff `{}` does not compile: {e}",
                self.tool_name
            ))
        })?;
        self.validator = Some(Arc::new(validator));
        Ok(self)
    }

    /// The call's reason, or what is wrong with it, worded for the model.
    fn parse(&self, arguments: &str) -> Result<Value, String> {
        let arguments = arguments.trim();
        let value: Value = if arguments.is_empty() {
            json!({})
        } else {
            serde_json::from_str(arguments)
                .map_err(|e| format!("The arguments are not valid JSON ({e})."))?
        };
        if let Some(validator) = &self.validator {
            let problems: Vec<String> = validator
                .iter_errors(&value)
                .map(|e| e.to_string())
                .collect();
            if !problems.is_empty() {
                return Err(format!(
                    "The arguments do not match the schema: {}.",
                    problems.join("; ")
                ));
            }
        }
        Ok(value)
    }
}

impl From<&Agent> for Handoff {
    fn from(agent: &Agent) -> Self {
        Handoff::to(agent)
    }
}

impl From<Agent> for Handoff {
    fn from(agent: Agent) -> Self {
        Handoff::to(&agent)
    }
}

impl fmt::Debug for Handoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handoff")
            .field("to", self.target.name())
            .field("tool_name", &self.tool_name)
            .field("input_filter", &self.filter.is_some())
            .finish_non_exhaustive()
    }
}

/// `transfer_to_<name>`.
fn default_tool_name(agent: &str) -> String {
    let name: String = agent
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("transfer_to_{name}")
}

/// The agent called `name` among those `config` may hand over to, directly
/// or through the agents they hand over to.
pub(super) fn find_agent(config: &Config, name: &str) -> Option<Agent> {
    let mut seen = HashSet::new();
    let mut queue: Vec<Agent> = config.handoffs.iter().map(|h| h.target.clone()).collect();
    while let Some(agent) = queue.pop() {
        if **agent.name() == *name {
            return Some(agent);
        }
        if seen.insert(agent.name().clone()) {
            queue.extend(agent.config.handoffs.iter().map(|h| h.target.clone()));
        }
    }
    None
}

impl Run {
    /// Answers the handoff calls among `calls` and returns the others. The
    /// first handoff that is allowed is kept for after the step; later ones
    /// are refused.
    pub(super) async fn answer_handoffs(
        &mut self,
        calls: Vec<(usize, ToolCall)>,
    ) -> Result<(Vec<(usize, ToolCall)>, Vec<(usize, Message)>), AgentError> {
        if self.config.handoffs.is_empty() {
            return Ok((calls, Vec::new()));
        }
        let mut tools = Vec::with_capacity(calls.len());
        let mut answered = Vec::new();
        for (index, call) in calls {
            let Some(at) = self
                .config
                .handoffs
                .iter()
                .position(|h| h.tool_name == call.name)
            else {
                tools.push((index, call));
                continue;
            };
            let text = self.decide(at, &call).await?;
            answered.push((index, Message::tool(call.id.as_str(), text)));
        }
        Ok((tools, answered))
    }

    /// Decides one handoff call: what the model reads.
    async fn decide(&mut self, at: usize, call: &ToolCall) -> Result<String, AgentError> {
        let config = self.config.clone();
        let handoff = &config.handoffs[at];
        let to = handoff.target.name();
        if let Some(decided) = &self.handoff {
            let taken = config.handoffs[decided.handoff].target.name();
            return Ok(self.refuse(
                handoff,
                call,
                format!("The run is already handed over to `{taken}` in this turn."),
            ));
        }
        let reason = match handoff.parse(&call.arguments) {
            Ok(reason) => reason,
            Err(problem) => return Ok(self.refuse(handoff, call, problem)),
        };
        let from_model = config.model_name.as_str();
        let to_model = handoff.target.config.model_name.as_str();
        if from_model != to_model {
            if let Some(hooks) = &self.hooks {
                let allowed = hooks
                    .before_model_switch(&self.ctx, from_model, to_model)
                    .await
                    .map_err(super::state::classify)?;
                if !allowed {
                    return Ok(self.refuse(
                        handoff,
                        call,
                        format!(
                            "The handoff to `{to}` was refused: it would move the run from model \
                             `{from_model}` to `{to_model}`. Go on without it."
                        ),
                    ));
                }
            }
        }
        self.handoff = Some(Box::new(Decided {
            handoff: at,
            call_id: call.id.clone(),
            reason: Some(reason).filter(|r| r.as_object().is_none_or(|o| !o.is_empty())),
        }));
        Ok(format!("Transferred to `{to}`: it goes on from here."))
    }

    fn refuse(&self, handoff: &Handoff, call: &ToolCall, reason: String) -> String {
        let ctx = &self.ctx;
        tracing::debug!(call_id = %call.id, to = %handoff.target.name(), %reason, "handoff refused");
        ctx.emit(|| AgentEvent::HandoffRefused {
            run_id: ctx.run_id().clone(),
            from: self.config.name.clone(),
            to: handoff.target.name().clone(),
            call_id: call.id.clone(),
            reason: reason.clone(),
        });
        reason
    }

    /// Applies the handoff the step decided on, if any.
    pub(super) fn finish_handoff(&mut self) -> Result<(), AgentError> {
        let Some(decided) = self.handoff.take() else {
            return Ok(());
        };
        let config = self.config.clone();
        let handoff = &config.handoffs[decided.handoff];
        let target = handoff.target.clone();
        swap_prompt(
            &mut self.messages,
            config.instructions.as_deref(),
            target.config.instructions.as_deref(),
        );
        if let Some(filter) = &handoff.filter {
            let filtered = filter(HandoffInput {
                from: config.name.clone(),
                to: target.config.name.clone(),
                history: self.messages.clone(),
            });
            filtered
                .check_integrity()
                .map_err(AgentError::HistoryIntegrity)?;
            self.messages = filtered;
        }
        self.switch_to(&target);
        let ctx = &self.ctx;
        tracing::info!(
            target: "tower_agent",
            run_id = %ctx.run_id(),
            from = %config.name,
            to = %target.config.name,
            "handoff"
        );
        ctx.emit(|| AgentEvent::Handoff {
            run_id: ctx.run_id().clone(),
            from: config.name.clone(),
            to: target.config.name.clone(),
            call_id: decided.call_id,
            reason: decided.reason,
        });
        Ok(())
    }

    /// The run goes on as `target`: its configuration, its own middleware
    /// in place of the agent's before, its name in the context.
    pub(super) fn switch_to(&mut self, target: &Agent) {
        self.hooks = crate::hooks::hand_over(&self.ctx, target.middleware.as_ref());
        self.ctx.hand_to_agent(&target.config.name);
        self.ctx
            .set_show_tool_panics(target.config.limits.show_panics);
        self.config = target.config.clone();
        self.model = None;
        self.output_attempts = 0;
    }

    /// Restores the decided handoff of a paused step, named in its
    /// checkpoint.
    pub(super) fn restore_handoff(&mut self, target: Option<&str>) {
        let Some(target) = target else { return };
        if let Some(at) = self
            .config
            .handoffs
            .iter()
            .position(|h| **h.target.name() == *target)
        {
            self.handoff = Some(Box::new(Decided {
                handoff: at,
                call_id: String::new(),
                reason: None,
            }));
        }
    }

    /// The name of the handoff the step decided on, for a checkpoint.
    pub(super) fn decided_target(&self) -> Option<String> {
        let decided = self.handoff.as_ref()?;
        Some(
            self.config.handoffs[decided.handoff]
                .target
                .name()
                .to_string(),
        )
    }
}

/// Puts the new agent's system prompt in place of the old one's.
fn swap_prompt(messages: &mut History, old: Option<&str>, new: Option<&str>) {
    let starts_with_old = old.is_some_and(|old| {
        messages
            .first()
            .is_some_and(|m| m.role == Role::System && m.text() == old)
    });
    match (starts_with_old, new) {
        (true, Some(new)) => messages.to_mut()[0] = Message::system(new),
        (true, None) => {
            messages.to_mut().remove(0);
        }
        (false, Some(new)) => messages.to_mut().insert(0, Message::system(new)),
        (false, None) => {}
    }
}
