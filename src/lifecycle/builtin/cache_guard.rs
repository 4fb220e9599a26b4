//! [`PromptCacheGuardMiddleware`]: notices when a model request no longer
//! starts with the previous one (the prefix a provider's prompt cache
//! keeps), and names the middleware that moved it.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use serde_json::json;

use crate::context::RunContext;
use crate::error::BoxError;
use crate::lifecycle::edit_watch::{watch, EditWatch};
use crate::lifecycle::{ModelMiddleware, ModelNext};
use crate::request::ModelCall;
use crate::types::{History, ModelResponse};

/// One change to a run's messages: who made it, and the messages before and
/// after (shared, O(1) to keep).
struct Edit {
    by: Arc<str>,
    before: History,
    after: History,
}

#[derive(Default)]
struct RunLog {
    edits: Vec<Edit>,
    /// The edits made for the previous request.
    previous_edits: Vec<Edit>,
    /// The messages of the previous model request of the run.
    previous: Option<History>,
}

/// Who changed a run's messages this turn: kept in the run's state once a
/// prompt-cache guard is in the run, filled by the stack (each
/// `before_model` edit) and by the wrap chain (each `wrap_model` that hands
/// on other messages). Costs nothing in a run without a guard.
#[derive(Clone, Default)]
pub(crate) struct EditLog(Arc<Mutex<RunLog>>);

impl EditLog {
    /// The run's log, installed as the run's edit watcher.
    fn install(ctx: &RunContext) -> EditLog {
        let log = ctx.with_state(|s| s.get_or_insert_with(EditLog::default).clone());
        let watching = log.clone();
        watch(ctx, move || Arc::new(watching));
        log
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RunLog> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl EditWatch for EditLog {
    /// Records `by`'s change, if it changed anything.
    fn record(&self, by: &Arc<str>, before: History, after: &History) {
        if History::ptr_eq(&before, after) {
            return;
        }
        self.lock().edits.push(Edit {
            by: by.clone(),
            before,
            after: after.clone(),
        });
    }
}

/// This request's edits, handed back to the log when the check is done, to
/// compare the next request's with.
struct Keep<'a>(&'a EditLog, Vec<Edit>);

impl Drop for Keep<'_> {
    fn drop(&mut self) {
        self.0.lock().previous_edits = std::mem::take(&mut self.1);
    }
}

fn starts_with(messages: &History, prefix: &History) -> bool {
    messages.len() >= prefix.len()
        && (messages.shares_prefix_with(prefix) || messages.iter().zip(prefix).all(|(a, b)| a == b))
}

fn common_prefix(a: &History, b: &History) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The cached prefix of a run moved: a request did not start with the one
/// before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheLayoutEvent {
    /// The run.
    pub run_id: Arc<str>,
    /// The turn whose request moved the prefix.
    pub iteration: u32,
    /// How many messages the previous request had (the cacheable prefix).
    pub previous_len: usize,
    /// How many of them the new request kept, unchanged, at its start.
    pub kept: usize,
    /// The middleware whose edit moved it, when one did.
    pub moved_by: Option<String>,
}

/// Makes prompt-cache regressions observable: before each model call it
/// checks that the request starts with the previous request of the run, as
/// a provider's prompt cache needs, and when it does not, records a
/// [`CacheLayoutEvent`] naming the middleware whose edit (in `before_model`,
/// or a wrap middleware outside this one) moved the prefix, and logs it as
/// a `prompt_cache_moved` custom event.
///
/// Push it as the innermost model middleware (last, or in the built-ins) so
/// it sees the request as it goes out. A turn nobody edited costs one
/// comparison of lengths; after an edit it compares the prefix.
///
/// ```
/// use tower_agent::lifecycle::builtin::PromptCacheGuardMiddleware;
/// use tower_agent::lifecycle::MiddlewareStack;
///
/// let guard = PromptCacheGuardMiddleware::new();
/// let stack = MiddlewareStack::new().push_model(guard.clone());
/// assert!(guard.events().is_empty());
/// # let _ = stack;
/// ```
///
/// See `tests/lifecycle_builtin.rs` for a full run naming the culprit.
///
/// # Clone
///
/// Clones share the recorded events.
#[derive(Clone, Default)]
pub struct PromptCacheGuardMiddleware {
    events: Arc<Mutex<Vec<CacheLayoutEvent>>>,
}

impl PromptCacheGuardMiddleware {
    /// A guard with no events yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every time the prefix moved, oldest first.
    pub fn events(&self) -> Vec<CacheLayoutEvent> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn check(&self, ctx: &RunContext, request: &History) {
        let log = EditLog::install(ctx);
        let mut run = log.lock();
        let edits = std::mem::take(&mut run.edits);
        let earlier = std::mem::take(&mut run.previous_edits);
        let Some(previous) = run.previous.replace(request.clone()) else {
            run.previous_edits = edits;
            return;
        };
        drop(run);
        let edits = Keep(&log, edits);
        // Only the loop appended since the last request: the prefix holds.
        if edits.1.is_empty() && request.len() >= previous.len() {
            return;
        }
        if starts_with(request, &previous) {
            return;
        }
        // The edit that moved it: one whose input only grew since its edit
        // of the previous request while its output did not (a middleware
        // that rewrites each request, such as a dynamic prompt), or one
        // that got the previous request and did not keep it.
        let moved_by = edits
            .1
            .iter()
            .find(|e| {
                let again = earlier.iter().find(|p| p.by == e.by).is_some_and(|p| {
                    starts_with(&e.before, &p.before) && !starts_with(&e.after, &p.after)
                });
                again || (starts_with(&e.before, &previous) && !starts_with(&e.after, &previous))
            })
            .map(|e| e.by.to_string());
        let event = CacheLayoutEvent {
            run_id: ctx.run_id().clone(),
            iteration: ctx.iteration(),
            previous_len: previous.len(),
            kept: common_prefix(request, &previous),
            moved_by,
        };
        tracing::warn!(
            iteration = event.iteration,
            kept = event.kept,
            previous_len = event.previous_len,
            moved_by = event.moved_by.as_deref().unwrap_or("unknown"),
            "the prompt-cache prefix moved"
        );
        ctx.log_event(
            "prompt_cache_moved",
            json!({
                "iteration": event.iteration,
                "previous_len": event.previous_len,
                "kept": event.kept,
                "moved_by": event.moved_by,
            }),
        );
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event);
    }
}

impl fmt::Debug for PromptCacheGuardMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PromptCacheGuardMiddleware")
            .field("events", &self.events().len())
            .finish()
    }
}

impl ModelMiddleware for PromptCacheGuardMiddleware {
    fn name(&self) -> &str {
        "prompt-cache-guard"
    }

    fn wrap_model<'a>(
        &'a self,
        call: ModelCall,
        next: ModelNext,
    ) -> BoxFuture<'a, Result<ModelResponse, BoxError>> {
        self.check(&call.context, &call.request.messages);
        Box::pin(next.run(call))
    }
}
