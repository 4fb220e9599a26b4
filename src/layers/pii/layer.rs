//! [`MaskPii`]: the PII engine as the innermost layer of the model stack.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll};

use regex::Regex;
use serde_json::json;
use tower::{Layer, Service};

use super::{
    CustomDetector, PiiBlocked, PiiConfig, PiiEngine, PiiKind, PiiSession, Strategy, StreamRestorer,
};
use crate::context::RunContext;
use crate::error::{AgentError, BoxError};
use crate::event::AgentEvent;
use crate::request::{DeltaSink, ModelCall};
use crate::types::{ContentPart, History, Message, MessageContent, ModelDelta, ModelResponse};

/// Applies [`MaskPii`] to a model service. See the [module docs](super).
///
/// The layer is its own builder: [`new`](Self::new) detects every built-in
/// kind and masks each with reversible placeholders; each setter changes
/// one thing. What can fail (a [custom pattern](Self::custom_pattern) that is
/// not a valid regex) is checked once, when the layer first builds a service
/// (or at [`validate`](Self::validate)): such a service fails every call with
/// [`AgentError::Config`] (`INVALID_CONFIG`) naming the pattern.
///
/// ```
/// use tower_agent::layers::pii::{MaskPiiLayer, PiiKind, Strategy};
///
/// let layer = MaskPiiLayer::new()
///     .disable(PiiKind::Ipv4)
///     .strategy(PiiKind::CreditCard, Strategy::Redact)
///     .block(PiiKind::PrivateKey)
///     .custom_pattern("employee_id", r"\bEMP-\d{6}\b")
///     .hash_salt("a secret of yours");
/// assert!(layer.validate().is_ok());
///
/// let bad = MaskPiiLayer::new().custom_pattern("broken", "(unclosed");
/// assert!(bad.validate().unwrap_err().to_string().contains("broken"));
/// ```
///
/// # Clone
///
/// Clones share the compiled engine (it is built once, on first use).
/// Sessions are per run, never shared between runs.
#[derive(Clone)]
pub struct MaskPiiLayer {
    config: PiiConfig,
    /// Custom detectors in registration order, patterns not yet compiled.
    custom: Vec<Pending>,
    /// The engine, built (and the patterns compiled) once, on first use.
    engine: Arc<OnceLock<Result<PiiEngine, Arc<str>>>>,
}

/// A custom detector as registered on the layer.
#[derive(Debug, Clone)]
enum Pending {
    Ready(CustomDetector),
    Pattern { name: Arc<str>, pattern: String },
}

impl Pending {
    fn name(&self) -> &str {
        match self {
            Pending::Ready(d) => d.name(),
            Pending::Pattern { name, .. } => name,
        }
    }
}

impl MaskPiiLayer {
    /// Detects every built-in kind and masks each with a reversible
    /// placeholder ([`Strategy::Mask`]), with no hash salt and no custom
    /// detectors.
    pub fn new() -> Self {
        Self {
            config: PiiConfig::new(),
            custom: Vec::new(),
            engine: Arc::default(),
        }
    }

    /// Masks with an engine already built (and shared, e.g. with code that
    /// masks outside the model stack). Setters called afterwards start from
    /// that engine's configuration and build an engine of their own.
    pub fn with_engine(engine: PiiEngine) -> Self {
        let mut config = engine.config().clone();
        let custom = config
            .custom_detectors()
            .iter()
            .cloned()
            .map(Pending::Ready)
            .collect();
        for detector in config.custom_detectors().to_vec() {
            config = config.disable(detector.kind());
        }
        Self {
            config,
            custom,
            engine: Arc::new(OnceLock::from(Ok(engine))),
        }
    }

    /// Changes the configuration: the layer gets an engine of its own.
    fn with(mut self, change: impl FnOnce(PiiConfig) -> PiiConfig) -> Self {
        self.config = change(self.config);
        self.engine = Arc::default();
        self
    }

    /// Detects exactly the given built-in kinds (custom kinds in the list
    /// are ignored; add custom detectors with [`custom`](Self::custom)).
    pub fn kinds(self, kinds: impl IntoIterator<Item = PiiKind>) -> Self {
        self.with(|c| c.kinds(kinds))
    }

    /// Detects one more built-in kind (no effect for a custom kind).
    pub fn enable(self, kind: PiiKind) -> Self {
        self.with(|c| c.enable(kind))
    }

    /// Stops detecting one kind. For a custom kind, removes the custom
    /// detectors with that name.
    pub fn disable(mut self, kind: PiiKind) -> Self {
        if let PiiKind::Custom(name) = &kind {
            self.custom.retain(|d| d.name() != &**name);
        }
        self.with(|c| c.disable(kind))
    }

    /// The strategy for kinds without one of their own (default
    /// [`Strategy::Mask`]).
    pub fn default_strategy(self, strategy: Strategy) -> Self {
        self.with(|c| c.default_strategy(strategy))
    }

    /// The strategy for one kind.
    pub fn strategy(self, kind: PiiKind, strategy: Strategy) -> Self {
        self.with(|c| c.strategy(kind, strategy))
    }

    /// Ends the run with a tripwire when the conversation holds `kind`:
    /// short for `.strategy(kind, Strategy::Block)`.
    pub fn block(self, kind: PiiKind) -> Self {
        self.strategy(kind, Strategy::Block)
    }

    /// Adds a custom detector (a compiled regex or a function).
    pub fn custom(mut self, detector: CustomDetector) -> Self {
        self.custom.push(Pending::Ready(detector));
        self.with(|c| c)
    }

    /// Adds a custom detector from a regex pattern, compiled when the layer
    /// first builds a service. A pattern that does not compile makes that
    /// service fail every call with [`AgentError::Config`]; check it up
    /// front with [`validate`](Self::validate).
    pub fn custom_pattern(mut self, name: impl Into<Arc<str>>, pattern: impl Into<String>) -> Self {
        self.custom.push(Pending::Pattern {
            name: name.into(),
            pattern: pattern.into(),
        });
        self.with(|c| c)
    }

    /// The salt mixed into [`Strategy::Hash`] digests (default none). Use a
    /// secret salt to keep short values (phone numbers, SSNs) from being
    /// brute-forced.
    pub fn hash_salt(self, salt: impl AsRef<[u8]>) -> Self {
        self.with(|c| c.hash_salt(salt))
    }

    /// Builds the engine, as building the first service does, and returns
    /// it (shared by every clone of the layer made since the last setter).
    ///
    /// # Errors
    ///
    /// [`AgentError::Config`] naming the custom pattern that is not a valid
    /// regex.
    pub fn engine(&self) -> Result<PiiEngine, AgentError> {
        self.built()
            .map_err(|message| AgentError::Config(message.to_string()))
    }

    /// Checks the configuration, as building the first service does.
    ///
    /// # Errors
    ///
    /// As [`engine`](Self::engine).
    pub fn validate(&self) -> Result<(), AgentError> {
        self.engine().map(drop)
    }

    fn built(&self) -> Result<PiiEngine, Arc<str>> {
        self.engine
            .get_or_init(|| {
                let mut config = self.config.clone();
                for pending in &self.custom {
                    let detector = match pending {
                        Pending::Ready(d) => d.clone(),
                        Pending::Pattern { name, pattern } => match Regex::new(pattern) {
                            Ok(regex) => CustomDetector::regex(name.clone(), regex),
                            Err(err) => {
                                return Err(Arc::from(format!(
                                    "the custom PII detector `{name}` has an invalid pattern: {err}"
                                )))
                            }
                        },
                    };
                    config = config.custom(detector);
                }
                Ok(config.build())
            })
            .clone()
    }
}

impl Default for MaskPiiLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MaskPiiLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaskPiiLayer")
            .field("config", &self.config)
            .field("custom", &self.custom)
            .finish()
    }
}

impl<S> Layer<S> for MaskPiiLayer {
    type Service = MaskPii<S>;

    fn layer(&self, inner: S) -> MaskPii<S> {
        MaskPii {
            inner,
            engine: self.built(),
        }
    }
}

/// Masks PII in every message a model receives and restores it in what the
/// model answers, streamed or not. See the [module docs](super).
#[derive(Debug, Clone)]
pub struct MaskPii<S> {
    inner: S,
    /// The engine, or why the layer's configuration could not build one.
    engine: Result<PiiEngine, Arc<str>>,
}

impl<S> MaskPii<S> {
    /// Wraps `inner`, masking what `engine` detects.
    pub fn new(inner: S, engine: PiiEngine) -> Self {
        Self {
            inner,
            engine: Ok(engine),
        }
    }

    inner_accessors!(inner: S);
}

/// One run's masking state, kept in the run's context: the placeholder map
/// (so placeholders stay the same across turns) and the masked history (so
/// unchanged messages are not masked again).
#[derive(Clone)]
struct RunPii(Arc<Mutex<RunPiiState>>);

struct RunPiiState {
    session: Arc<PiiSession>,
    /// How many messages of the run's history `masked` covers.
    source_len: usize,
    /// The lineage of that history, to tell an append from an edit.
    source_lineage: u64,
    masked: History,
}

impl RunPii {
    fn of(ctx: &RunContext, engine: &PiiEngine) -> RunPii {
        ctx.with_state(|state| {
            state
                .get_or_insert_with(|| {
                    RunPii(Arc::new(Mutex::new(RunPiiState {
                        session: Arc::new(engine.session()),
                        source_len: 0,
                        source_lineage: 0,
                        masked: History::new(),
                    })))
                })
                .clone()
        })
    }

    fn lock(&self) -> MutexGuard<'_, RunPiiState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Masks `message`, counting the values replaced.
fn mask_message(
    session: &PiiSession,
    message: &Message,
    count: &mut usize,
) -> Result<Message, PiiBlocked> {
    let mut mask = |text: &str| -> Result<Option<String>, PiiBlocked> {
        Ok(match session.mask(text)? {
            std::borrow::Cow::Borrowed(_) => None,
            std::borrow::Cow::Owned(masked) => {
                *count += 1;
                Some(masked)
            }
        })
    };
    let mut out = message.clone();
    match &mut out.content {
        Some(MessageContent::Text(text)) => {
            if let Some(masked) = mask(text)? {
                *text = masked;
            }
        }
        Some(MessageContent::Parts(parts)) => {
            for part in parts {
                if let ContentPart::Text { text } = part {
                    if let Some(masked) = mask(text)? {
                        *text = masked;
                    }
                }
            }
        }
        None => {}
    }
    for call in &mut out.tool_calls {
        if let Some(masked) = mask(&call.arguments)? {
            call.arguments = masked;
        }
    }
    Ok(out)
}

/// Restores the placeholders of `message` in place.
fn restore_message(session: &PiiSession, message: &mut Message) {
    let restore = |text: &mut String| {
        if let std::borrow::Cow::Owned(restored) = session.restore(text) {
            *text = restored;
        }
    };
    match &mut message.content {
        Some(MessageContent::Text(text)) => restore(text),
        Some(MessageContent::Parts(parts)) => {
            for part in parts {
                if let ContentPart::Text { text } = part {
                    restore(text);
                }
            }
        }
        None => {}
    }
    for call in &mut message.tool_calls {
        restore(&mut call.arguments);
    }
}

/// The masked history for this call: the run's masked history, extended by
/// the messages added since the last call (all of it again after an edit).
fn masked_history(run: &RunPii, history: &History) -> Result<(History, usize), PiiBlocked> {
    let mut state = run.lock();
    let state = &mut *state;
    let unchanged = state.source_len <= history.len() && history.lineage() == state.source_lineage;
    if !unchanged {
        state.source_len = 0;
        state.masked = History::new();
    }
    let mut count = 0;
    let mut added = Vec::with_capacity(history.len() - state.source_len);
    for message in &history[state.source_len..] {
        added.push(mask_message(&state.session, message, &mut count)?);
    }
    state.masked.extend(added);
    state.source_len = history.len();
    state.source_lineage = history.lineage();
    Ok((state.masked.clone(), count))
}

/// Restores streamed deltas through hold-back buffers: one for the text, one
/// per tool call's arguments.
struct StreamState {
    text: StreamRestorer,
    calls: HashMap<usize, StreamRestorer>,
}

fn restoring_sink(
    sink: DeltaSink,
    session: Arc<PiiSession>,
) -> (DeltaSink, Arc<Mutex<StreamState>>) {
    let state = Arc::new(Mutex::new(StreamState {
        text: session.stream_restorer(),
        calls: HashMap::new(),
    }));
    let shared = state.clone();
    let restoring = sink.wrap(move |sink, delta| {
        let mut state = shared.lock().unwrap_or_else(PoisonError::into_inner);
        match delta {
            ModelDelta::Text { text } => {
                let out = state.text.push(text);
                if !out.is_empty() {
                    sink.send(&ModelDelta::Text { text: out });
                }
            }
            ModelDelta::ToolCall {
                index,
                id,
                name,
                arguments,
            } => {
                let restorer = state
                    .calls
                    .entry(*index)
                    .or_insert_with(|| session.stream_restorer());
                sink.send(&ModelDelta::ToolCall {
                    index: *index,
                    id: id.clone(),
                    name: name.clone(),
                    arguments: restorer.push(arguments),
                });
            }
            other => sink.send(other),
        }
    });
    (restoring, state)
}

/// Sends what the restorers still hold.
fn flush(sink: &DeltaSink, state: &Mutex<StreamState>, session: &Arc<PiiSession>) {
    let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
    let text = std::mem::replace(&mut state.text, session.stream_restorer()).finish();
    if !text.is_empty() {
        sink.send(&ModelDelta::Text { text });
    }
    let mut calls: Vec<_> = state.calls.drain().collect();
    calls.sort_by_key(|(index, _)| *index);
    for (index, restorer) in calls {
        let arguments = restorer.finish();
        if !arguments.is_empty() {
            sink.send(&ModelDelta::ToolCall {
                index,
                id: None,
                name: None,
                arguments,
            });
        }
    }
}

impl<S> Service<ModelCall> for MaskPii<S>
where
    S: Service<ModelCall, Response = ModelResponse>,
    S::Error: Into<BoxError>,
{
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = future::ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut call: ModelCall) -> Self::Future {
        let engine = match &self.engine {
            Ok(engine) => engine,
            Err(message) => {
                let err: BoxError = Box::new(AgentError::Config(message.to_string()));
                return future::ResponseFuture::blocked(err);
            }
        };
        let ctx = call.context.clone();
        let run = RunPii::of(&ctx, engine);
        let session = run.lock().session.clone();
        let (masked, count) = match masked_history(&run, &call.request.messages) {
            Ok(masked) => masked,
            Err(blocked) => {
                let err: BoxError = Box::new(AgentError::Tripwire {
                    middleware: "pii".into(),
                    hook: "wrap_model".into(),
                    reason: format!(
                        "the conversation holds PII of a blocked kind: {}",
                        blocked.kind.label()
                    ),
                    info: Some(json!({ "kind": blocked.kind.label() })),
                });
                return future::ResponseFuture::blocked(err);
            }
        };
        if count > 0 {
            ctx.emit(|| AgentEvent::PiiMasked {
                run_id: ctx.run_id().clone(),
                count,
            });
        }
        call.request.messages = masked;
        let stream = call.stream.take().map(|sink| {
            let (restoring, state) = restoring_sink(sink.clone(), session.clone());
            call.stream = Some(restoring);
            (sink, state)
        });
        future::ResponseFuture::new(self.inner.call(call), session, stream)
    }
}

/// The future of [`MaskPii`].
pub mod future {
    use std::fmt;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{ready, Context, Poll};

    use pin_project_lite::pin_project;

    use super::{flush, restore_message, PiiSession, StreamState};
    use crate::error::BoxError;
    use crate::request::DeltaSink;
    use crate::types::ModelResponse;

    /// The caller's sink and the restorers feeding it.
    pub(super) type Stream = (DeltaSink, Arc<Mutex<StreamState>>);

    pin_project! {
        /// The response future of [`MaskPii`](super::MaskPii): the inner
        /// call, then the answer's placeholders restored.
        pub struct ResponseFuture<F> {
            #[pin]
            state: State<F>,
        }
    }

    pin_project! {
        #[project = StateProj]
        enum State<F> {
            Calling {
                #[pin]
                future: F,
                session: Arc<PiiSession>,
                stream: Option<Stream>,
            },
            Blocked {
                error: Option<BoxError>,
            },
        }
    }

    impl<F> ResponseFuture<F> {
        pub(super) fn new(future: F, session: Arc<PiiSession>, stream: Option<Stream>) -> Self {
            Self {
                state: State::Calling {
                    future,
                    session,
                    stream,
                },
            }
        }

        pub(super) fn blocked(error: BoxError) -> Self {
            Self {
                state: State::Blocked { error: Some(error) },
            }
        }
    }

    impl<F, E> Future for ResponseFuture<F>
    where
        F: Future<Output = Result<ModelResponse, E>>,
        E: Into<BoxError>,
    {
        type Output = Result<ModelResponse, BoxError>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            match self.project().state.project() {
                StateProj::Calling {
                    future,
                    session,
                    stream,
                } => {
                    let result = ready!(future.poll(cx)).map_err(Into::into);
                    if let Some((sink, state)) = stream.take() {
                        flush(&sink, &state, session);
                    }
                    let mut response = result?;
                    restore_message(session, &mut response.message);
                    Poll::Ready(Ok(response))
                }
                StateProj::Blocked { error } => {
                    Poll::Ready(Err(error.take().unwrap_or_else(|| {
                        "the PII layer's future was polled after it finished".into()
                    })))
                }
            }
        }
    }

    impl<F> fmt::Debug for ResponseFuture<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("ResponseFuture").finish_non_exhaustive()
        }
    }
}
