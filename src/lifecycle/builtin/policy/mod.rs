//! Tool policy and permissions: [`ToolPolicyMiddleware`] allows, asks for
//! or denies each tool call by [`Rule`]s and the run's [`PermissionMode`],
//! and keeps "always allow" approvals for the thread.
//!
//! - **Rules** match a glob on the tool's name, what the tool declares
//!   (`read_only`) and [`ArgCondition`]s on its arguments (a JSON Pointer
//!   with equals / one-of / regex / numeric range). Deny beats ask beats
//!   allow; the first matching rule of the strongest kind decides.
//! - **Modes** decide what the rules leave open: see [`PermissionMode`].
//! - **Verdicts.** The policy answers in `before_tool`, and its verdict
//!   merges with the other middleware's: a deny rule is a deny, an ask rule
//!   an ask, an allow rule (or `auto` mode) an allow, and what `ask` mode
//!   asks is an [`AskUnlessAllowed`](crate::hooks::ToolDecision::AskUnlessAllowed),
//!   so another hook's *allow* skips only what the mode or the tool's own
//!   setting would ask, never a deny or ask rule.
//! - **Every decision is logged** with the rule that made it (or the mode):
//!   a [`PermissionDecision`](crate::event::AgentEvent::PermissionDecision)
//!   event and a `tracing` event, beside the run's `ToolDecision`.
//! - **Standing approvals.** A decision with an
//!   [`always`](crate::types::ApprovalDecision::always) scope ("always allow
//!   this tool", or these arguments, by their hash) approves the later calls
//!   it covers without asking. The run keeps them in its checkpoint across
//!   pause and resume; the policy keeps them per thread for the next runs
//!   of it (the most recent 10,000 threads unless
//!   [`remember_threads`](ToolPolicyBuilder::remember_threads) says
//!   otherwise). See [`StickyApprovals`].
//! - Rules load from code ([`ToolPolicyMiddleware::builder`]) or from a
//!   JSON/TOML file ([`PolicyConfig`]).
//!
//! A call that asks is decided as any other: by the `decide_approval`
//! hooks, then the agent's approver, else declined. The policy fails
//! closed: a rule that cannot work is an error when the policy builds, and
//! arguments that are not JSON satisfy no condition.
//!
//! ```
//! use tower_agent::lifecycle::builtin::policy::{ArgCondition, PermissionMode, Rule, ToolPolicyMiddleware};
//! use tower_agent::types::ApprovalDecision;
//! use tower_agent::{tool_sync, Agent, BoxError, RunContext, RunRequest, ScriptedModel, ScriptedTurn, ToolRouter};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = ToolPolicyMiddleware::builder()
//!     .rule(Rule::deny("transfer")
//!         .when(ArgCondition::at("/amount").gt(1000.0))
//!         .reason("transfers above 1000 go through a person"))
//!     .rule(Rule::allow("balance"))
//!     .build()?;
//!
//! let model = ScriptedModel::new([
//!     ScriptedTurn::tool_call("transfer", r#"{"amount": 5000}"#),
//!     ScriptedTurn::tool_call("transfer", r#"{"amount": 20}"#),
//!     ScriptedTurn::text("sent 20"),
//! ]);
//! let transfer = tool_sync("transfer", "Sends money", |_: serde_json::Value| Ok::<_, BoxError>("sent"));
//! let agent = Agent::builder("bank")
//!     .model(model.clone())
//!     .tools(ToolRouter::new().tool(transfer))
//!     .middleware(policy)
//!     // Asked in `ask` mode: a person says yes.
//!     .approver(|call, _| async move { Some(ApprovalDecision::approve(&call)) })
//!     .build()?;
//!
//! let ctx = RunContext::builder().state(PermissionMode::Ask).build();
//! let run = agent.run_with(RunRequest::new("send money").context(ctx)).await?;
//! assert_eq!(run.output, "sent 20");
//! assert_eq!(run.counters.tool_calls, 1, "the large transfer was denied");
//! let denied = &model.requests()[1].messages.last().unwrap().text().into_owned();
//! assert!(denied.contains("transfers above 1000 go through a person"), "{denied}");
//! # Ok(()) }
//! ```

mod load;
mod mode;
mod rules;

use std::fmt;
use std::sync::Arc;

use quick_cache::sync::Cache;

pub use load::{PolicyConfig, PolicyError};
pub use mode::PermissionMode;
pub use rules::{ArgCondition, Rule, RuleAction};

use crate::context::RunContext;
use crate::event::AgentEvent;
use crate::hooks::{RunOutcome, RunStart, StickyApprovals, ToolDecision, ToolVerdict};
use crate::lifecycle::{Hook, Middleware};
use crate::service::RunTools;
use crate::types::{ApprovalDecision, ToolCall};
use rules::RuleSet;

/// How many threads' standing approvals a policy keeps by default.
const THREADS: usize = 10_000;

struct Policy {
    name: Arc<str>,
    rules: RuleSet,
    mode: PermissionMode,
    /// Standing approvals per thread, for the next runs of it.
    threads: Option<Cache<String, StickyApprovals>>,
}

/// Allows, asks for or denies each tool call by rules and the run's
/// permission mode. See the [module docs](self).
///
/// # Clone
///
/// Cheap: clones share the rules and the threads' standing approvals.
#[derive(Clone)]
pub struct ToolPolicyMiddleware {
    inner: Arc<Policy>,
}

impl fmt::Debug for ToolPolicyMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolPolicyMiddleware")
            .field("name", &self.inner.name)
            .field("mode", &self.inner.mode)
            .field("rules", &self.inner.rules.len())
            .finish_non_exhaustive()
    }
}

/// Builds a [`ToolPolicyMiddleware`]: see [`ToolPolicyMiddleware::builder`].
#[derive(Debug, Clone)]
pub struct ToolPolicyBuilder {
    name: Arc<str>,
    rules: Vec<Rule>,
    mode: PermissionMode,
    threads: usize,
}

impl ToolPolicyBuilder {
    /// Adds a rule after those added before.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Adds rules after those added before.
    pub fn rules(mut self, rules: impl IntoIterator<Item = Rule>) -> Self {
        self.rules.extend(rules);
        self
    }

    /// The mode of runs that set none in their state (default:
    /// [`PermissionMode::Default`]).
    pub fn mode(mut self, mode: PermissionMode) -> Self {
        self.mode = mode;
        self
    }

    /// The name events and logs carry (default `tool-policy`).
    pub fn named(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = name.into();
        self
    }

    /// How many threads' standing approvals to keep in this process
    /// (default 10,000; the least recently used go first). 0 keeps none
    /// across runs: a run's checkpoint still carries its own.
    pub fn remember_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// The middleware.
    ///
    /// # Errors
    ///
    /// [`PolicyError::InvalidRule`] for a rule that cannot work.
    pub fn build(self) -> Result<ToolPolicyMiddleware, PolicyError> {
        Ok(ToolPolicyMiddleware {
            inner: Arc::new(Policy {
                name: self.name,
                rules: RuleSet::new(self.rules)?,
                mode: self.mode,
                threads: (self.threads > 0).then(|| Cache::new(self.threads)),
            }),
        })
    }
}

impl ToolPolicyMiddleware {
    /// A builder with no rules, in [`PermissionMode::Default`].
    pub fn builder() -> ToolPolicyBuilder {
        ToolPolicyBuilder {
            name: Arc::from("tool-policy"),
            rules: Vec::new(),
            mode: PermissionMode::Default,
            threads: THREADS,
        }
    }

    /// The policy in a JSON text: see [`PolicyConfig`].
    ///
    /// # Errors
    ///
    /// [`PolicyError::Parse`], [`PolicyError::InvalidRule`].
    pub fn from_json(text: &str) -> Result<Self, PolicyError> {
        PolicyConfig::from_json(text)?.build()
    }

    /// The policy in a TOML text: see [`PolicyConfig`].
    ///
    /// # Errors
    ///
    /// [`PolicyError::Parse`], [`PolicyError::InvalidRule`].
    #[cfg(feature = "toml")]
    pub fn from_toml(text: &str) -> Result<Self, PolicyError> {
        PolicyConfig::from_toml(text)?.build()
    }

    /// The policy in a `.json` or `.toml` file: see [`PolicyConfig::load`].
    ///
    /// # Errors
    ///
    /// [`PolicyError`].
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<Self, PolicyError> {
        PolicyConfig::load(path)?.build()
    }

    /// The mode of `ctx`'s run: its own (or inherited) setting, else the
    /// policy's.
    pub fn mode_of(&self, ctx: &RunContext) -> PermissionMode {
        PermissionMode::of(ctx).unwrap_or(self.inner.mode)
    }

    /// What the policy decides for `call` in `ctx`'s run, and the label of
    /// the rule that decided (`None`: the mode did).
    pub fn decide(&self, ctx: &RunContext, call: &ToolCall) -> (ToolDecision, Option<&str>) {
        let read_only = RunTools::of(ctx)
            .and_then(|t| t.get(&call.name).copied())
            .is_some_and(|t| t.read_only);
        match self.inner.rules.decide(call, read_only) {
            Some(rule) => {
                let decision = match rule.rule.action {
                    RuleAction::Allow => ToolDecision::Allow,
                    RuleAction::Ask => ToolDecision::Ask,
                    RuleAction::Deny => ToolDecision::Deny {
                        reason: rule.rule.reason.clone().unwrap_or_else(|| {
                            format!("the tool policy's rule `{}` denies it", rule.label)
                        }),
                    },
                };
                (decision, Some(rule.label.as_str()))
            }
            None => (self.mode_of(ctx).unruled(), None),
        }
    }

    /// The standing approvals kept for `thread`, if any.
    pub fn thread_approvals(&self, thread: &str) -> Option<StickyApprovals> {
        self.inner.threads.as_ref()?.get(thread)
    }

    fn log(&self, ctx: &RunContext, call: &ToolCall, decision: &ToolDecision, rule: Option<&str>) {
        let mode = self.mode_of(ctx).as_str();
        let policy = &*self.inner.name;
        let what = decision.as_str();
        match decision {
            ToolDecision::Deny { .. } | ToolDecision::Ask => tracing::info!(
                call_id = %call.id, tool = %call.name, decision = what, rule, mode, policy,
                "tool policy decision"
            ),
            _ => tracing::debug!(
                call_id = %call.id, tool = %call.name, decision = what, rule, mode, policy,
                "tool policy decision"
            ),
        }
        ctx.emit(|| AgentEvent::PermissionDecision {
            run_id: ctx.run_id().clone(),
            call_id: call.id.clone(),
            tool: call.name.clone(),
            decision: what,
            rule: rule.map(str::to_owned),
            mode,
            policy: policy.to_owned(),
        });
    }
}

impl Middleware for ToolPolicyMiddleware {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn before_agent<'a>(&'a self, ctx: &'a RunContext, _: RunStart) -> Hook<'a, Option<String>> {
        let (Some(threads), Some(thread), None) =
            (&self.inner.threads, ctx.thread_id(), ctx.parent())
        else {
            return Hook::skip();
        };
        let approvals = threads.get_or_insert_with(thread, || Ok::<_, ()>(StickyApprovals::new()));
        if let Ok(approvals) = approvals {
            approvals.install(ctx);
        }
        Hook::ok(None)
    }

    fn before_tool<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
        _resumed: bool,
    ) -> Hook<'a, ToolVerdict> {
        let (decision, rule) = self.decide(ctx, call);
        self.log(ctx, call, &decision, rule);
        Hook::ok(ToolVerdict {
            decision,
            updated_arguments: None,
            decided_by: Some(self.inner.name.to_string()),
        })
    }

    fn decide_approval<'a>(
        &'a self,
        ctx: &'a RunContext,
        call: &'a ToolCall,
    ) -> Hook<'a, Option<ApprovalDecision>> {
        if self.mode_of(ctx) != PermissionMode::DontAsk {
            return Hook::skip();
        }
        Hook::ok(Some(ApprovalDecision::decline(
            call,
            "the permission mode is dont_ask: calls that would ask for approval are declined",
        )))
    }

    fn after_agent<'a>(&'a self, ctx: &'a RunContext, _: RunOutcome<'a>) -> Hook<'a, ()> {
        // A run whose tree already had its own set (given by the caller)
        // keeps it: copy what it gained into the thread's.
        let (Some(threads), Some(thread), None) =
            (&self.inner.threads, ctx.thread_id(), ctx.parent())
        else {
            return Hook::skip();
        };
        if let (Some(kept), Some(run)) = (threads.get(thread), StickyApprovals::find(ctx)) {
            kept.extend(run.to_vec());
        }
        Hook::ok(())
    }
}

#[cfg(test)]
mod tests;
