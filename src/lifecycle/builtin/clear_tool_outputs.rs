//! [`ClearToolOutputsMiddleware`]: old or large tool results are replaced,
//! in what the model reads, by a short placeholder, and a built-in
//! [`recall_tool_output`](RECALL_TOOL) tool returns the original.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde_json::json;

use super::view::{lock, run_slot, View};
use crate::context::RunContext;
use crate::lifecycle::{Middleware, ModelNext, ToolNext, Wrapped};
use crate::request::{ModelCall, ToolInvocation, ToolOutput};
use crate::types::{History, Role, ToolSpec};

/// The name of the built-in tool that returns a cleared tool output.
pub const RECALL_TOOL: &str = "recall_tool_output";

/// The recall tool's spec.
fn recall_spec() -> ToolSpec {
    ToolSpec::new(
        RECALL_TOOL,
        "Returns the full output of an earlier tool call that was cleared from the \
         conversation to save space. Pass the id named in the placeholder.",
        json!({
            "type": "object",
            "properties": {"id": {"type": "string", "description": "The cleared output's id."}},
            "required": ["id"],
            "additionalProperties": false,
        }),
    )
}

/// Tools a request offered, and the same with the recall tool added.
type Offered = (Arc<[ToolSpec]>, Arc<[ToolSpec]>);

/// What the middleware keeps per run.
#[derive(Default)]
struct Cleared {
    view: View,
    /// Each cleared output's original, by the id of its call.
    originals: HashMap<String, String>,
    /// Tool results before this index were checked against the age rule.
    aged: usize,
    /// Tool results before this index were checked against the size rule.
    sized: usize,
    /// The tools last offered, and the same with the recall tool added.
    tools: Option<Offered>,
}

/// Replaces tool results, in what the model reads, by a placeholder naming
/// the call's id, its tool and arguments and how much was cut, once they
/// are older than [`keep_turns`](Self::keep_turns) model turns, or larger
/// than [`max_len`](Self::max_len) bytes once the model has read them once.
///
/// While anything is cleared, each request also offers the built-in
/// [`RECALL_TOOL`] tool, which the middleware answers itself with the
/// original (the router never sees it). The run keeps every original: only
/// the requests are changed, so the transcript and a paused run's
/// checkpoint hold them, and recall works after a resume (in this process
/// or another), from the first model turn of the resumed run.
///
/// # Cost and the prompt cache
///
/// A cleared output stays cleared with the same placeholder, so a turn
/// that clears nothing sends the previous request with the new messages
/// appended: the cached prefix moves only on the turns that clear, and such
/// a turn costs the messages it added. A turn that clears copies the
/// request once.
///
/// # Clone
///
/// Clones are the same middleware: they share what they keep per run.
///
/// # Example
///
/// ```
/// use tower_agent::lifecycle::builtin::{ClearToolOutputsMiddleware, RECALL_TOOL};
/// use tower_agent::lifecycle::MiddlewareStack;
/// use tower_agent::{tool_sync, Agent, BoxError, ScriptedModel, ScriptedTurn, ToolRouter};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::AgentError> {
/// let model = ScriptedModel::new([
///     ScriptedTurn::tool_call("fetch", "{}"),
///     ScriptedTurn::text("read it"),
///     ScriptedTurn::tool_call(RECALL_TOOL, r#"{"id": "call_1"}"#),
///     ScriptedTurn::text("done"),
/// ]);
/// let tools = ToolRouter::new().tool(tool_sync("fetch", "Fetches a page", |_: serde_json::Value| {
///     Ok::<_, BoxError>("a long page ".repeat(100))
/// }));
/// let clearing = ClearToolOutputsMiddleware::new().keep_turns(1);
/// let agent = Agent::builder("a")
///     .model(model.clone())
///     .tools(tools)
///     .middleware(MiddlewareStack::new().push(clearing))
///     .build()?;
/// let first = agent.run("fetch the page").await?;
/// let second = agent.run_with(tower_agent::RunRequest::new("read it again").history(first.messages)).await?;
/// assert_eq!(second.output, "done");
/// let requests = model.requests();
/// // The third request reads a placeholder, and is offered the recall tool.
/// let third = &requests[2];
/// assert!(third.messages.iter().any(|m| m.text().starts_with("[cleared")));
/// assert!(third.tools.iter().any(|t| t.name == RECALL_TOOL));
/// // The recall returned the original.
/// let recalled = requests[3].messages.last().unwrap().text().into_owned();
/// assert!(recalled.starts_with("a long page"));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ClearToolOutputsMiddleware {
    keep_turns: usize,
    max_len: Option<usize>,
    at_least: usize,
    id: Arc<()>,
}

impl ClearToolOutputsMiddleware {
    /// Clears results older than 3 turns, whatever their size.
    pub fn new() -> Self {
        Self {
            keep_turns: 3,
            max_len: None,
            at_least: 1,
            id: Arc::new(()),
        }
    }

    /// Clears results once `turns` model turns came after them (at least 1).
    pub fn keep_turns(mut self, turns: usize) -> Self {
        self.keep_turns = turns.max(1);
        self
    }

    /// Also clears results longer than `bytes`, once the model read them.
    pub fn max_len(mut self, bytes: usize) -> Self {
        self.max_len = Some(bytes);
        self
    }

    /// Waits until at least `results` results can be cleared, then clears
    /// them together (default 1): the cached prefix then moves once per
    /// batch.
    pub fn clear_at_least(mut self, results: usize) -> Self {
        self.at_least = results.max(1);
        self
    }

    fn slot(&self, ctx: &RunContext) -> Arc<std::sync::Mutex<Cleared>> {
        run_slot::<Cleared>(ctx, Arc::as_ptr(&self.id) as usize)
    }

    /// The request's messages and tools after clearing.
    fn clear(
        &self,
        ctx: &RunContext,
        input: &History,
        tools: &Arc<[ToolSpec]>,
    ) -> (History, Arc<[ToolSpec]>) {
        let slot = self.slot(ctx);
        let mut state = lock(&slot);
        let mut output = match state.view.extend(input) {
            Some(output) => output,
            None => {
                state.originals.clear();
                state.aged = 0;
                state.sized = 0;
                input.clone()
            }
        };
        let n = input.len();
        // Walk back to the `keep_turns`-th assistant turn from the end: results
        // before it are old. Results before the last one were read once.
        let mut turns = 0;
        let mut aged_until = 0;
        let mut read_until = None;
        for (k, message) in input.iter().rev().enumerate() {
            if message.role == Role::Assistant {
                turns += 1;
                read_until.get_or_insert(n - 1 - k);
                if turns == self.keep_turns {
                    aged_until = n - 1 - k;
                    break;
                }
            }
        }
        let read_until = read_until.unwrap_or(0);
        let mut newly = Vec::new();
        for i in state.aged..aged_until {
            let message = &input[i];
            if message.role == Role::Tool && !is_cleared(&state, message) {
                newly.push(i);
            }
        }
        if let Some(max_len) = self.max_len {
            for i in state.sized.max(aged_until)..read_until {
                let message = &input[i];
                if message.role == Role::Tool
                    && message.text_len() > max_len
                    && !is_cleared(&state, message)
                {
                    newly.push(i);
                }
            }
        }
        // Below the batch size, nothing is cleared and the same results are
        // looked at again next turn.
        let clears = newly.len() >= self.at_least;
        if clears {
            state.aged = state.aged.max(aged_until);
            if self.max_len.is_some() {
                state.sized = state.sized.max(read_until);
            }
            let messages = output.to_mut();
            for i in newly {
                let message = &input[i];
                let Some(id) = message.tool_call_id.clone() else {
                    continue;
                };
                if state.originals.contains_key(&id) {
                    continue;
                }
                let original = message.text().into_owned();
                messages[i].set_text(placeholder(input, i, &id, &original));
                state.originals.insert(id, original);
            }
        }
        state.view.set(input, &output);
        if state.originals.is_empty() {
            return (output, tools.clone());
        }
        let offered = match &state.tools {
            Some((from, with)) if Arc::ptr_eq(from, tools) => with.clone(),
            _ => {
                let mut with: Vec<ToolSpec> = tools
                    .iter()
                    .filter(|t| t.name != RECALL_TOOL)
                    .cloned()
                    .collect();
                with.push(recall_spec());
                let with: Arc<[ToolSpec]> = with.into();
                state.tools = Some((tools.clone(), with.clone()));
                with
            }
        };
        (output, offered)
    }

    fn recall(&self, invocation: &ToolInvocation) -> ToolOutput {
        let Some(id) = invocation.args.get("id").and_then(|v| v.as_str()) else {
            return ToolOutput::error(format!("{RECALL_TOOL} needs an `id` (a string)"));
        };
        let slot = self.slot(&invocation.context);
        let state = lock(&slot);
        match state.originals.get(id) {
            Some(original) => ToolOutput::text(original.clone()),
            None => ToolOutput::error(format!(
                "no cleared tool output has the id `{id}`; use an id from a placeholder"
            )),
        }
    }
}

/// Whether the result `message` is cleared already.
fn is_cleared(state: &Cleared, message: &crate::types::Message) -> bool {
    message
        .tool_call_id
        .as_ref()
        .is_some_and(|id| state.originals.contains_key(id))
}

/// What a cleared result reads: the call's id, its tool and arguments, and
/// how much was cut.
fn placeholder(history: &History, at: usize, id: &str, original: &str) -> String {
    let call = (0..at)
        .rev()
        .take(64)
        .find_map(|j| history[j].tool_calls.iter().find(|c| c.id == id).cloned());
    let what = match call {
        Some(call) => {
            let mut args: String = call.arguments.chars().take(80).collect();
            if args.len() < call.arguments.len() {
                args.push('…');
            }
            format!("the output of {}({args})", call.name)
        }
        None => "a tool output".to_owned(),
    };
    format!(
        "[cleared {what}: {} bytes, {} lines. Call {RECALL_TOOL} with id \"{id}\" to read it.]",
        original.len(),
        original.lines().count()
    )
}

impl Default for ClearToolOutputsMiddleware {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ClearToolOutputsMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClearToolOutputsMiddleware")
            .field("keep_turns", &self.keep_turns)
            .field("max_len", &self.max_len)
            .finish_non_exhaustive()
    }
}

impl Middleware for ClearToolOutputsMiddleware {
    fn name(&self) -> &str {
        "clear-tool-outputs"
    }

    fn wrap_model<'a>(&'a self, mut call: ModelCall, next: ModelNext) -> Wrapped<'a, ModelCall> {
        let (messages, tools) =
            self.clear(&call.context, &call.request.messages, &call.request.tools);
        call.request.messages = messages;
        call.request.tools = tools;
        Wrapped::next(call, next)
    }

    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> Wrapped<'a, ToolInvocation> {
        if invocation.call.name != RECALL_TOOL {
            return Wrapped::next(invocation, next);
        }
        let output = self.recall(&invocation);
        Wrapped::new(std::future::ready(Ok(output)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Message, ToolCall};

    /// Whether `message` is a placeholder the middleware wrote.
    fn is_placeholder(message: &Message) -> bool {
        message.role == Role::Tool && message.text().starts_with("[cleared ")
    }

    fn step(messages: &mut History, turn: usize, result: &str) {
        let id = format!("c{turn}");
        messages.push(Message::assistant_tool_calls(vec![ToolCall::new(
            id.as_str(),
            "lookup",
            format!(r#"{{"n": {turn}}}"#),
        )]));
        messages.push(Message::tool(id.as_str(), result));
    }

    #[test]
    fn old_results_are_cleared_once_and_the_request_is_extended_otherwise() {
        let clearing = ClearToolOutputsMiddleware::new().keep_turns(2);
        let ctx = RunContext::new();
        let tools: Arc<[ToolSpec]> = Arc::from([]);
        let mut history = History::from(vec![Message::user("go")]);
        step(&mut history, 1, "first result");
        let (out, offered) = clearing.clear(&ctx, &history, &tools);
        assert!(!out.iter().any(is_placeholder));
        assert!(offered.is_empty(), "nothing cleared, no recall tool");
        step(&mut history, 2, "second result");
        let (out, offered) = clearing.clear(&ctx, &history, &tools);
        // Two assistant turns came after the first result? One did: kept.
        assert!(!out.iter().any(is_placeholder));
        assert!(offered.is_empty());
        step(&mut history, 3, "third result");
        let (cleared, offered) = clearing.clear(&ctx, &history, &tools);
        assert_eq!(cleared.iter().filter(|m| is_placeholder(m)).count(), 1);
        assert_eq!(offered.len(), 1);
        assert!(
            cleared[2].text().contains("lookup({\"n\": 1})"),
            "{}",
            cleared[2].text()
        );
        assert!(cleared[2].text().contains("\"c1\""));
        assert_eq!(
            history[2].text(),
            "first result",
            "the run keeps the original"
        );
        history.push(Message::assistant("thinking"));
        history.push(Message::user("more"));
        let (next, again) = clearing.clear(&ctx, &history, &tools);
        assert!(Arc::ptr_eq(&again, &offered), "the same tools, not rebuilt");
        assert_eq!(next.iter().filter(|m| is_placeholder(m)).count(), 2);
        assert_eq!(next.check_integrity(), Ok(()));
    }

    #[test]
    fn large_results_are_cleared_once_read_and_recall_returns_them() {
        let clearing = ClearToolOutputsMiddleware::new()
            .keep_turns(100)
            .max_len(10);
        let ctx = RunContext::new();
        let tools: Arc<[ToolSpec]> = Arc::from([]);
        let mut history = History::from(vec![Message::user("go")]);
        step(&mut history, 1, "a result longer than ten bytes");
        let (out, _) = clearing.clear(&ctx, &history, &tools);
        assert!(!out.iter().any(is_placeholder), "not read yet");
        step(&mut history, 2, "short");
        let (out, _) = clearing.clear(&ctx, &history, &tools);
        assert_eq!(out.iter().filter(|m| is_placeholder(m)).count(), 1);

        let recall = |args: serde_json::Value| {
            let call = ToolCall::new("r1", RECALL_TOOL, args.to_string());
            clearing.recall(&ToolInvocation::new(call, ctx.clone()))
        };
        let output = recall(json!({"id": "c1"}));
        assert!(!output.is_error);
        assert_eq!(output.content, "a result longer than ten bytes");
        assert!(recall(json!({"id": "c2"})).is_error, "not cleared");
        assert!(recall(json!({})).is_error);
    }
}
