//! The restoring of a streamed call: deltas pass through hold-back buffers
//! on their way to the caller's sink.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::pii::{PiiSession, StreamRestorer};
use crate::request::DeltaSink;
use crate::types::ModelDelta;

/// A streamed call's restoring: the caller's sink, and the hold-back
/// buffers feeding it (one for the text, one per tool call's arguments).
pub(super) struct Streamed {
    sink: DeltaSink,
    session: Arc<PiiSession>,
    state: Mutex<StreamState>,
}

struct StreamState {
    text: StreamRestorer,
    calls: HashMap<usize, StreamRestorer>,
}

impl Streamed {
    /// The sink to hand the inner service, restoring into `sink`.
    pub(super) fn wrap(sink: DeltaSink, session: Arc<PiiSession>) -> (DeltaSink, Arc<Streamed>) {
        let streamed = Arc::new(Streamed {
            state: Mutex::new(StreamState {
                text: session.stream_restorer(),
                calls: HashMap::new(),
            }),
            sink: sink.clone(),
            session,
        });
        let shared = streamed.clone();
        let restoring = sink.wrap(move |sink, delta| shared.deliver(sink, delta));
        (restoring, streamed)
    }

    fn lock(&self) -> MutexGuard<'_, StreamState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn deliver(&self, sink: &DeltaSink, delta: &ModelDelta) {
        let mut state = self.lock();
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
                    .or_insert_with(|| self.session.json_stream_restorer());
                sink.send(&ModelDelta::ToolCall {
                    index: *index,
                    id: id.clone(),
                    name: name.clone(),
                    arguments: restorer.push(arguments),
                });
            }
            other => sink.send(other),
        }
    }

    /// Sends what the restorers still hold.
    pub(super) fn flush(&self) {
        let mut state = self.lock();
        let text = std::mem::replace(&mut state.text, self.session.stream_restorer()).finish();
        if !text.is_empty() {
            self.sink.send(&ModelDelta::Text { text });
        }
        let mut calls: Vec<_> = state.calls.drain().collect();
        calls.sort_by_key(|(index, _)| *index);
        for (index, restorer) in calls {
            let arguments = restorer.finish();
            if !arguments.is_empty() {
                self.sink.send(&ModelDelta::ToolCall {
                    index,
                    id: None,
                    name: None,
                    arguments,
                });
            }
        }
    }
}
