//! Replay safety: when a request may be sent again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::request::{DeltaSink, HasContext, ModelCall, ToolInvocation};

/// A request that a retry or a fallback may send more than once.
///
/// Implemented for [`ModelCall`] (safe to send again until a streamed delta
/// reached the run's sink) and [`ToolInvocation`] (safe only for a tool
/// marked idempotent, and until its streamed progress reached a sink).
/// Implement it for a request type of your own to retry it.
pub trait RetryRequest: HasContext + Clone {
    /// Readies the request to be sent more than once: a layer calls it before
    /// the first send. Wrap any stream sink with [`StreamGuard::install`].
    fn guard(&mut self);

    /// Whether sending the request again cannot repeat an effect: nothing
    /// reached a stream sink, and the target may be called twice.
    fn replay_safe(&self) -> bool;

    /// The request's extensions, where layers keep per-request marks.
    fn extensions_mut(&mut self) -> &mut http::Extensions;
}

impl RetryRequest for ModelCall {
    #[inline]
    fn guard(&mut self) {
        // Read first: a call with nothing to guard is not written to (a
        // write copies parts a clone shares).
        if self.stream.is_none() || self.extensions.get::<StreamGuard>().is_some() {
            return;
        }
        let parts = &mut **self;
        StreamGuard::install(&mut parts.stream, &mut parts.extensions);
    }

    fn replay_safe(&self) -> bool {
        StreamGuard::untouched(self.stream.as_ref(), &self.extensions)
    }

    fn extensions_mut(&mut self) -> &mut http::Extensions {
        &mut self.extensions
    }
}

impl RetryRequest for ToolInvocation {
    fn guard(&mut self) {
        StreamGuard::install(&mut self.stream, &mut self.extensions);
    }

    fn replay_safe(&self) -> bool {
        self.idempotent && StreamGuard::untouched(self.stream.as_ref(), &self.extensions)
    }

    fn extensions_mut(&mut self) -> &mut http::Extensions {
        &mut self.extensions
    }
}

/// Records whether anything reached a request's stream sink, so a layer can
/// tell whether sending the request again would repeat text the user saw.
///
/// Kept in the request's extensions; clones of the request share it.
#[derive(Debug, Clone)]
pub struct StreamGuard {
    emitted: Arc<AtomicBool>,
}

impl StreamGuard {
    /// Wraps `stream` (if any) with a sink that records emission, once per
    /// request: a request guarded by an outer layer keeps its guard.
    pub fn install(stream: &mut Option<DeltaSink>, extensions: &mut http::Extensions) {
        let Some(sink) = stream.as_ref() else {
            return;
        };
        if extensions.get::<StreamGuard>().is_some() {
            return;
        }
        let emitted = Arc::new(AtomicBool::new(false));
        let flag = emitted.clone();
        *stream = Some(sink.wrap(move |inner, delta| {
            flag.store(true, Ordering::Release);
            inner.send(delta);
        }));
        extensions.insert(StreamGuard { emitted });
    }

    /// Whether nothing reached `stream`: true without a stream or with a
    /// [provisional](DeltaSink::is_provisional) one (the run holds its text),
    /// false for a stream that was never guarded (nobody can tell).
    pub fn untouched(stream: Option<&DeltaSink>, extensions: &http::Extensions) -> bool {
        match (stream, extensions.get::<StreamGuard>()) {
            (None, _) => true,
            (Some(sink), _) if sink.is_provisional() => true,
            (Some(_), Some(guard)) => !guard.emitted.load(Ordering::Acquire),
            (Some(_), None) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ModelDelta, ModelRequest, ToolCall};
    use crate::RunContext;

    #[test]
    fn a_streamed_call_is_safe_until_a_delta_goes_out() {
        let (sink, mut rx) = DeltaSink::channel();
        let mut call = ModelCall::new(ModelRequest::default(), RunContext::new());
        call.stream = Some(sink);
        assert!(!call.replay_safe(), "an unguarded stream cannot be judged");
        call.guard();
        call.guard(); // idempotent: one wrapper
        let copy = call.clone();
        assert!(copy.replay_safe());
        call.stream.as_ref().unwrap().send(&ModelDelta::text("hi"));
        assert!(!copy.replay_safe());
        assert_eq!(rx.try_recv().unwrap(), ModelDelta::text("hi"));
        assert!(rx.try_recv().is_err(), "the delta went out once");
    }

    #[test]
    fn a_provisional_stream_stays_replay_safe() {
        let mut call = ModelCall::new(ModelRequest::default(), RunContext::new());
        call.stream = Some(DeltaSink::provisional(|_| {}));
        call.guard();
        call.stream
            .as_ref()
            .unwrap()
            .send(&ModelDelta::text("held"));
        assert!(call.replay_safe(), "held text reached nobody");
    }

    #[test]
    fn a_tool_call_is_safe_only_when_idempotent() {
        let mut inv = ToolInvocation::new(ToolCall::new("c", "t", "{}"), RunContext::new());
        inv.guard();
        assert!(!inv.replay_safe());
        inv.idempotent = true;
        assert!(inv.replay_safe());
    }
}
