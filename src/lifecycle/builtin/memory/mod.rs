//! [`MemoryMiddleware`]: memory across runs. Loads the run's thread, recalls
//! memory items for its input, and once the run is done saves the thread,
//! extracts new items with a model and compacts a long thread.
//!
//! A run's thread is its [`RunContext`]'s `thread_id`; a run without one
//! only recalls and extracts. Memory items live in a namespace: the
//! middleware's ([`namespace`](MemoryMiddleware::namespace), `default`
//! unless set), or the run's own when its context's state holds a
//! [`MemoryNamespace`] (one user's memory, say).
//!
//! | when | hook | what |
//! | --- | --- | --- |
//! | the run starts | `before_agent` | loads the thread; a new run that came without history starts from it |
//! | the input is in | `before_run` | recalls the items the [`Retriever`] ranks best for the input into a `<memory_context>` block right after the system prompt, for this run only (the thread does not keep it) |
//! | the run ended | `after_agent` | a completed or stopped run's transcript is saved as the thread; then, for a completed run only, the [`MemoryExtractor`] writes new items, and then the thread is compacted ([`ThreadCompaction`]), extraction first so nothing is condensed before it was read |
//!
//! Loading the thread fails the run if the store cannot answer: a run that
//! went on without its thread would overwrite it. Everything else is
//! fail-open: a recall, save, extraction or compaction that fails is logged
//! (`tracing` at `warn`, and a `memory_failed` custom event naming the
//! phase) and never changes the run's result. Extraction and compaction
//! are skipped when the caller stopped waiting (the run's cancellation),
//! and compaction is skipped when the extraction failed. The models they
//! call run in a child context named after the middleware (`memory`), so
//! their usage is in the run's ledger (`total_usage`, `usage_entries`)
//! under that name; the [`AgentRun`] handed back was made before them and
//! holds the run's own figures. Nested runs (an agent used as a tool) are
//! left alone: they share the thread id of their parent.
//!
//! ```
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_agent::lifecycle::builtin::{MemoryMiddleware, ModelExtractor, ThreadCompaction};
//! use tower_agent::lifecycle::{LifecycleLayer, MiddlewareStack};
//! use tower_agent::memory::{InProcessMemory, Memory};
//! use tower_agent::{Agent, RunContext, RunRequest, ScriptedModel, ScriptedTurn};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::AgentError> {
//! let store = InProcessMemory::new();
//! let extractor = ModelExtractor::new(ScriptedModel::new([ScriptedTurn::text(
//!     r#"{"memories": [{"kind": "fact", "text": "The user lives in Lyon", "message": 1}]}"#,
//! )]));
//! let memory = MemoryMiddleware::new(store.clone())
//!     .namespace("support")
//!     .extractor(extractor)
//!     .compaction(ThreadCompaction::default());
//! let agent = ServiceBuilder::new()
//!     .layer(LifecycleLayer::new(MiddlewareStack::new().push(memory)))
//!     .service(
//!         Agent::builder("support")
//!             .instructions("You help.")
//!             .model(ScriptedModel::new([ScriptedTurn::text("Noted."), ScriptedTurn::text("Lyon.")]))
//!             .build()?,
//!     );
//!
//! let on_thread = || RunContext::builder().thread_id("t-1").build();
//! agent.clone().oneshot(RunRequest::new("I live in Lyon.").context(on_thread())).await?;
//! // A later run on the thread starts from it (and recalls what was extracted, when it is relevant).
//! let run = agent.oneshot(RunRequest::new("Where do I live?").context(on_thread())).await?;
//! assert_eq!(run.messages.len(), 5); // prompt, 2 turns of the first run, this input and answer
//! assert_eq!(store.load_thread("t-1").await.unwrap().len(), 5);
//! assert_eq!(store.items("support").await.unwrap()[0].text, "The user lives in Lyon");
//! # Ok(()) }
//! ```

mod compact;
mod extract;

use std::fmt;
use std::sync::Arc;

use serde_json::json;

pub use compact::ThreadCompaction;
pub use extract::{parse_memories, Extracted, ExtractionRequest, MemoryExtractor, ModelExtractor};

use crate::context::RunContext;
use crate::error::BoxError;
use crate::hooks::{Compaction, RunOutcome, RunStart};
use crate::lifecycle::{Hook, Middleware};
use crate::memory::{
    memory_context, KeywordRetriever, Memory, MemoryItem, Provenance, RecallQuery, Retriever,
    Timestamp,
};
use crate::types::{AgentRun, History, Message, RunStatus};

const NAME: &str = "memory";

/// The memory namespace of one run, in its context's state: overrides the
/// middleware's [`namespace`](MemoryMiddleware::namespace).
///
/// ```
/// use tower_agent::lifecycle::builtin::MemoryNamespace;
/// use tower_agent::RunContext;
///
/// let ctx = RunContext::builder().thread_id("t-9").state(MemoryNamespace::new("user-42")).build();
/// # let _ = ctx;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryNamespace(pub Arc<str>);

impl MemoryNamespace {
    /// The namespace `name`.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self(name.into())
    }
}

/// What `before_agent` loaded, for `after_agent` to save only what is new.
#[derive(Clone)]
struct Loaded {
    len: usize,
    digest: [u8; 16],
}

type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// Memory across runs: see the [module docs](self).
///
/// # Clone
///
/// Clones share the store, the retriever, the extractor and the summarizer.
#[derive(Clone)]
pub struct MemoryMiddleware {
    memory: Arc<dyn Memory>,
    retriever: Arc<dyn Retriever>,
    namespace: Arc<str>,
    recall_limit: usize,
    extractor: Option<Arc<dyn MemoryExtractor>>,
    compaction: Option<ThreadCompaction>,
    clock: Clock,
    name: Arc<str>,
}

impl fmt::Debug for MemoryMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryMiddleware")
            .field("namespace", &self.namespace)
            .field("recall_limit", &self.recall_limit)
            .field("extracts", &self.extractor.is_some())
            .field("compaction", &self.compaction)
            .finish_non_exhaustive()
    }
}

impl MemoryMiddleware {
    /// Memory in `memory`: threads load and save, the [`KeywordRetriever`]
    /// recalls up to 5 items; no extraction and no compaction until they are
    /// set.
    pub fn new(memory: impl Memory) -> Self {
        Self {
            memory: Arc::new(memory),
            retriever: Arc::new(KeywordRetriever::new()),
            namespace: Arc::from("default"),
            recall_limit: 5,
            extractor: None,
            compaction: None,
            clock: Arc::new(crate::memory::now),
            name: Arc::from(NAME),
        }
    }

    /// The namespace of the items (unless a run's [`MemoryNamespace`] says
    /// otherwise).
    pub fn namespace(mut self, namespace: impl Into<Arc<str>>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Recalls with `retriever` instead.
    pub fn retriever(mut self, retriever: impl Retriever) -> Self {
        self.retriever = Arc::new(retriever);
        self
    }

    /// Recalls at most `limit` items (0: no recall).
    pub fn recall_limit(mut self, limit: usize) -> Self {
        self.recall_limit = limit;
        self
    }

    /// Extracts items from every completed run with `extractor`.
    pub fn extractor(mut self, extractor: impl MemoryExtractor) -> Self {
        self.extractor = Some(Arc::new(extractor));
        self
    }

    /// Compacts the thread after every completed run under `compaction`.
    pub fn compaction(mut self, compaction: ThreadCompaction) -> Self {
        self.compaction = Some(compaction);
        self
    }

    /// Reads the time from `clock` (milliseconds since the Unix epoch)
    /// instead of the system clock: items' times and recency use it.
    pub fn clock(mut self, clock: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    fn namespace_of(&self, ctx: &RunContext) -> Arc<str> {
        ctx.state::<MemoryNamespace>()
            .map_or_else(|| self.namespace.clone(), |n| n.0)
    }

    /// A child of `ctx` named after the middleware: the models extraction
    /// and compaction call record their usage there.
    fn work_context(&self, ctx: &RunContext) -> RunContext {
        let child = ctx.child();
        child.set_agent_name(&self.name);
        child
    }

    async fn load(&self, ctx: &RunContext, thread: &str, start: RunStart) -> Result<(), BoxError> {
        let messages = self.memory.load_thread(thread).await?;
        let history = History::from(messages);
        ctx.insert_state(Loaded {
            len: history.len(),
            digest: history.digest(),
        });
        if !start.resumed && !start.has_history && !history.is_empty() {
            ctx.provide_history(history);
        }
        Ok(())
    }

    async fn recall(&self, ctx: &RunContext, input: &str) -> Result<(), BoxError> {
        let now = (self.clock)();
        let namespace = self.namespace_of(ctx);
        let query = RecallQuery {
            namespace: &namespace,
            text: input,
            limit: self.recall_limit,
            now,
        };
        let items = self.retriever.retrieve(&*self.memory, query).await?;
        if items.is_empty() {
            return Ok(());
        }
        ctx.add_run_context(memory_context(&items));
        let ids: Vec<u64> = items.iter().map(|i| i.id).collect();
        ctx.log_event("memory_recalled", json!({"items": ids}));
        self.memory.touch(&ids, now).await?;
        Ok(())
    }

    /// Saves the transcript as the thread: only what follows the part
    /// loaded, when the transcript still starts with it. Answers where the
    /// run's own messages start.
    async fn save(
        &self,
        ctx: &RunContext,
        thread: &str,
        run: &AgentRun,
    ) -> Result<usize, BoxError> {
        let messages = &run.messages;
        let keep = match ctx.state::<Loaded>() {
            Some(loaded)
                if loaded.len <= messages.len()
                    && messages.prefix_digest(loaded.len) == loaded.digest =>
            {
                loaded.len
            }
            _ => 0,
        };
        let all = messages.to_contiguous();
        self.memory.save_thread(thread, keep, &all[keep..]).await?;
        ctx.log_event(
            "memory_saved",
            json!({"thread": thread, "kept": keep, "written": messages.len() - keep}),
        );
        Ok(keep)
    }

    async fn extract(
        &self,
        ctx: &RunContext,
        run: &AgentRun,
        first: usize,
    ) -> Result<(), BoxError> {
        let Some(extractor) = &self.extractor else {
            return Ok(());
        };
        let namespace = self.namespace_of(ctx);
        let known = self.memory.items(&namespace).await?;
        let all = run.messages.to_contiguous();
        let request = ExtractionRequest {
            messages: &all[first..],
            first_index: first,
            known: &known,
        };
        let work = self.work_context(ctx);
        let found = tokio::select! {
            biased;
            () = ctx.cancelled() => return Err(Skipped.into()),
            found = extractor.extract(&work, request) => found?,
        };
        let now = (self.clock)();
        let seen: Vec<String> = known.iter().map(|i| normalized(&i.text)).collect();
        let mut items: Vec<MemoryItem> = Vec::new();
        for found in found {
            let key = normalized(&found.text);
            if seen.contains(&key) || items.iter().any(|i| normalized(&i.text) == key) {
                continue;
            }
            items.push(
                MemoryItem::new(&*namespace, found.kind, found.text, now).provenance(Provenance {
                    run_id: run.run_id.to_string(),
                    thread_id: ctx.thread_id().map(str::to_owned),
                    message: found.message.and_then(|m| u32::try_from(m).ok()),
                }),
            );
        }
        let count = items.len();
        let ids = if items.is_empty() {
            Vec::new()
        } else {
            self.memory.add_items(items).await?
        };
        ctx.log_event("memory_extracted", json!({"items": ids, "count": count}));
        Ok(())
    }

    async fn compact(
        &self,
        ctx: &RunContext,
        thread: &str,
        run: &AgentRun,
    ) -> Result<(), BoxError> {
        let Some(compaction) = &self.compaction else {
            return Ok(());
        };
        let messages = &run.messages;
        let Some(plan) = compaction.plan(messages) else {
            return Ok(());
        };
        if !crate::hooks::before_compaction(ctx, messages).await? {
            ctx.log_event("memory_compaction_skipped", json!({"thread": thread}));
            return Ok(());
        }
        let work = self.work_context(ctx);
        let (compacted, summary) = tokio::select! {
            biased;
            () = ctx.cancelled() => return Err(Skipped.into()),
            done = compaction.compact(&work, messages, plan) => done?,
        };
        let lead = plan.0;
        let all = compacted.to_contiguous();
        self.memory.save_thread(thread, lead, &all[lead..]).await?;
        ctx.log_event(
            "memory_compacted",
            json!({"thread": thread, "messages_before": messages.len(), "messages_after": compacted.len()}),
        );
        let done = Compaction {
            by: self.name.to_string(),
            messages_before: messages.len(),
            messages_after: compacted.len(),
            summary: Some(summary),
        };
        crate::hooks::after_compaction(ctx, &done).await?;
        Ok(())
    }

    /// Save, extract, compact; each failure logged, none returned.
    async fn after_run(&self, ctx: &RunContext, run: &AgentRun) {
        let completed = matches!(run.status, RunStatus::Completed);
        let thread = ctx.thread_id();
        let mut first = 0;
        let mut saved = false;
        if let Some(thread) = thread {
            match self.save(ctx, thread, run).await {
                Ok(keep) => {
                    first = keep;
                    saved = true;
                }
                Err(err) => failed(ctx, "save", &err),
            }
        }
        if !completed {
            return;
        }
        if ctx.is_cancelled() {
            if self.extractor.is_some() || self.compaction.is_some() {
                failed(ctx, "after_run", &(Box::new(Skipped) as BoxError));
            }
            return;
        }
        if let Err(err) = self.extract(ctx, run, first).await {
            failed(ctx, "extraction", &err);
            return;
        }
        if let (Some(thread), true) = (thread, saved) {
            if let Err(err) = self.compact(ctx, thread, run).await {
                failed(ctx, "compaction", &err);
            }
        }
    }
}

/// The caller stopped waiting: slow work is skipped.
#[derive(Debug)]
struct Skipped;

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("skipped: the run was cancelled (the caller stopped waiting)")
    }
}

impl std::error::Error for Skipped {}

fn normalized(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .trim_end_matches('.')
        .to_lowercase()
}

/// Logs a failure of `phase`; the run's result stands.
fn failed(ctx: &RunContext, phase: &str, err: &BoxError) {
    tracing::warn!(
        run_id = %ctx.run_id(),
        phase,
        error = %err,
        "memory: {phase} failed; the run's result stands"
    );
    ctx.log_event(
        "memory_failed",
        json!({"phase": phase, "error": err.to_string()}),
    );
}

impl Middleware for MemoryMiddleware {
    fn name(&self) -> &str {
        &self.name
    }

    fn before_agent<'a>(
        &'a self,
        ctx: &'a RunContext,
        start: RunStart,
    ) -> Hook<'a, Option<String>> {
        if ctx.parent().is_some() {
            return Hook::skip();
        }
        let Some(thread) = ctx.thread_id() else {
            return Hook::skip();
        };
        Hook::new(async move {
            self.load(ctx, thread, start).await?;
            Ok(None)
        })
    }

    fn before_run<'a>(
        &'a self,
        ctx: &'a RunContext,
        input: &'a mut Message,
        _messages: &'a History,
    ) -> Hook<'a, Option<String>> {
        if ctx.parent().is_some() || self.recall_limit == 0 {
            return Hook::skip();
        }
        Hook::new(async move {
            let text = input.text().into_owned();
            if let Err(err) = self.recall(ctx, &text).await {
                failed(ctx, "recall", &err);
            }
            Ok(None)
        })
    }

    fn after_agent<'a>(&'a self, ctx: &'a RunContext, outcome: RunOutcome<'a>) -> Hook<'a, ()> {
        if ctx.parent().is_some() {
            return Hook::skip();
        }
        let Some(run) = outcome.run() else {
            return Hook::skip();
        };
        if matches!(run.status, RunStatus::Paused(_)) {
            return Hook::skip();
        }
        Hook::new(async move {
            self.after_run(ctx, run).await;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests;
