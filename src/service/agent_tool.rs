use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use serde_json::json;
use tower::{Service, ServiceExt};

use super::ToolDef;
use crate::error::BoxError;
use crate::request::{RunRequest, ToolInvocation, ToolOutput};
use crate::types::{AgentRun, RunStatus, ToolSpec};

/// Any run service — an [`Agent`](crate::Agent), layered or not — used as a
/// tool.
///
/// The model calls it with `{"input": "..."}`. The nested run gets a child
/// of the calling run's context: the parent run id, a child cancellation
/// token, the same event sink and the same hook points, so the parent's
/// middleware brackets the nested run too. Its usage is recorded once, into
/// its own ledger and into the parent's total, and a
/// [`tripwire`](crate::tripwire) inside it stops the parent run as well.
///
/// The sub-agent answers its caller and returns; to let another agent run
/// the rest of the conversation instead, hand the run over to it
/// ([`Handoff`](crate::Handoff); [`handoff`](crate::service::handoff)
/// compares the two side by side).
///
/// ```
/// use tower_agent::{Agent, AgentTool, ScriptedModel, ScriptedTurn, ToolRouter};
///
/// # fn main() -> Result<(), tower_agent::AgentError> {
/// let researcher = Agent::builder("researcher")
///     .model(ScriptedModel::new([ScriptedTurn::text("Paris")]))
///     .build()?;
/// let tools = ToolRouter::new().tool(AgentTool::new("research", "Looks things up", researcher));
/// assert_eq!(tools.specs()[0].name, "research");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct AgentTool<S> {
    spec: Arc<ToolSpec>,
    agent: S,
}

impl<S> AgentTool<S> {
    /// A tool called `name` that runs `agent` on the model's `input`.
    pub fn new(name: impl Into<String>, description: impl Into<String>, agent: S) -> Self {
        let spec = ToolSpec::new(
            name,
            description,
            json!({
                "type": "object",
                "properties": {"input": {"type": "string", "description": "The task for the agent."}},
                "required": ["input"],
                "additionalProperties": false
            }),
        );
        Self {
            spec: Arc::new(spec),
            agent,
        }
    }

    inner_accessors!(agent: S);
}

impl<S> fmt::Debug for AgentTool<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentTool")
            .field("name", &self.spec.name)
            .finish_non_exhaustive()
    }
}

impl<S> Service<ToolInvocation> for AgentTool<S>
where
    S: Service<RunRequest, Response = AgentRun> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = ToolOutput;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<ToolOutput, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.agent.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, invocation: ToolInvocation) -> Self::Future {
        // Take the service that was made ready; leave a fresh clone behind.
        let clone = self.agent.clone();
        let agent = std::mem::replace(&mut self.agent, clone);
        Box::pin(async move {
            let input = match invocation.args.get("input").and_then(|v| v.as_str()) {
                Some(input) => input.to_owned(),
                None => {
                    return Ok(ToolOutput::error(
                        "call this agent with {\"input\": \"<the task>\"}",
                    ))
                }
            };
            let request = RunRequest::new(input).context(invocation.context.child());
            let run = agent.oneshot(request).await.map_err(Into::into)?;
            Ok(match run.status {
                RunStatus::Completed => ToolOutput::text(run.output),
                RunStatus::Stopped(stop) => {
                    ToolOutput::text(format!("The agent stopped: {}", stop.reason))
                }
                RunStatus::Paused(checkpoint) => ToolOutput::error(format!(
                    "The agent paused with {} call(s) waiting for approval",
                    checkpoint.pending.len()
                )),
            })
        })
    }
}

impl<S> From<AgentTool<S>> for ToolDef
where
    S: Service<RunRequest, Response = AgentRun> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    fn from(tool: AgentTool<S>) -> Self {
        ToolDef::new(ToolSpec::clone(&tool.spec), tool)
    }
}
