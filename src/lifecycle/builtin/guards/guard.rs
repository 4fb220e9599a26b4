//! The [`Guard`] trait: checks a text with the run's context and answers
//! pass, block or rewrite. Guards from a closure ([`guard_fn`]) and from a
//! regex ([`RegexGuard`]) live here; the PII, injection and model-backed
//! guards beside it.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use regex::Regex;
use serde_json::json;

use super::stream::GuardVerdict;
use crate::context::RunContext;
use crate::error::BoxError;
use crate::lifecycle::FailPolicy;

/// What a guard is asked to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardTarget<'a> {
    /// The run's input, before any model call.
    Input,
    /// The model's answer (a segment of it, when it streams).
    Output,
    /// A tool call's arguments (JSON text), before the tool runs.
    ToolArguments {
        /// The tool's name.
        tool: &'a str,
    },
    /// What a tool answered, before the model reads it.
    ToolResult {
        /// The tool's name.
        tool: &'a str,
    },
}

impl GuardTarget<'_> {
    /// `input`, `output`, `tool_arguments` or `tool_result`: what events
    /// and tripwire details carry.
    pub fn as_str(&self) -> &'static str {
        match self {
            GuardTarget::Input => "input",
            GuardTarget::Output => "output",
            GuardTarget::ToolArguments { .. } => "tool_arguments",
            GuardTarget::ToolResult { .. } => "tool_result",
        }
    }

    /// The tool's name, for the tool targets.
    pub fn tool(&self) -> Option<&str> {
        match self {
            GuardTarget::ToolArguments { tool } | GuardTarget::ToolResult { tool } => Some(tool),
            _ => None,
        }
    }
}

/// Checks a text: pass it, block it (with a reason and details) or rewrite
/// it. Put guards in a
/// [`GuardrailsMiddleware`](super::GuardrailsMiddleware) on the input, the
/// output or the tools.
///
/// A guard that cannot answer (a judge model that is down) returns `Err`;
/// its [`fail_policy`](Self::fail_policy) decides whether the text passes
/// (open) or the run fails (closed, the default), and the
/// `guard_failed` event says which happened.
///
/// Built-ins: [`guard_fn`] (a closure), [`RegexGuard`],
/// [`PiiGuard`](super::PiiGuard), [`DetectorGuard`](super::DetectorGuard)
/// (an [`InjectionDetector`](super::InjectionDetector)) and
/// [`JudgeGuard`](super::JudgeGuard) (asks a model).
///
/// ```
/// use futures::future::BoxFuture;
/// use tower_agent::lifecycle::builtin::guards::{Guard, GuardTarget, GuardVerdict};
/// use tower_agent::{BoxError, RunContext};
///
/// /// Answers stay under 2,000 characters.
/// struct Short;
///
/// impl Guard for Short {
///     fn name(&self) -> &str {
///         "short"
///     }
///
///     fn check<'a>(
///         &'a self,
///         _ctx: &'a RunContext,
///         _target: GuardTarget<'a>,
///         text: &'a str,
///     ) -> BoxFuture<'a, Result<GuardVerdict, BoxError>> {
///         let verdict = if text.chars().count() > 2000 {
///             GuardVerdict::Block { reason: "too long".into(), info: None }
///         } else {
///             GuardVerdict::Pass
///         };
///         Box::pin(std::future::ready(Ok(verdict)))
///     }
/// }
/// ```
pub trait Guard: Send + Sync + 'static {
    /// The name tripwire details and events carry.
    fn name(&self) -> &str;

    /// Checks `text`, which is `target`, in the run of `ctx`.
    fn check<'a>(
        &'a self,
        ctx: &'a RunContext,
        target: GuardTarget<'a>,
        text: &'a str,
    ) -> BoxFuture<'a, Result<GuardVerdict, BoxError>>;

    /// What a failure to answer does: [`FailPolicy::Closed`] (the default)
    /// fails the run with the guard's error; [`FailPolicy::Open`] lets the
    /// text pass.
    fn fail_policy(&self) -> FailPolicy {
        FailPolicy::Closed
    }

    /// This guard with `policy` instead of its own.
    fn with_fail_policy(self, policy: FailPolicy) -> WithFailPolicy<Self>
    where
        Self: Sized,
    {
        WithFailPolicy {
            guard: self,
            policy,
        }
    }

    /// This guard, failing open: when it cannot answer, the text passes.
    fn fail_open(self) -> WithFailPolicy<Self>
    where
        Self: Sized,
    {
        self.with_fail_policy(FailPolicy::Open)
    }
}

impl<G: Guard + ?Sized> Guard for Arc<G> {
    fn name(&self) -> &str {
        (**self).name()
    }

    fn check<'a>(
        &'a self,
        ctx: &'a RunContext,
        target: GuardTarget<'a>,
        text: &'a str,
    ) -> BoxFuture<'a, Result<GuardVerdict, BoxError>> {
        (**self).check(ctx, target, text)
    }

    fn fail_policy(&self) -> FailPolicy {
        (**self).fail_policy()
    }
}

/// A guard with a fail policy of its own: see [`Guard::with_fail_policy`].
#[derive(Debug, Clone)]
pub struct WithFailPolicy<G> {
    guard: G,
    policy: FailPolicy,
}

impl<G: Guard> Guard for WithFailPolicy<G> {
    fn name(&self) -> &str {
        self.guard.name()
    }

    fn check<'a>(
        &'a self,
        ctx: &'a RunContext,
        target: GuardTarget<'a>,
        text: &'a str,
    ) -> BoxFuture<'a, Result<GuardVerdict, BoxError>> {
        self.guard.check(ctx, target, text)
    }

    fn fail_policy(&self) -> FailPolicy {
        self.policy
    }
}

type CheckFn = dyn Fn(&RunContext, GuardTarget<'_>, &str) -> GuardVerdict + Send + Sync;

/// A guard from a synchronous closure: see [`guard_fn`].
#[derive(Clone)]
pub struct FnGuard {
    name: Arc<str>,
    check: Arc<CheckFn>,
}

impl fmt::Debug for FnGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnGuard").field("name", &self.name).finish()
    }
}

/// A guard named `name` that answers with `check`.
///
/// ```
/// use tower_agent::lifecycle::builtin::guards::{guard_fn, Guard, GuardTarget, GuardVerdict};
/// use tower_agent::RunContext;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let no_refunds = guard_fn("no-refunds", |_ctx, _target, text| {
///     if text.to_lowercase().contains("refund") {
///         GuardVerdict::Block { reason: "refunds go to a person".into(), info: None }
///     } else {
///         GuardVerdict::Pass
///     }
/// });
/// let ctx = RunContext::new();
/// let verdict = no_refunds.check(&ctx, GuardTarget::Input, "I want a refund").await.unwrap();
/// assert!(matches!(verdict, GuardVerdict::Block { .. }));
/// # }
/// ```
pub fn guard_fn(
    name: impl Into<Arc<str>>,
    check: impl Fn(&RunContext, GuardTarget<'_>, &str) -> GuardVerdict + Send + Sync + 'static,
) -> FnGuard {
    FnGuard {
        name: name.into(),
        check: Arc::new(check),
    }
}

impl Guard for FnGuard {
    fn name(&self) -> &str {
        &self.name
    }

    fn check<'a>(
        &'a self,
        ctx: &'a RunContext,
        target: GuardTarget<'a>,
        text: &'a str,
    ) -> BoxFuture<'a, Result<GuardVerdict, BoxError>> {
        Box::pin(std::future::ready(Ok((self.check)(ctx, target, text))))
    }
}

/// A guard from a regex: blocks a text that matches, or, with
/// [`redact`](Self::redact), replaces every match.
///
/// On a streamed answer the guard sees one segment at a time (up to a
/// sentence end), so a pattern should not span sentences.
///
/// ```
/// use regex::Regex;
/// use tower_agent::lifecycle::builtin::guards::{Guard, GuardTarget, GuardVerdict, RegexGuard};
/// use tower_agent::RunContext;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let ctx = RunContext::new();
/// let tickets = RegexGuard::new("tickets", Regex::new(r"\bTCK-\d+\b").unwrap()).redact("[ticket]");
/// let verdict = tickets.check(&ctx, GuardTarget::Output, "See TCK-42.").await.unwrap();
/// assert_eq!(verdict, GuardVerdict::Rewrite("See [ticket].".into()));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RegexGuard {
    name: Arc<str>,
    regex: Regex,
    replacement: Option<Arc<str>>,
}

impl RegexGuard {
    /// A guard named `name` blocking any text `regex` matches.
    pub fn new(name: impl Into<Arc<str>>, regex: Regex) -> Self {
        Self {
            name: name.into(),
            regex,
            replacement: None,
        }
    }

    /// Replaces each match with `replacement` (taken literally) instead of
    /// blocking.
    pub fn redact(mut self, replacement: impl Into<Arc<str>>) -> Self {
        self.replacement = Some(replacement.into());
        self
    }
}

impl Guard for RegexGuard {
    fn name(&self) -> &str {
        &self.name
    }

    fn check<'a>(
        &'a self,
        _ctx: &'a RunContext,
        target: GuardTarget<'a>,
        text: &'a str,
    ) -> BoxFuture<'a, Result<GuardVerdict, BoxError>> {
        let verdict = match (self.regex.find(text), &self.replacement) {
            (None, _) => GuardVerdict::Pass,
            (Some(_), Some(with)) => GuardVerdict::Rewrite(
                self.regex
                    .replace_all(text, regex::NoExpand(with))
                    .into_owned(),
            ),
            (Some(m), None) => GuardVerdict::Block {
                reason: format!("the {} matches `{}`", target.as_str(), self.regex.as_str()),
                info: Some(json!({ "span": [m.start(), m.end()] })),
            },
        };
        Box::pin(std::future::ready(Ok(verdict)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn verdict(guard: &impl Guard, text: &str) -> GuardVerdict {
        guard
            .check(&RunContext::new(), GuardTarget::Output, text)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_regex_blocks_or_redacts() {
        let re = Regex::new(r"\d{4}").unwrap();
        let block = RegexGuard::new("digits", re.clone());
        assert_eq!(verdict(&block, "no digits").await, GuardVerdict::Pass);
        match verdict(&block, "pin 1234").await {
            GuardVerdict::Block { reason, info } => {
                assert!(reason.contains("output"));
                assert_eq!(info.unwrap()["span"], json!([4, 8]));
            }
            other => panic!("{other:?}"),
        }
        let redact = RegexGuard::new("digits", re).redact("$0");
        assert_eq!(
            verdict(&redact, "1234 and 5678").await,
            GuardVerdict::Rewrite("$0 and $0".into()),
            "the replacement is literal"
        );
    }

    #[tokio::test]
    async fn a_closure_sees_the_target_and_a_policy_can_be_set() {
        let g = guard_fn("tools-only", |_, target, _| match target.tool() {
            Some(tool) => GuardVerdict::Rewrite(tool.to_owned()),
            None => GuardVerdict::Pass,
        });
        let ctx = RunContext::new();
        let seen = g
            .check(&ctx, GuardTarget::ToolResult { tool: "fetch" }, "x")
            .await
            .unwrap();
        assert_eq!(seen, GuardVerdict::Rewrite("fetch".into()));
        assert_eq!(g.fail_policy(), FailPolicy::Closed);
        let open = g.fail_open();
        assert_eq!(
            (open.name(), open.fail_policy()),
            ("tools-only", FailPolicy::Open)
        );
        assert_eq!(
            GuardTarget::ToolArguments { tool: "t" }.as_str(),
            "tool_arguments"
        );
    }
}
