//! [`DynamicSystemPromptMiddleware`]: a system prompt computed per turn from
//! the run's context and state, laid out so that the cacheable prefix stays
//! put.

use std::fmt;
use std::sync::Arc;

use super::view::{lock, run_slot, View};
use crate::context::RunContext;
use crate::lifecycle::{Middleware, ModelNext, Wrapped};
use crate::request::ModelCall;
use crate::types::{History, Message, Role};

type PromptFn = dyn Fn(&RunContext) -> String + Send + Sync;

/// What the middleware keeps per run: the changing part it sent last, and
/// the request it made.
#[derive(Default)]
struct Sent {
    dynamic: Option<String>,
    view: View,
}

/// Computes part of the system prompt per turn, from the run's context and
/// state, and sends it as a system message right after the stable one (the
/// agent's instructions, or [`stable`](Self::stable)), for each model
/// request only: the transcript keeps the stable prompt alone.
///
/// Providers cache a request's prefix (tools, system prompt, older
/// messages). The stable prompt stays first and unchanged; the changing
/// part follows it, so a change moves the cached prefix only from there,
/// and a turn whose text did not change sends the previous request with the
/// new messages appended (O(new messages)). When the text does change, the
/// [`PromptCacheGuardMiddleware`](super::PromptCacheGuardMiddleware) names
/// this middleware (`dynamic-system-prompt`) as the one that moved the
/// prefix. Keep what changes every turn (a clock) out of it, or coarse
/// (the date, not the second).
///
/// # Clone
///
/// Clones are the same middleware: they share the function and what they
/// keep per run.
///
/// # Example
///
/// ```
/// use tower_agent::lifecycle::builtin::DynamicSystemPromptMiddleware;
/// use tower_agent::lifecycle::MiddlewareStack;
/// use tower_agent::{Agent, RunContext, RunRequest, ScriptedModel, ScriptedTurn};
///
/// #[derive(Clone)]
/// struct Plan(&'static str);
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::AgentError> {
/// let prompt = DynamicSystemPromptMiddleware::new(|ctx: &RunContext| {
///     let plan = ctx.state::<Plan>().map_or("free", |p| p.0);
///     format!("The user is on the {plan} plan. This is turn {}.", ctx.iteration())
/// });
/// let model = ScriptedModel::new([ScriptedTurn::text("hi")]);
/// let agent = Agent::builder("a")
///     .instructions("You are a support agent.")
///     .model(model.clone())
///     .middleware(MiddlewareStack::new().push(prompt))
///     .build()?;
/// let ctx = RunContext::builder().state(Plan("premium")).build();
/// let run = agent.run_with(RunRequest::new("hello").context(ctx)).await?;
/// let request = &model.requests()[0];
/// // The stable prompt first, the part that changes after it.
/// assert_eq!(request.messages[0].text(), "You are a support agent.");
/// assert_eq!(request.messages[1].text(), "The user is on the premium plan. This is turn 1.");
/// // The transcript keeps the agent's prompt only.
/// assert_eq!(run.messages.len(), 3);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DynamicSystemPromptMiddleware {
    dynamic: Arc<PromptFn>,
    stable: Option<Arc<str>>,
    id: Arc<()>,
}

impl DynamicSystemPromptMiddleware {
    /// Adds `dynamic(ctx)` after the stable prompt each turn; an empty text
    /// adds nothing.
    pub fn new(dynamic: impl Fn(&RunContext) -> String + Send + Sync + 'static) -> Self {
        Self {
            dynamic: Arc::new(dynamic),
            stable: None,
            id: Arc::new(()),
        }
    }

    /// The stable prompt to send first, in place of the request's leading
    /// system message (or before the conversation if it has none).
    pub fn stable(mut self, stable: impl Into<Arc<str>>) -> Self {
        self.stable = Some(stable.into());
        self
    }

    /// The request's messages with the prompt laid out.
    fn lay_out(&self, ctx: &RunContext, input: &History) -> History {
        let dynamic = (self.dynamic)(ctx);
        let slot = run_slot::<Sent>(ctx, Arc::as_ptr(&self.id) as usize);
        let mut sent = lock(&slot);
        if sent.dynamic.as_deref() == Some(dynamic.as_str()) {
            if let Some(output) = sent.view.extend(input) {
                sent.view.set(input, &output);
                return output;
            }
        }
        let leading = input.first().is_some_and(|m| m.role == Role::System);
        let mut output = History::new();
        match (&self.stable, leading) {
            (Some(stable), _) => output.push(Message::system(&**stable)),
            (None, true) => output.push(input[0].clone()),
            (None, false) => {}
        }
        if !dynamic.is_empty() {
            output.push(Message::system(dynamic.as_str()));
        }
        for i in usize::from(leading)..input.len() {
            output.push(input[i].clone());
        }
        sent.dynamic = Some(dynamic);
        sent.view.set(input, &output);
        output
    }
}

impl fmt::Debug for DynamicSystemPromptMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamicSystemPromptMiddleware")
            .field("stable", &self.stable)
            .finish_non_exhaustive()
    }
}

impl Middleware for DynamicSystemPromptMiddleware {
    fn name(&self) -> &str {
        "dynamic-system-prompt"
    }

    fn wrap_model<'a>(&'a self, mut call: ModelCall, next: ModelNext) -> Wrapped<'a, ModelCall> {
        call.request.messages = self.lay_out(&call.context, &call.request.messages);
        Wrapped::next(call, next)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn an_unchanged_text_extends_the_last_request_and_a_new_one_rebuilds_it() {
        let version = Arc::new(AtomicU32::new(1));
        let seen = version.clone();
        let prompt = DynamicSystemPromptMiddleware::new(move |_| {
            format!("version {}", seen.load(Ordering::Relaxed))
        })
        .stable("Be brief.");
        let ctx = RunContext::new();
        let mut history = History::from(vec![Message::system("ignored"), Message::user("hi")]);
        let first = prompt.lay_out(&ctx, &history);
        assert_eq!(first.len(), 3);
        assert_eq!(first[0].text(), "Be brief.");
        assert_eq!(first[1].text(), "version 1");
        history.push(Message::assistant("hello"));
        let second = prompt.lay_out(&ctx, &history);
        assert!(second.shares_prefix_with(&first));
        assert_eq!(second[3].text(), "hello");
        version.store(2, Ordering::Relaxed);
        let third = prompt.lay_out(&ctx, &history);
        assert_eq!(third[0].text(), "Be brief.", "the stable part stays first");
        assert_eq!(third[1].text(), "version 2");
        assert_eq!(third.len(), 4);
    }

    #[test]
    fn an_empty_text_adds_nothing_and_no_leading_prompt_is_invented() {
        let prompt = DynamicSystemPromptMiddleware::new(|_| String::new());
        let history = History::from(vec![Message::user("hi")]);
        let out = prompt.lay_out(&RunContext::new(), &history);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].text(), "hi");
    }
}
