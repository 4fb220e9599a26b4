//! The request and response of each boundary: a run, a model call, a tool
//! call. Each request carries its run's [`RunContext`] and an
//! [`http::Extensions`] bag for what users' layers add.
//!
//! | boundary | request | response |
//! | --- | --- | --- |
//! | a run | [`RunRequest`] | [`AgentRun`](crate::types::AgentRun) |
//! | a model call | [`ModelCall`] | [`ModelResponse`](crate::types::ModelResponse) |
//! | a tool call | [`ToolInvocation`] | [`ToolOutput`] |

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use crate::context::RunContext;
use crate::error::{find, AgentError, BoxError, ErrorKind, TimeoutSource, ToolPanicked};
use crate::types::{
    ApprovalDecision, Checkpoint, History, Message, ModelDelta, ModelRequest, ToolCall,
};

/// Where streamed pieces of an answer go: the run's `on_token`.
///
/// A sink is *provisional* when what it receives does not reach anyone yet:
/// the run holds a turn's text until the hooks saw it, then sends it in one
/// piece. A retry may replay a call whose deltas only went to a provisional
/// sink.
///
/// # Clone
///
/// Clones send to the same place.
#[derive(Clone)]
pub struct DeltaSink {
    /// Whether the sink is provisional is the receiver's to say: a sink is
    /// one pointer, in every request and every run.
    f: Arc<dyn Deliver>,
}

impl DeltaSink {
    /// A sink calling `f` for every delta.
    pub fn new(f: impl Fn(&ModelDelta) + Send + Sync + 'static) -> Self {
        Self { f: Arc::new(f) }
    }

    /// A provisional sink calling `f`: see the type's docs.
    pub fn provisional(f: impl Fn(&ModelDelta) + Send + Sync + 'static) -> Self {
        Self {
            f: Arc::new(Provisional(f)),
        }
    }

    /// A sink sending every delta into an unbounded channel.
    pub fn channel() -> (Self, tokio::sync::mpsc::UnboundedReceiver<ModelDelta>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (
            Self::new(move |delta| {
                let _ = tx.send(delta.clone());
            }),
            rx,
        )
    }

    /// A sink that hands each delta to `f` along with this sink, to pass on
    /// (changed, split, held or not at all). It is provisional if this one is.
    pub fn wrap(&self, f: impl Fn(&DeltaSink, &ModelDelta) + Send + Sync + 'static) -> Self {
        let inner = self.clone();
        let provisional = self.is_provisional();
        let f = move |delta: &ModelDelta| f(&inner, delta);
        if provisional {
            Self::provisional(f)
        } else {
            Self::new(f)
        }
    }

    /// Whether what this sink receives reaches nobody yet.
    pub fn is_provisional(&self) -> bool {
        self.f.provisional()
    }

    /// Sends one delta.
    #[inline]
    pub fn send(&self, delta: &ModelDelta) {
        self.f.deliver(delta)
    }
}

impl DeltaSink {
    /// A sink calling `f`, shared with whoever else holds it (the lifecycle
    /// chain keeps the state of its delta hooks there, in one allocation).
    pub(crate) fn shared(f: Arc<dyn Deliver>, provisional: bool) -> Self {
        if provisional {
            Self {
                f: Arc::new(Provisional(Shared(f))),
            }
        } else {
            Self { f }
        }
    }
}

/// What a [`DeltaSink`] calls with each delta: any
/// `Fn(&ModelDelta) + Send + Sync`, or a crate type that keeps more state.
pub(crate) trait Deliver: Send + Sync + 'static {
    fn deliver(&self, delta: &ModelDelta);

    /// Whether what it receives reaches nobody yet.
    fn provisional(&self) -> bool {
        false
    }
}

/// A receiver whose deltas reach nobody yet.
struct Provisional<D>(D);

impl<D: Deliver> Deliver for Provisional<D> {
    #[inline]
    fn deliver(&self, delta: &ModelDelta) {
        self.0.deliver(delta)
    }

    fn provisional(&self) -> bool {
        true
    }
}

/// A shared receiver, as a receiver.
struct Shared(Arc<dyn Deliver>);

impl Deliver for Shared {
    #[inline]
    fn deliver(&self, delta: &ModelDelta) {
        self.0.deliver(delta)
    }
}

impl<F: Fn(&ModelDelta) + Send + Sync + 'static> Deliver for F {
    #[inline]
    fn deliver(&self, delta: &ModelDelta) {
        self(delta)
    }
}

impl fmt::Debug for DeltaSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DeltaSink")
    }
}

/// One call to one model: the request of the model stack.
///
/// A call is a shared handle to its [`ModelCallParts`] (the request, the
/// stream sink, the run's context, the extensions), which it derefs to: read
/// and write them as fields of the call (`call.request.model`,
/// `call.context`, `call.extensions.insert(..)`).
///
/// ```
/// use tower_agent::types::{Message, ModelRequest};
/// use tower_agent::{ModelCall, RunContext};
///
/// let mut call = ModelCall::new(ModelRequest::new("small", vec![Message::user("Hi")]), RunContext::new());
/// let kept = call.clone(); // one reference count
/// call.request.model = "big".into(); // copies the parts: `kept` is unchanged
/// assert_eq!(call.request.model, "big");
/// assert_eq!(kept.request.model, "small");
/// ```
///
/// # Clone
///
/// One reference count: clones share the parts. The first change through a
/// call whose parts are shared copies them (copy on write), which is O(1)
/// too: the history, the tools and the context are shared. Retry, fallback
/// and cache clone freely.
#[derive(Clone)]
pub struct ModelCall {
    parts: Arc<ModelCallParts>,
}

/// What a [`ModelCall`] carries: see its docs.
#[derive(Debug, Clone)]
pub struct ModelCallParts {
    /// What the backend gets.
    pub request: ModelRequest,
    /// Where streamed text goes, when the run streams.
    pub stream: Option<DeltaSink>,
    /// The run's context.
    pub context: RunContext,
    /// What users' layers add.
    pub extensions: http::Extensions,
}

impl ModelCall {
    /// A call of `request` in the run of `context`, not streamed.
    pub fn new(request: ModelRequest, context: RunContext) -> Self {
        Self::from_parts(ModelCallParts {
            request,
            stream: None,
            context,
            extensions: http::Extensions::new(),
        })
    }

    /// A call of these parts.
    pub fn from_parts(parts: ModelCallParts) -> Self {
        Self {
            parts: Arc::new(parts),
        }
    }

    /// The parts, moved out when this is the only handle, copied otherwise.
    pub fn into_parts(self) -> ModelCallParts {
        Arc::unwrap_or_clone(self.parts)
    }

    /// Whether `a` and `b` share their parts (neither changed since one was
    /// cloned from the other).
    pub fn ptr_eq(a: &ModelCall, b: &ModelCall) -> bool {
        Arc::ptr_eq(&a.parts, &b.parts)
    }
}

impl From<ModelCallParts> for ModelCall {
    fn from(parts: ModelCallParts) -> Self {
        Self::from_parts(parts)
    }
}

impl std::ops::Deref for ModelCall {
    type Target = ModelCallParts;

    #[inline]
    fn deref(&self) -> &ModelCallParts {
        &self.parts
    }
}

/// Copies the parts first when a clone shares them.
impl std::ops::DerefMut for ModelCall {
    #[inline]
    fn deref_mut(&mut self) -> &mut ModelCallParts {
        Arc::make_mut(&mut self.parts)
    }
}

impl fmt::Debug for ModelCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelCall")
            .field("request", &self.parts.request)
            .field("stream", &self.parts.stream)
            .field("context", &self.parts.context)
            .field("extensions", &self.parts.extensions)
            .finish()
    }
}

/// One tool call: the request of the tool stack.
#[derive(Debug, Clone)]
pub struct ToolInvocation {
    /// The call as the model made it (with any rewritten arguments).
    pub call: ToolCall,
    /// The arguments, parsed.
    pub args: Value,
    /// Whether a person (or a hook deciding for one) approved the call. An
    /// approval never carries over to changed arguments.
    pub approved: bool,
    /// Whether the tool is marked idempotent: only then may a retry layer
    /// call it again.
    pub idempotent: bool,
    /// Where the tool's streamed progress goes, if anywhere.
    pub stream: Option<DeltaSink>,
    /// The run's context.
    pub context: RunContext,
    /// What users' layers add.
    pub extensions: http::Extensions,
}

impl ToolInvocation {
    /// An invocation of `call`, its arguments parsed from JSON text; invalid
    /// JSON parses as `null` (the router answers it with an error).
    pub fn new(call: ToolCall, context: RunContext) -> Self {
        let args = serde_json::from_str(&call.arguments).unwrap_or(Value::Null);
        Self {
            call,
            args,
            approved: false,
            idempotent: false,
            stream: None,
            context,
            extensions: http::Extensions::new(),
        }
    }
}

/// A request that carries its run's [`RunContext`]: what layers that only
/// need the run (its deadline, cancellation, events, ledger) are generic over,
/// so one layer serves the model stack and the tool stack alike.
pub trait HasContext {
    /// The run's context.
    fn context(&self) -> &RunContext;

    /// What a per-call timeout of this request reports as: a call timeout
    /// by default, a tool call's timeout for a [`ToolInvocation`].
    fn call_timer(&self) -> TimeoutSource {
        TimeoutSource::CallTimeout
    }
}

impl HasContext for ModelCall {
    fn context(&self) -> &RunContext {
        &self.context
    }
}

impl HasContext for ToolInvocation {
    fn context(&self) -> &RunContext {
        &self.context
    }

    fn call_timer(&self) -> TimeoutSource {
        TimeoutSource::Tool
    }
}

/// What a tool answers: the text the model reads, and whether it is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    /// The text the model reads.
    pub content: String,
    /// Whether the call failed (the model still reads `content`).
    pub is_error: bool,
}

impl ToolOutput {
    /// A successful result.
    pub fn text(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: false,
        }
    }

    /// A failed result the model reads.
    pub fn error(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: true,
        }
    }
}

/// What a run starts from.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RunInput {
    /// A new run with this user message.
    Message(Message),
    /// A paused run, continued with decisions for its waiting calls.
    Resume {
        /// The paused run.
        checkpoint: Box<Checkpoint>,
        /// A decision per waiting call (calls without one are asked again).
        decisions: Vec<ApprovalDecision>,
    },
}

/// One run of an agent: the request of the run stack.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The input, or the checkpoint to resume.
    pub input: RunInput,
    /// The thread's earlier messages, before the input.
    pub history: History,
    /// The run's context.
    pub context: RunContext,
    /// Where streamed text goes.
    pub stream: Option<DeltaSink>,
    /// What users' layers add (e.g. the middleware of one run).
    pub extensions: http::Extensions,
}

impl RunRequest {
    /// A new run answering the user message `input`, in a fresh root context.
    pub fn new(input: impl Into<String>) -> Self {
        Self::message(Message::user(input))
    }

    /// A new run answering `message`.
    pub fn message(message: Message) -> Self {
        Self {
            input: RunInput::Message(message),
            history: History::new(),
            context: RunContext::new(),
            stream: None,
            extensions: http::Extensions::new(),
        }
    }

    /// Continues a paused run with `decisions`, keeping its run id and thread.
    pub fn resume(checkpoint: Checkpoint, decisions: Vec<ApprovalDecision>) -> Self {
        let mut context = RunContext::builder().run_id(checkpoint.run_id.as_str());
        if let Some(thread) = &checkpoint.thread_id {
            context = context.thread_id(thread.as_str());
        }
        Self {
            input: RunInput::Resume {
                checkpoint: Box::new(checkpoint),
                decisions,
            },
            history: History::new(),
            context: context.build(),
            stream: None,
            extensions: http::Extensions::new(),
        }
    }

    /// Runs in `context` instead of a fresh one.
    pub fn context(mut self, context: RunContext) -> Self {
        self.context = context;
        self
    }

    /// The thread's earlier messages.
    pub fn history(mut self, history: impl Into<History>) -> Self {
        self.history = history.into();
        self
    }

    /// Streams the answer's text into `sink`.
    pub fn stream(mut self, sink: DeltaSink) -> Self {
        self.stream = Some(sink);
        self
    }
}

/// A type-erased, cloneable, `Sync` model service.
pub type BoxModel =
    tower::util::BoxCloneSyncService<ModelCall, crate::types::ModelResponse, BoxError>;

/// A type-erased, cloneable, `Sync` tool service.
pub type BoxTool = tower::util::BoxCloneSyncService<ToolInvocation, ToolOutput, BoxError>;

/// A type-erased, cloneable, `Sync` run service (an agent, layered or not).
pub type BoxAgent = tower::util::BoxCloneSyncService<RunRequest, crate::types::AgentRun, BoxError>;

/// Erases a model service's type.
pub fn box_model<S>(service: S) -> BoxModel
where
    S: tower::Service<ModelCall, Response = crate::types::ModelResponse>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    tower::util::BoxCloneSyncService::new(ErrInto(service))
}

/// Erases a tool service's type.
pub fn box_tool<S>(service: S) -> BoxTool
where
    S: tower::Service<ToolInvocation, Response = ToolOutput> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    tower::util::BoxCloneSyncService::new(ErrInto(service))
}

/// `S` with its errors made [`BoxError`]s: what `map_err(Into::into)`
/// does, with a future that converts the error as it passes, where
/// `map_err`'s moves the answer through a closure and a state of its own
/// (an answer is a whole response, and every boxed model or tool has one).
#[derive(Clone)]
struct ErrInto<S>(S);

impl<S, R> tower::Service<R> for ErrInto<S>
where
    S: tower::Service<R>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ErrIntoFuture<S::Future>;

    #[inline]
    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: R) -> Self::Future {
        ErrIntoFuture {
            fut: self.0.call(request),
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`ErrInto`].
    struct ErrIntoFuture<F> {
        #[pin]
        fut: F,
    }
}

impl<F, T, E> std::future::Future for ErrIntoFuture<F>
where
    F: std::future::Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    #[inline]
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<T, BoxError>> {
        self.project().fut.poll(cx).map_err(Into::into)
    }
}

/// What a failed tool call becomes: the error result the model reads, or,
/// for the errors that end the run, the run's error.
///
/// The one place this rule lives. A tripwire, a cancellation, a
/// mismatched approval and a broken history end the run. A middleware's
/// error ends it too when a hook of this run (or of a run it is nested in)
/// raised it; a nested run's own middleware failing only failed that nested
/// run, which its parent's model reads as a failed tool call.
///
/// A tool's panic ([`ToolPanicked`]) reads as a failure of the named tool,
/// its message left out unless the agent running the run shows tool panics;
/// the message is noted on `ctx` for the call `call_id`, whose event takes
/// it. A tool call in a run comes here with its panic whichever way it
/// went (without hooks, below wrap hooks, through a tower adapter); outside
/// a run, [`Runtime::invoke_tool`](crate::lifecycle::Runtime::invoke_tool)
/// does too.
pub(crate) fn tool_failure(
    ctx: &RunContext,
    tool: &str,
    call_id: &str,
    err: AgentError,
) -> Result<ToolOutput, AgentError> {
    match err.kind() {
        ErrorKind::Tripwire
        | ErrorKind::Cancelled
        | ErrorKind::Approval
        | ErrorKind::HistoryIntegrity => Err(err),
        ErrorKind::Middleware if ctx.hook_failed_here() => Err(err),
        _ => Ok(ToolOutput::error(match panic_of(&err) {
            Some(panic) => {
                ctx.note_tool_panic(call_id, panic.message());
                if ctx.shows_tool_panics() {
                    format!("The tool `{tool}` panicked: {}", panic.message())
                } else {
                    format!("The tool `{tool}` failed unexpectedly and returned no result.")
                }
            }
            None => format!("The tool `{tool}` failed: {err}"),
        })),
    }
}

/// The tool's panic `err` stands for, if it does.
fn panic_of(err: &AgentError) -> Option<&ToolPanicked> {
    match err {
        AgentError::Other(source) => find::<ToolPanicked>(source.as_ref()),
        _ => None,
    }
}
