use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{Cost, History, Message, ToolCall, Usage};

/// The result of a run: what it said, what it cost and how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRun {
    /// The run's id.
    pub run_id: Arc<str>,
    /// The agent that ran it.
    pub agent: Arc<str>,
    /// The conversation: the history it started from, the input and every
    /// message of the run (context added for one run only is left out).
    /// Shared, not copied: pass it back as the next run's history and that
    /// run appends to it in place.
    pub messages: History,
    /// The final answer's text (empty unless completed).
    pub output: String,
    /// The final answer parsed and validated against the response schema.
    pub structured: Option<Value>,
    /// The usage of this run's own model calls.
    pub usage: Usage,
    /// The usage of this run and every run nested in it.
    pub usage_total: Usage,
    /// The priced cost of this run and every run nested in it, when the run
    /// has a price table (a budget layer sets one).
    #[serde(default)]
    pub cost: Option<Cost>,
    /// How much the run did.
    pub counters: Counters,
    /// How it ended.
    pub status: RunStatus,
}

impl AgentRun {
    /// Whether the run completed with a final answer.
    pub fn is_completed(&self) -> bool {
        matches!(self.status, RunStatus::Completed)
    }

    /// The checkpoint of a paused run.
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        match &self.status {
            RunStatus::Paused(checkpoint) => Some(checkpoint),
            _ => None,
        }
    }
}

/// How much a run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Model calls the run made (a retried or fallen-back call counts once
    /// here; the usage ledger has one entry per attempt).
    pub model_calls: u32,
    /// Tool calls that ran.
    pub tool_calls: u32,
    /// Turns taken.
    pub turns: u32,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum RunStatus {
    /// With a final answer.
    Completed,
    /// Before its next model call, because something asked it to stop.
    Stopped(StopReason),
    /// With tool calls waiting for a decision; resume from the checkpoint.
    Paused(Box<Checkpoint>),
}

impl RunStatus {
    /// `completed`, `stopped` or `paused`.
    pub fn as_str(&self) -> &'static str {
        match self {
            RunStatus::Completed => "completed",
            RunStatus::Stopped(_) => "stopped",
            RunStatus::Paused(_) => "paused",
        }
    }
}

/// Why a run stopped, and who asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopReason {
    /// The reason given.
    pub reason: String,
    /// The middleware (by name) or tool (`tool:<name>`) that asked.
    pub by: Option<String>,
}

/// A paused run, serializable so that it can be resumed in another process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The agent that ran it.
    pub agent: String,
    /// The run's id; the resumed run keeps it.
    pub run_id: String,
    /// The thread, if any.
    pub thread_id: Option<String>,
    /// The conversation up to and including the assistant turn whose calls
    /// wait.
    pub messages: Vec<Message>,
    /// Results of that turn's calls that already ran, by call index.
    pub completed: Vec<(usize, Message)>,
    /// The calls that wait for a decision.
    pub pending: Vec<PendingCall>,
    /// The turn the run paused in.
    pub iteration: u32,
    /// The run's own usage so far.
    pub usage: Usage,
    /// Its usage with nested runs so far.
    pub usage_total: Usage,
    /// Its counters so far.
    pub counters: Counters,
    /// Structured-output retries used so far.
    #[serde(default)]
    pub output_attempts: u32,
    /// The agent a handoff in the paused turn hands the run to, once the
    /// turn's calls have their results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<String>,
    /// The standing approvals a person gave ("always allow this tool",
    /// "always allow these arguments"), kept for the rest of the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<StickyApproval>,
}

/// A tool call that waits for a decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingCall {
    /// Its position in the assistant turn.
    pub index: usize,
    /// The call, with the arguments the decision is about.
    pub call: ToolCall,
    /// [`arguments_hash`] of those arguments.
    pub arguments_hash: String,
}

/// A decision about a waiting or asking tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalDecision {
    /// The call it is for.
    pub call_id: String,
    /// [`arguments_hash`] of the arguments it approves; a decision for other
    /// arguments is refused. `None` binds to the id alone.
    pub arguments_hash: Option<String>,
    /// Approved or not.
    pub approved: bool,
    /// Why, for a decline; the model reads it.
    pub reason: Option<String>,
    /// How long an approval stands: this call only (the default), or from
    /// now on for the tool or for these arguments. A decline is never
    /// remembered.
    #[serde(default, skip_serializing_if = "ApprovalScope::is_once")]
    pub scope: ApprovalScope,
}

/// How long an approval stands: see [`ApprovalDecision::scope`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalScope {
    /// This call only.
    #[default]
    Once,
    /// Every later call of the tool in the run and its thread ("always
    /// allow this tool").
    Tool,
    /// Every later call of the tool with the same arguments (by
    /// [`arguments_hash`]) in the run and its thread ("always allow these
    /// arguments").
    Arguments,
}

impl ApprovalScope {
    /// Whether it is [`ApprovalScope::Once`].
    pub fn is_once(&self) -> bool {
        matches!(self, ApprovalScope::Once)
    }
}

/// A standing approval: calls of `tool` (with arguments of
/// `arguments_hash`, when set) are approved without asking. Made from an
/// [`ApprovalDecision`] whose [`scope`](ApprovalDecision::scope) is not
/// `Once`; see [`StickyApprovals`](crate::hooks::StickyApprovals).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StickyApproval {
    /// The tool it approves.
    pub tool: String,
    /// [`arguments_hash`] of the arguments it approves; `None`: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_hash: Option<String>,
}

impl StickyApproval {
    /// What `decision`, made for `call`, leaves standing: `None` for a
    /// decline or a decision for this call only.
    pub fn from_decision(call: &ToolCall, decision: &ApprovalDecision) -> Option<Self> {
        if !decision.approved {
            return None;
        }
        let arguments_hash = match decision.scope {
            ApprovalScope::Once => return None,
            ApprovalScope::Tool => None,
            ApprovalScope::Arguments => Some(arguments_hash(&call.arguments)),
        };
        Some(Self {
            tool: call.name.clone(),
            arguments_hash,
        })
    }

    /// Whether it approves `call`.
    pub fn covers(&self, call: &ToolCall) -> bool {
        self.tool == call.name
            && self
                .arguments_hash
                .as_ref()
                .is_none_or(|hash| *hash == arguments_hash(&call.arguments))
    }
}

impl ApprovalDecision {
    /// Approves the call `call`, bound to its arguments.
    pub fn approve(call: &ToolCall) -> Self {
        Self {
            call_id: call.id.clone(),
            arguments_hash: Some(arguments_hash(&call.arguments)),
            approved: true,
            reason: None,
            scope: ApprovalScope::Once,
        }
    }

    /// Makes an approval stand for every later call of the tool, in the run
    /// and its thread: "always allow this tool".
    pub fn always(mut self) -> Self {
        self.scope = ApprovalScope::Tool;
        self
    }

    /// Makes an approval stand for every later call of the tool with the
    /// same arguments: "always allow these arguments".
    pub fn always_for_arguments(mut self) -> Self {
        self.scope = ApprovalScope::Arguments;
        self
    }

    /// Declines the call `call` with a reason the model reads.
    pub fn decline(call: &ToolCall, reason: impl Into<String>) -> Self {
        Self {
            call_id: call.id.clone(),
            arguments_hash: Some(arguments_hash(&call.arguments)),
            approved: false,
            reason: Some(reason.into()),
            scope: ApprovalScope::Once,
        }
    }
}

/// A stable hex SHA-256 of a call's arguments. Valid JSON is hashed in a
/// canonical form (keys sorted, no spaces), so formatting does not matter.
pub fn arguments_hash(arguments: &str) -> String {
    let canonical = serde_json::from_str::<Value>(arguments)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| arguments.to_owned());
    let digest = Sha256::digest(canonical.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_hash_ignores_formatting_only() {
        assert_eq!(
            arguments_hash(r#"{"b":1,"a":2}"#),
            arguments_hash(r#"{ "a": 2, "b": 1 }"#)
        );
        assert_ne!(arguments_hash(r#"{"a":1}"#), arguments_hash(r#"{"a":2}"#));
        assert_eq!(arguments_hash("not json").len(), 64);
    }

    #[test]
    fn standing_approvals_bind_to_the_tool_or_the_arguments() {
        let call = ToolCall::new("c1", "pay", r#"{"id": 1}"#);
        let other_args = ToolCall::new("c2", "pay", r#"{"id": 2}"#);
        let other_tool = ToolCall::new("c3", "refund", r#"{"id": 1}"#);
        let once = ApprovalDecision::approve(&call);
        assert_eq!(StickyApproval::from_decision(&call, &once), None);
        let declined = ApprovalDecision::decline(&call, "no").always();
        assert_eq!(StickyApproval::from_decision(&call, &declined), None);

        let tool = StickyApproval::from_decision(&call, &once.clone().always()).unwrap();
        assert!(tool.covers(&call) && tool.covers(&other_args) && !tool.covers(&other_tool));
        let args = StickyApproval::from_decision(&call, &once.always_for_arguments()).unwrap();
        assert!(args.covers(&ToolCall::new("c9", "pay", r#"{ "id": 1 }"#)));
        assert!(!args.covers(&other_args) && !args.covers(&other_tool));

        // The scope is left out of the JSON of a one-off decision, and read back.
        let json = serde_json::to_value(ApprovalDecision::approve(&call).always()).unwrap();
        assert_eq!(json["scope"], "tool");
        let back: ApprovalDecision = serde_json::from_value(json).unwrap();
        assert_eq!(back.scope, ApprovalScope::Tool);
        let once = serde_json::to_value(ApprovalDecision::approve(&call)).unwrap();
        assert!(once.get("scope").is_none());
    }
}
