//! Per-turn tool selection: [`ToolSelectionMiddleware`] narrows the tools
//! each model call offers to those a [`ToolSelector`] picks, and refuses a
//! call to a tool the turn did not offer.
//!
//! Three selectors:
//!
//! - [`ToolSelectionMiddleware::from_fn`]: a closure over the run's context,
//!   the messages and the agent's tools;
//! - [`ToolSelectionMiddleware::from_state`]: the [`ActiveTools`] in the
//!   run's state (a hook, a tool or the caller sets them; none: every tool);
//! - [`ModelToolSelector`]: a cheap model picks the relevant tools from a
//!   large set. Its calls run in a child context named after the selector
//!   (`tool-selector` unless [`named`](ModelToolSelector::named)), so their
//!   usage is in the run's `usage_total` and in its ledger's entries under
//!   that name, exactly once.
//!
//! [`always_include`](ToolSelectionMiddleware::always_include) names tools
//! every turn offers; a tool the request's
//! [`ToolChoice`](crate::types::ToolChoice) forces is offered too. The
//! model sees only the selected tools, in the agent's order; a call to any
//! other is refused (a `before_tool` deny) with a tool message naming the
//! tools that were offered. A selector that fails offers every tool and logs
//! a warning (fail open), unless [`fail_closed`](ToolSelectionMiddleware::fail_closed):
//! then its error fails the run.
//!
//! The selection happens in `wrap_model`, once per model call of the run
//! (and of its nested runs, which get their own); place it outside retry
//! and fallback so that a retried call is not selected again.
//!
//! ```
//! use tower_agent::lifecycle::builtin::tool_selection::ToolSelectionMiddleware;
//! use tower_agent::types::Role;
//! use tower_agent::{tool_sync, Agent, BoxError, ScriptedModel, ScriptedTurn, ToolRouter};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::AgentError> {
//! let tool = |name: &str| tool_sync(name, "A tool", |_: serde_json::Value| Ok::<_, BoxError>("ok"));
//! let tools = (0..50).fold(ToolRouter::new(), |r, i| r.tool(tool(&format!("tool_{i}"))));
//! // Offer the tools whose number the user mentions.
//! let selection = ToolSelectionMiddleware::from_fn(|_ctx, messages, tools| {
//!     let asked = messages.iter().rev().find(|m| m.role == Role::User);
//!     let asked = asked.map(|m| m.text().into_owned()).unwrap_or_default();
//!     tools.iter().filter(|t| asked.contains(&t.name)).map(|t| t.name.clone()).collect()
//! });
//! let model = ScriptedModel::new([
//!     ScriptedTurn::tool_call("tool_9", "{}"),
//!     ScriptedTurn::tool_call("tool_3", "{}"),
//!     ScriptedTurn::text("done"),
//! ]);
//! let agent = Agent::builder("a").model(model.clone()).tools(tools).middleware(selection).build()?;
//! let run = agent.run("use tool_3 please").await?;
//! assert_eq!(run.output, "done");
//! let first = &model.requests()[0];
//! assert_eq!(first.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["tool_3"]);
//! // tool_9 was not offered: refused, not run.
//! assert_eq!(run.counters.tool_calls, 1);
//! # Ok(()) }
//! ```

mod model;

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;

pub use model::ModelToolSelector;

use crate::context::RunContext;
use crate::error::BoxError;
use crate::hooks::ToolVerdict;
use crate::lifecycle::{Hook, Middleware, ModelNext, Wrapped};
use crate::request::ModelCall;
use crate::types::{History, ToolCall, ToolSpec};

/// Picks the tools a model call offers, from the agent's `tools`: the names
/// of those to offer. Names it does not know are ignored.
pub trait ToolSelector: Send + Sync + 'static {
    /// The names of the tools to offer in this call.
    fn select<'a>(
        &'a self,
        ctx: &'a RunContext,
        messages: &'a History,
        tools: &'a [ToolSpec],
    ) -> BoxFuture<'a, Result<Vec<String>, BoxError>>;
}

/// A selector from a closure: see [`ToolSelectionMiddleware::from_fn`].
pub struct FnSelector<F>(F);

impl<F> fmt::Debug for FnSelector<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnSelector")
    }
}

impl<F> ToolSelector for FnSelector<F>
where
    F: Fn(&RunContext, &History, &[ToolSpec]) -> Vec<String> + Send + Sync + 'static,
{
    fn select<'a>(
        &'a self,
        ctx: &'a RunContext,
        messages: &'a History,
        tools: &'a [ToolSpec],
    ) -> BoxFuture<'a, Result<Vec<String>, BoxError>> {
        Box::pin(std::future::ready(Ok((self.0)(ctx, messages, tools))))
    }
}

/// The tools a run offers, in its state: what
/// [`ToolSelectionMiddleware::from_state`] reads. Set it before the run
/// (`RunContext::builder().state(..)`) or from a hook or a tool
/// ([`insert_state`](RunContext::insert_state)); the next model call offers
/// those.
///
/// ```
/// use tower_agent::lifecycle::builtin::tool_selection::ActiveTools;
/// use tower_agent::RunContext;
///
/// let ctx = RunContext::builder().state(ActiveTools::new(["search", "fetch"])).build();
/// assert!(ctx.state::<ActiveTools>().unwrap().contains("fetch"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveTools(Arc<[String]>);

impl ActiveTools {
    /// These tools.
    pub fn new<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        Self(names.into_iter().map(Into::into).collect())
    }

    /// The names.
    pub fn names(&self) -> &[String] {
        &self.0
    }

    /// Whether `name` is among them.
    pub fn contains(&self, name: &str) -> bool {
        self.0.iter().any(|n| n == name)
    }
}

/// The selector of [`ToolSelectionMiddleware::from_state`].
#[derive(Debug, Clone, Copy, Default)]
pub struct StateSelector;

impl ToolSelector for StateSelector {
    fn select<'a>(
        &'a self,
        ctx: &'a RunContext,
        _: &'a History,
        tools: &'a [ToolSpec],
    ) -> BoxFuture<'a, Result<Vec<String>, BoxError>> {
        let names = match ctx.state::<ActiveTools>() {
            Some(active) => active.names().to_vec(),
            None => tools.iter().map(|t| t.name.clone()).collect(),
        };
        Box::pin(std::future::ready(Ok(names)))
    }
}

/// The tools the last model call of a run offered, in the run's state.
#[derive(Debug, Clone)]
struct Offered {
    by: Arc<str>,
    names: Arc<[String]>,
}

/// Narrows the tools each model call offers. See the [module docs](self).
///
/// # Clone
///
/// Cheap: clones share the selector.
#[derive(Clone)]
pub struct ToolSelectionMiddleware {
    name: Arc<str>,
    selector: Arc<dyn ToolSelector>,
    always: Arc<[String]>,
    fail_closed: bool,
}

impl fmt::Debug for ToolSelectionMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolSelectionMiddleware")
            .field("name", &self.name)
            .field("always", &self.always)
            .field("fail_closed", &self.fail_closed)
            .finish_non_exhaustive()
    }
}

impl ToolSelectionMiddleware {
    /// Offers what `selector` picks.
    pub fn new(selector: impl ToolSelector) -> Self {
        Self {
            name: Arc::from("tool-selection"),
            selector: Arc::new(selector),
            always: Arc::from([]),
            fail_closed: false,
        }
    }

    /// Offers the tools `f` names, given the run's context, the messages and
    /// the agent's tools.
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&RunContext, &History, &[ToolSpec]) -> Vec<String> + Send + Sync + 'static,
    {
        Self::new(FnSelector(f))
    }

    /// Offers the [`ActiveTools`] of the run's state; every tool while it
    /// has none.
    pub fn from_state() -> Self {
        Self::new(StateSelector)
    }

    /// Offers these tools in every call too, whatever the selector picks.
    pub fn always_include<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.always = self
            .always
            .iter()
            .cloned()
            .chain(names.into_iter().map(Into::into))
            .collect();
        self
    }

    /// A selector's error fails the run, instead of offering every tool.
    pub fn fail_closed(mut self) -> Self {
        self.fail_closed = true;
        self
    }

    /// The name events and logs carry (default `tool-selection`).
    pub fn named(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = name.into();
        self
    }

    /// Selects the tools of `call`: narrows its tools, records what it
    /// offers in the run's state.
    async fn narrow(&self, mut call: ModelCall) -> Result<ModelCall, BoxError> {
        let ctx = call.context.clone();
        let tools = call.request.tools.clone();
        let picked = match self
            .selector
            .select(&ctx, &call.request.messages, &tools)
            .await
        {
            Ok(picked) => picked,
            Err(err) if self.fail_closed => return Err(err),
            Err(err) => {
                tracing::warn!(selector = %self.name, error = %err, "tool selection failed; every tool is offered");
                tools.iter().map(|t| t.name.clone()).collect()
            }
        };
        let forced = call
            .request
            .settings
            .tool_choice
            .as_ref()
            .and_then(|c| c.tool_name());
        let wanted: HashSet<&str> = picked
            .iter()
            .chain(self.always.iter())
            .map(String::as_str)
            .chain(forced)
            .collect();
        let offered: Vec<ToolSpec> = tools
            .iter()
            .filter(|t| wanted.contains(t.name.as_str()))
            .cloned()
            .collect();
        let names: Arc<[String]> = offered.iter().map(|t| t.name.clone()).collect();
        tracing::debug!(selector = %self.name, offered = names.len(), of = tools.len(), "tools selected");
        if offered.len() != tools.len() {
            call.request.tools = offered.into();
        }
        if call.request.tools.is_empty() {
            // Nothing to choose from: no choice to send.
            call.request.settings_mut().tool_choice = None;
        }
        ctx.insert_state(Offered {
            by: self.name.clone(),
            names,
        });
        Ok(call)
    }
}

impl Middleware for ToolSelectionMiddleware {
    fn name(&self) -> &str {
        &self.name
    }

    fn wrap_model<'a>(&'a self, call: ModelCall, next: ModelNext) -> Wrapped<'a, ModelCall> {
        if call.request.tools.is_empty() {
            return Wrapped::next(call, next);
        }
        Wrapped::new(async move {
            let call = self.narrow(call).await?;
            next.run(call).await
        })
    }

    fn before_tool<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        _resumed: bool,
    ) -> Hook<'a, ToolVerdict> {
        let Some(offered) = ctx.state::<Offered>() else {
            return Hook::skip();
        };
        if offered.by != self.name || offered.names.contains(&call.name) {
            return Hook::skip();
        }
        let listed = if offered.names.is_empty() {
            "no tools were offered".to_owned()
        } else {
            format!("the tools offered were: {}", offered.names.join(", "))
        };
        Hook::ok(ToolVerdict {
            decided_by: Some(self.name.to_string()),
            ..ToolVerdict::deny(format!(
                "the tool `{}` was not offered in this turn; {listed}. Call one of those, or answer without a tool.",
                call.name
            ))
        })
    }
}

#[cfg(test)]
mod tests;
