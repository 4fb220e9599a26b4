//! The guardrails' streaming output path: the model's text is cut into the
//! [`Segmenter`]'s segments as it streams, each is checked by the (async)
//! output guards while the model goes on streaming, and released to the
//! sink once it passed (or as its rewrite). A block cancels the call.

use std::pin::pin;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use super::checks::Config;
use super::guard::GuardTarget;
use super::stream::Segmenter;
use crate::error::BoxError;
use crate::lifecycle::ModelNext;
use crate::request::{DeltaSink, ModelCall};
use crate::types::{ModelDelta, ModelResponse};

/// What the sink hands the checking loop.
struct Incoming {
    segments: Segmenter,
    /// Bytes of text that arrived as deltas.
    streamed: usize,
}

fn lock(m: &Mutex<Incoming>) -> std::sync::MutexGuard<'_, Incoming> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `call` through `next`, checking its text segment by segment with
/// the output guards of `config` and releasing what passed to the call's
/// sink. The answer carries the guarded text.
pub(crate) async fn stream_output(
    config: &Config,
    mut call: ModelCall,
    next: ModelNext,
    max_hold: usize,
) -> Result<ModelResponse, BoxError> {
    let ctx = call.context.clone();
    let incoming = Arc::new(Mutex::new(Incoming {
        segments: Segmenter::new(max_hold),
        streamed: 0,
    }));
    let arrived = Arc::new(Notify::new());
    let outer: Option<DeltaSink> = call.stream.take();
    if let Some(sink) = &outer {
        let (incoming, arrived) = (incoming.clone(), arrived.clone());
        call.stream = Some(sink.wrap(move |inner, delta| match delta {
            ModelDelta::Text { text } => {
                let mut state = lock(&incoming);
                state.segments.push(text);
                state.streamed += text.len();
                drop(state);
                arrived.notify_one();
            }
            other => inner.send(other),
        }));
    }
    let mut model = pin!(next.run(call));
    let mut answer: Option<ModelResponse> = None;
    let mut released = String::new();
    let mut consumed = 0usize;
    loop {
        let complete = answer.is_some();
        let segment = lock(&incoming).segments.next_segment(complete);
        let Some(segment) = segment else {
            if complete {
                break;
            }
            tokio::select! {
                () = arrived.notified() => continue,
                result = &mut model => {
                    let response = result?;
                    let mut state = lock(&incoming);
                    if state.streamed == 0 {
                        // Not streamed (or no text deltas): check the answer.
                        state.segments.push(&response.message.text());
                    }
                    drop(state);
                    answer = Some(response);
                    continue;
                }
            }
        };
        let verdict = {
            let mut check = pin!(config.check(&ctx, &config.output, GuardTarget::Output, &segment));
            if answer.is_some() {
                check.await
            } else {
                // The model streams on while the segment is checked.
                tokio::select! {
                    verdict = &mut check => verdict,
                    result = &mut model => {
                        // Text arrived as deltas, so the segments hold it.
                        answer = Some(result?);
                        check.await
                    }
                }
            }
        };
        match verdict {
            Ok(rewritten) => {
                consumed += segment.len();
                let text = rewritten.unwrap_or(segment);
                if let (Some(sink), false) = (&outer, text.is_empty()) {
                    sink.send(&ModelDelta::text(&text));
                }
                released.push_str(&text);
            }
            Err(stop) => {
                lock(&incoming).segments.clear();
                return Err(stop.into_error(GuardTarget::Output, Some(consumed)));
            }
        }
    }
    let mut response = answer.expect("the loop ends once the model answered");
    if consumed > 0 {
        response.message.set_text(released);
    }
    Ok(response)
}
