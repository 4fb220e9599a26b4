//! [`MaskPii`]: the PII engine as the innermost layer of the model stack.

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use serde_json::json;
use tower::Service;

use super::clean::{text_parts, CleanTexts};
use super::memo::{CleanMemo, Known};
use super::stream::Streamed;
use crate::context::RunContext;
use crate::error::{AgentError, BoxError};
use crate::event::AgentEvent;
use crate::pii::{PiiBlocked, PiiEngine, PiiSession};
use crate::request::ModelCall;
use crate::types::{ContentPart, History, Message, MessageContent, ModelResponse};

/// Masks PII in every message a model receives and restores it in what the
/// model answers, streamed or not. See the [module docs](super).
///
/// # Clone
///
/// Clones share the engine and the memo of the histories found clean.
#[derive(Debug, Clone)]
pub struct MaskPii<S> {
    inner: S,
    core: Arc<Core>,
}

/// What every clone of a [`MaskPii`] shares.
struct Core {
    /// The engine, or why the layer's configuration could not build one.
    engine: Result<PiiEngine, Arc<str>>,
    /// The histories this engine found clean, across runs.
    clean: CleanMemo,
    /// The messages this engine found clean, across runs and histories.
    texts: CleanTexts,
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaskPii")
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

impl<S> MaskPii<S> {
    /// Wraps `inner`, masking what `engine` detects.
    pub fn new(inner: S, engine: PiiEngine) -> Self {
        Self::from_built(inner, Ok(engine))
    }

    /// Wraps `inner` with what a layer's configuration built.
    pub(super) fn from_built(inner: S, engine: Result<PiiEngine, Arc<str>>) -> Self {
        Self {
            inner,
            core: Arc::new(Core {
                engine,
                clean: CleanMemo::default(),
                texts: CleanTexts::default(),
            }),
        }
    }

    inner_accessors!(inner: S);
}

/// One run's masking state, kept in the run's context.
///
/// `last` answers the usual call (the history as the last call had it)
/// under the context's lock alone: no other lock, no copy. The rest, the
/// placeholder map and the masked history, sits behind `shared`, locked only
/// while messages are masked.
#[derive(Clone)]
struct RunPii {
    last: Option<Sent>,
    shared: Arc<Mutex<RunPiiState>>,
}

/// What the last call of a run sent, keyed by its history's `(len, lineage)`.
#[derive(Clone)]
struct Sent {
    len: usize,
    lineage: u64,
    /// The masked history; `None`: the run's own history went unchanged.
    masked: Option<History>,
    /// The session, when it had handed out placeholders to restore.
    restore: Option<Arc<PiiSession>>,
}

impl Sent {
    fn answers(&self, history: &History) -> bool {
        self.len == history.len() && self.lineage == history.lineage()
    }
}

struct RunPiiState {
    session: Arc<PiiSession>,
    /// The `(lineage, len)` of the history masked last: an append to it
    /// keeps its masked form. Not the history itself: an append to a
    /// history held elsewhere copies messages.
    source: Option<(u64, usize)>,
    /// The masked form of `source`; `None` while masking changed nothing,
    /// so the model gets the run's own history.
    masked: Option<History>,
    /// The messages of `source` that masking changed, as they were (by
    /// index): with `masked`, they tell after an edit how many messages
    /// are still the same.
    originals: Vec<(usize, Message)>,
    /// How many leading messages of `source` masking left unchanged.
    clean: usize,
}

/// What one call sends: the masked history (`None`: the call's own history
/// unchanged), how many values were masked in the messages added since the
/// last call, and the session when its placeholders are to be restored.
struct Masked {
    history: Option<History>,
    count: usize,
    restore: Option<Arc<PiiSession>>,
}

/// The usual call of a run: its history is the one the last call sent, as
/// it was. Answered under the context's lock alone.
#[inline]
fn unchanged(ctx: &RunContext, history: &History) -> Option<Masked> {
    ctx.with_state(|state| {
        let sent = state.get::<RunPii>()?.last.as_ref()?;
        sent.answers(history).then(|| Masked {
            history: sent.masked.clone(),
            count: 0,
            restore: sent.restore.clone(),
        })
    })
}

/// Masks what `history` added since the run's last call, and records what
/// this call sends for the next one.
fn mask_run(
    ctx: &RunContext,
    core: &Core,
    engine: &PiiEngine,
    history: &History,
    known_clean: usize,
) -> Result<Masked, PiiBlocked> {
    let shared = ctx.with_state(|state| {
        let run = state.get_or_insert_with(|| RunPii {
            last: None,
            shared: Arc::new(Mutex::new(RunPiiState {
                session: Arc::new(engine.session()),
                source: None,
                masked: None,
                originals: Vec::new(),
                clean: 0,
            })),
        });
        // What the last call sent does not answer this one: let go of it
        // first, so that the masked history grows in place, not copied.
        run.last = None;
        run.shared.clone()
    });
    // The run's lock, then the context's: the other way round nowhere.
    let mut state = shared.lock().unwrap_or_else(PoisonError::into_inner);
    let known_clean = known_clean.min(history.len());
    let mut masked = masked_history(&mut state, &core.texts, history, known_clean)?;
    if masked.history.is_none() {
        // Nothing to mask: nothing the model reads is a placeholder.
        core.clean.record(history.lineage(), history.len());
        masked.restore = None;
    }
    ctx.with_state(|state| {
        if let Some(run) = state.get_mut::<RunPii>() {
            run.last = Some(Sent {
                len: history.len(),
                lineage: history.lineage(),
                masked: masked.history.clone(),
                restore: masked.restore.clone(),
            });
        }
    });
    Ok(masked)
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
            let texts = text_parts(parts);
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

/// The masked history for this call: the run's masked history, extended by
/// the messages added since the last call. After an edit (or a copy) of the
/// history, the messages before the first one that differs from what was
/// masked last keep their masked form (comparing is far cheaper than
/// scanning), and the rest is masked again. A message masking leaves
/// unchanged is not copied; while none changed, no history is built at all.
///
/// `known_clean` leading messages are known to hold nothing to mask, and
/// so is a message `texts` saw clean.
fn masked_history(
    state: &mut RunPiiState,
    texts: &CleanTexts,
    history: &History,
    known_clean: usize,
) -> Result<Masked, PiiBlocked> {
    let len = history.len();
    let mut kept = match (state.source, &state.masked) {
        (Some((lineage, was)), _) if lineage == history.lineage() && was <= len => was,
        // An edit: the masked history holds the messages masking left
        // alone as they were, `originals` the others.
        (Some(_), Some(masked)) => {
            let mut originals = state.originals.iter().peekable();
            (0..)
                .zip(masked.iter().zip(history.iter()))
                .take_while(|(i, (masked, is))| {
                    let was = originals
                        .next_if(|(j, _)| j == i)
                        .map_or(*masked, |(_, m)| m);
                    was == *is
                })
                .count()
        }
        // Nothing was masked: there is no masked form to keep (and the
        // messages seen clean are not scanned again).
        (Some(_), None) | (None, _) => 0,
    };
    if state.source.is_some_and(|(_, was)| was != kept) {
        // Keep the masked form of the first `kept` messages only.
        if kept <= state.clean {
            state.masked = None;
            state.originals.clear();
            state.clean = kept;
        } else if let Some(masked) = &mut state.masked {
            masked.truncate(kept);
            state.originals.retain(|(i, _)| *i < kept);
        }
    }
    if known_clean > kept {
        // Masking leaves those messages as they are.
        state.masked = None;
        state.originals.clear();
        state.clean = known_clean;
        kept = known_clean;
    }
    let mut count = 0;
    if kept < len {
        let mut changed: Vec<(usize, Message)> = Vec::new();
        // Kept once every message is masked (a blocked one changes nothing).
        let mut originals = Vec::new();
        for (i, message) in history.iter().enumerate().skip(kept) {
            // A message seen clean before is not scanned again.
            let Err(unseen) = texts.seen(message) else {
                continue;
            };
            match mask_message(&state.session, message, &mut count)? {
                Some(masked) => {
                    changed.push((i, masked));
                    originals.push((i, message.clone()));
                }
                None => unseen.clean(),
            }
        }
        state.originals.append(&mut originals);
        match changed.first() {
            None if state.masked.is_none() => state.clean = len,
            first => {
                if state.masked.is_none() {
                    state.clean = first.map_or(len, |(i, _)| *i);
                }
                let masked = state.masked.get_or_insert_with(|| {
                    let mut prefix = history.clone();
                    prefix.truncate(kept);
                    prefix
                });
                let mut changed = changed.into_iter().peekable();
                masked.extend(history.iter().enumerate().skip(kept).map(|(i, m)| {
                    match changed.next_if(|(j, _)| *j == i) {
                        Some((_, masked)) => masked,
                        None => m.clone(),
                    }
                }));
            }
        }
    }
    state.source = Some((history.lineage(), len));
    Ok(Masked {
        history: state.masked.clone(),
        count,
        restore: (!state.session.is_empty()).then(|| state.session.clone()),
    })
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
        let core = &*self.core;
        let history = &call.request.messages;
        // A history this engine found clean: sent as it is, nothing to
        // restore, the run's state not even looked at.
        let prepared = match (&core.engine, core.clean.known(history.lineage())) {
            (Ok(_), Known::Clean(n) | Known::Dirty(n)) if n >= history.len() => {
                Ok(Prepared::default())
            }
            (Ok(_), Known::Dirty(n)) => prepare(core, &mut call, n),
            // A history new to the memo, in a run that masked something:
            // what it masked is known to the run's state.
            (Ok(_), Known::Unknown) if masks(&call.context) => prepare(core, &mut call, 0),
            (Ok(engine), known) => check(core, engine, &mut call, known.clean_len()),
            (Err(_), _) => prepare(core, &mut call, 0),
        };
        match prepared {
            Ok(Prepared { restore, stream }) => {
                future::ResponseFuture::new(self.inner.call(call), restore, stream)
            }
            Err(err) => future::ResponseFuture::blocked(err),
        }
    }
}

/// Whether the run of `ctx` has a masking state.
#[inline]
fn masks(ctx: &RunContext) -> bool {
    ctx.with_state(|state| state.get::<RunPii>().is_some())
}

/// A history the memo knows clean up to `clean` messages: the messages
/// after those are checked (each one seen clean before costs a hash, the
/// others a scan). All clean: sent as it is, nothing to restore, the run's
/// state not looked at. Else masked with the run's state from the first
/// message that holds something.
#[inline(never)]
fn check(
    core: &Core,
    engine: &PiiEngine,
    call: &mut ModelCall,
    clean: usize,
) -> Result<Prepared, BoxError> {
    let history = &call.request.messages;
    match core.texts.first_dirty(engine, history, clean) {
        None => {
            core.clean.record(history.lineage(), history.len());
            Ok(Prepared::default())
        }
        Some(dirty) => {
            core.clean.record_dirty(history.lineage(), dirty);
            prepare(core, call, dirty)
        }
    }
}

/// What a call's answer needs: the session to restore from (`None`: the
/// request held no placeholder), and a streamed call's restoring.
#[derive(Default)]
struct Prepared {
    restore: Option<Arc<PiiSession>>,
    stream: Option<Arc<Streamed>>,
}

/// Masks `call`'s history (what the run's last call did not cover; the
/// first `known_clean` messages hold nothing to mask) and wraps its stream
/// when there is something to restore. Kept out of [`MaskPii::call`], so
/// that stays small enough to inline.
#[inline(never)]
fn prepare(core: &Core, call: &mut ModelCall, known_clean: usize) -> Result<Prepared, BoxError> {
    let engine = match &core.engine {
        Ok(engine) => engine,
        Err(message) => return Err(Box::new(AgentError::Config(message.to_string()))),
    };
    let masked = match unchanged(&call.context, &call.request.messages) {
        Some(masked) => masked,
        None => mask_run(
            &call.context,
            core,
            engine,
            &call.request.messages,
            known_clean,
        )
        .map_err(blocked_error)?,
    };
    let Masked {
        history,
        count,
        restore,
    } = masked;
    if count > 0 {
        let ctx = &call.context;
        ctx.emit(|| AgentEvent::PiiMasked {
            run_id: ctx.run_id().clone(),
            count,
        });
    }
    // Changing the call copies its parts when they are shared: only what
    // changes is touched.
    if let Some(history) = history {
        call.request.messages = history;
    }
    // No placeholder handed out: the answer holds nothing to restore,
    // streamed or not.
    let stream = match &restore {
        Some(session) if call.stream.is_some() => {
            let call = &mut **call;
            call.stream.take().map(|sink| {
                let (restoring, streamed) = Streamed::wrap(sink, session.clone());
                call.stream = Some(restoring);
                streamed
            })
        }
        _ => None,
    };
    Ok(Prepared { restore, stream })
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

#[path = "service_future.rs"]
pub mod future;

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
