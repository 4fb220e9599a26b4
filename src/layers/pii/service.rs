//! [`MaskPii`]: the PII engine as the innermost layer of the model stack.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use serde_json::json;
use tower::Service;

use crate::context::RunContext;
use crate::error::{AgentError, BoxError};
use crate::event::AgentEvent;
use crate::pii::{PiiBlocked, PiiEngine, PiiSession, StreamRestorer};
use crate::request::{DeltaSink, ModelCall};
use crate::types::{ContentPart, History, Message, MessageContent, ModelDelta, ModelResponse};

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

    /// Wraps `inner` with what a layer's configuration built.
    pub(super) fn from_built(inner: S, engine: Result<PiiEngine, Arc<str>>) -> Self {
        Self { inner, engine }
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
    /// The masked history; `None` while masking changed nothing, so the
    /// model gets the run's own history.
    masked: Option<History>,
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
                        masked: None,
                    })))
                })
                .clone()
        })
    }

    fn lock(&self) -> MutexGuard<'_, RunPiiState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The usual call of a run: `history` is the one masked last time, as
    /// it was. Answered without cloning the run's state out of the context.
    fn unchanged(ctx: &RunContext, history: &History) -> Option<Masked> {
        ctx.with_state(|state| {
            let state = state.get::<RunPii>()?.lock();
            (state.source_len == history.len() && state.source_lineage == history.lineage()).then(
                || Masked {
                    history: state.masked.clone(),
                    count: 0,
                    session: state.session.clone(),
                },
            )
        })
    }
}

/// Masks `message`, counting the values replaced: `None` when nothing in it
/// changes (and nothing is copied).
fn mask_message(
    session: &PiiSession,
    message: &Message,
    count: &mut usize,
) -> Result<Option<Message>, PiiBlocked> {
    let mut out: Option<Message> = None;
    match &message.content {
        Some(MessageContent::Text(text)) => {
            if let Cow::Owned(masked) = session.mask(text)? {
                *count += 1;
                out.get_or_insert_with(|| message.clone()).content =
                    Some(MessageContent::Text(masked));
            }
        }
        Some(MessageContent::Parts(parts)) => {
            // The model reads the text parts joined up: mask them as one.
            let texts: Vec<&str> = parts
                .iter()
                .filter_map(|part| match part {
                    ContentPart::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect();
            if let Some(masked) = session.mask_parts(&texts)? {
                *count += 1;
                let copy = out.get_or_insert_with(|| message.clone());
                if let Some(MessageContent::Parts(parts)) = &mut copy.content {
                    let mut masked = masked.into_iter();
                    for part in parts.iter_mut() {
                        if let ContentPart::Text { text } = part {
                            if let Some(m) = masked.next() {
                                *text = m;
                            }
                        }
                    }
                }
            }
        }
        None => {}
    }
    for (i, call) in message.tool_calls.iter().enumerate() {
        if let Cow::Owned(masked) = session.mask_json(&call.arguments)? {
            *count += 1;
            out.get_or_insert_with(|| message.clone()).tool_calls[i].arguments = masked;
        }
    }
    Ok(out)
}

/// Restores the placeholders of `message` in place.
fn restore_message(session: &PiiSession, message: &mut Message) {
    let restore = |text: &mut String| {
        if let Cow::Owned(restored) = session.restore(text) {
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
        if let Cow::Owned(restored) = session.restore_json(&call.arguments) {
            call.arguments = restored;
        }
    }
}

/// What one call sends: the masked history (`None`: the call's own history
/// unchanged), how many values were masked in the messages added since the
/// last call, and the run's session.
struct Masked {
    history: Option<History>,
    count: usize,
    session: Arc<PiiSession>,
}

/// The masked history for this call: the run's masked history, extended by
/// the messages added since the last call (all of it again after an edit).
/// A message masking leaves unchanged is not copied; while none changed,
/// no history is built at all.
fn masked_history(run: &RunPii, history: &History) -> Result<Masked, PiiBlocked> {
    let mut state = run.lock();
    let state = &mut *state;
    let len = history.len();
    let unchanged = state.source_len <= len && history.lineage() == state.source_lineage;
    if !unchanged {
        state.source_len = 0;
        state.masked = None;
    }
    let mut count = 0;
    if state.source_len < len {
        let mut changed: Vec<(usize, Message)> = Vec::new();
        for (i, message) in history.iter().enumerate().skip(state.source_len) {
            if let Some(masked) = mask_message(&state.session, message, &mut count)? {
                changed.push((i, masked));
            }
        }
        if !changed.is_empty() || state.masked.is_some() {
            let source_len = state.source_len;
            let masked = state.masked.get_or_insert_with(|| {
                let mut prefix = history.clone();
                prefix.truncate(source_len);
                prefix
            });
            let mut changed = changed.into_iter().peekable();
            masked.extend(history.iter().enumerate().skip(source_len).map(|(i, m)| {
                match changed.next_if(|(j, _)| *j == i) {
                    Some((_, masked)) => masked,
                    None => m.clone(),
                }
            }));
        }
        state.source_len = len;
        state.source_lineage = history.lineage();
    }
    Ok(Masked {
        history: state.masked.clone(),
        count,
        session: state.session.clone(),
    })
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
                    .or_insert_with(|| session.json_stream_restorer());
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

    #[inline]
    fn call(&mut self, mut call: ModelCall) -> Self::Future {
        let engine = match &self.engine {
            Ok(engine) => engine,
            Err(message) => {
                let err: BoxError = Box::new(AgentError::Config(message.to_string()));
                return future::ResponseFuture::blocked(err);
            }
        };
        let masked = match RunPii::unchanged(&call.context, &call.request.messages) {
            Some(masked) => masked,
            None => {
                let run = RunPii::of(&call.context, engine);
                match masked_history(&run, &call.request.messages) {
                    Ok(masked) => masked,
                    Err(blocked) => return future::ResponseFuture::blocked(blocked_error(blocked)),
                }
            }
        };
        let Masked {
            history,
            count,
            session,
        } = masked;
        if count > 0 {
            let ctx = &call.context;
            ctx.emit(|| AgentEvent::PiiMasked {
                run_id: ctx.run_id().clone(),
                count,
            });
        }
        if let Some(history) = history {
            call.request.messages = history;
        }
        let stream = call.stream.take().map(|sink| {
            let (restoring, state) = restoring_sink(sink.clone(), session.clone());
            call.stream = Some(restoring);
            (sink, state)
        });
        future::ResponseFuture::new(self.inner.call(call), session, stream)
    }
}

/// The tripwire of a conversation holding PII of a blocked kind.
#[cold]
fn blocked_error(blocked: PiiBlocked) -> BoxError {
    Box::new(AgentError::Tripwire {
        middleware: "pii".into(),
        hook: "wrap_model".into(),
        reason: format!(
            "the conversation holds PII of a blocked kind: {}",
            blocked.kind.label()
        ),
        info: Some(json!({ "kind": blocked.kind.label() })),
    })
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
        #[inline]
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

        #[inline]
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            match self.project().state.project() {
                StateProj::Calling {
                    future,
                    session,
                    stream,
                } => {
                    let result = ready!(future.poll(cx));
                    if let Some((sink, state)) = stream.take() {
                        flush(&sink, &state, session);
                    }
                    Poll::Ready(match result {
                        Ok(mut response) => {
                            // A session that handed out no placeholder has
                            // nothing to restore.
                            if !session.is_empty() {
                                restore_message(session, &mut response.message);
                            }
                            Ok(response)
                        }
                        Err(err) => Err(err.into()),
                    })
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
