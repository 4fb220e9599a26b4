//! What the guardrails share: their configuration, the [`OutputWindow`],
//! and running a target's guards in order with each guard's fail policy.

use std::sync::Arc;

use serde_json::{json, Value};

use super::guard::{Guard, GuardTarget};
use super::stream::GuardVerdict;
use crate::context::RunContext;
use crate::error::{tripwire_with, BoxError};
use crate::lifecycle::FailPolicy;

/// How the output guards see a streamed answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputWindow {
    /// Segment by segment, as the text streams (the default): each segment
    /// (up to a sentence end, at most `max_hold` bytes) is checked and
    /// released; only the segment being checked is held back. What reaches
    /// the sink equals the guarded full text, for any chunking.
    Segments {
        /// The longest segment, in bytes.
        max_hold: usize,
    },
    /// The whole answer at once, after the model answered (`after_model`):
    /// the run holds the turn's stream and sends the guarded text in one
    /// piece. For guards that must read everything (a judge of the whole
    /// answer).
    Turn,
}

/// Why a check stopped the text.
pub(crate) enum Stop {
    /// A guard blocked it.
    Blocked {
        guard: Arc<str>,
        reason: String,
        info: Option<Value>,
    },
    /// A fail-closed guard could not answer.
    Failed(BoxError),
}

impl Stop {
    /// The error the run fails with: a tripwire naming the guard, what it
    /// checked and, for a stream, how many bytes had been released.
    pub(crate) fn into_error(self, target: GuardTarget<'_>, released: Option<usize>) -> BoxError {
        match self {
            Stop::Failed(err) => err,
            Stop::Blocked {
                guard,
                reason,
                info,
            } => {
                let mut details = match info {
                    Some(Value::Object(map)) => map,
                    Some(other) => [("details".to_owned(), other)].into_iter().collect(),
                    None => serde_json::Map::new(),
                };
                details.insert("guard".into(), json!(&*guard));
                details.insert("target".into(), json!(target.as_str()));
                if let Some(tool) = target.tool() {
                    details.insert("tool".into(), json!(tool));
                }
                if let Some(bytes) = released {
                    details.insert("released_bytes".into(), json!(bytes));
                }
                tripwire_with(reason, Value::Object(details)).into()
            }
        }
    }
}

pub(crate) type Guards = Arc<[Arc<dyn Guard>]>;

/// What every clone shares.
pub(crate) struct Config {
    pub(crate) name: Arc<str>,
    pub(crate) input: Guards,
    pub(crate) output: Guards,
    pub(crate) tool_arguments: Guards,
    pub(crate) tool_results: Guards,
    pub(crate) parallel: bool,
    pub(crate) window: OutputWindow,
}

impl Config {
    /// Runs `guards` over `text` in order, each on what the one before left:
    /// `Some` is the rewritten text. A guard that fails is skipped when it
    /// fails open; the `guard_failed` event says which happened.
    pub(crate) async fn check(
        &self,
        ctx: &RunContext,
        guards: &[Arc<dyn Guard>],
        target: GuardTarget<'_>,
        text: &str,
    ) -> Result<Option<String>, Stop> {
        let mut current: Option<String> = None;
        for guard in guards {
            let seen = current.as_deref().unwrap_or(text);
            match guard.check(ctx, target, seen).await {
                Ok(GuardVerdict::Pass) => {}
                Ok(GuardVerdict::Rewrite(text)) => current = Some(text),
                Ok(GuardVerdict::Block { reason, info }) => {
                    return Err(Stop::Blocked {
                        guard: Arc::from(guard.name()),
                        reason,
                        info,
                    })
                }
                Err(err) => {
                    let policy = guard.fail_policy();
                    let outcome = match policy {
                        FailPolicy::Open => "failed_open",
                        FailPolicy::Closed => "failed_closed",
                    };
                    tracing::warn!(
                        target: "tower_agent",
                        guard = guard.name(),
                        target = target.as_str(),
                        outcome,
                        error = %err,
                        "guard failed"
                    );
                    ctx.log_event(
                        "guard_failed",
                        json!({
                            "middleware": &*self.name,
                            "guard": guard.name(),
                            "target": target.as_str(),
                            "tool": target.tool(),
                            "outcome": outcome,
                            "error": err.to_string(),
                        }),
                    );
                    if policy == FailPolicy::Closed {
                        return Err(Stop::Failed(err));
                    }
                }
            }
        }
        Ok(current)
    }
}
