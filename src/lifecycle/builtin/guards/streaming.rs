//! [`StreamingOutputGuard`]: the output guard that does not hold the whole
//! turn. It releases each checked segment of the streamed text as it goes
//! (see [`StreamGuard`]) and ends the run with a tripwire when a segment
//! is blocked, with nothing past the last released point sent.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use serde_json::json;
use tokio::sync::Notify;

use super::stream::{Blocked, GuardVerdict, StreamGuard, DEFAULT_MAX_HOLD};
use crate::error::{tripwire_with, BoxError};
use crate::lifecycle::{ModelMiddleware, ModelNext};
use crate::request::ModelCall;
use crate::types::{ModelDelta, ModelResponse};

type Check = Arc<dyn Fn(&str) -> GuardVerdict + Send + Sync>;
type Window = StreamGuard<Box<dyn FnMut(&str) -> GuardVerdict + Send>>;

/// Checks each model call's text segment by segment with a synchronous
/// check, releasing what passed (or its rewrite) to the run's stream as it
/// arrives; the answer the run keeps is the same guarded text. A blocked
/// segment cancels the call and fails the run with a tripwire naming the
/// guard. Fails closed: it has no other failure mode.
///
/// It is wrap middleware: push it with
/// [`MiddlewareStack::push_model`](crate::lifecycle::MiddlewareStack::push_model).
///
/// ```
/// use tower::{Layer, ServiceExt};
/// use tower_agent::lifecycle::builtin::guards::{GuardVerdict, StreamingOutputGuard};
/// use tower_agent::lifecycle::{LifecycleLayer, MiddlewareStack};
/// use tower_agent::types::ModelDelta;
/// use tower_agent::{Agent, DeltaSink, RunRequest, ScriptedModel, ScriptedTurn};
/// use std::sync::{Arc, Mutex};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::AgentError> {
/// let guard = StreamingOutputGuard::new("no-codes", |segment: &str| {
///     GuardVerdict::Rewrite(segment.replace("4711", "[code]"))
/// });
/// let model = ScriptedModel::new([ScriptedTurn::text("Your code is 4711. Keep it safe.").chunk_chars(3)]);
/// let agent = Agent::builder("a").model(model).build()?;
/// let seen = Arc::new(Mutex::new(String::new()));
/// let sink_seen = seen.clone();
/// let sink = DeltaSink::new(move |d| if let ModelDelta::Text { text } = d { sink_seen.lock().unwrap().push_str(text) });
/// let run = LifecycleLayer::new(MiddlewareStack::new().push_model(guard))
///     .layer(agent)
///     .oneshot(RunRequest::new("code?").stream(sink))
///     .await?;
/// assert_eq!(run.output, "Your code is [code]. Keep it safe.");
/// assert_eq!(*seen.lock().unwrap(), run.output);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct StreamingOutputGuard {
    name: Arc<str>,
    check: Check,
    max_hold: usize,
}

impl fmt::Debug for StreamingOutputGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamingOutputGuard")
            .field("name", &self.name)
            .field("max_hold", &self.max_hold)
            .finish()
    }
}

impl StreamingOutputGuard {
    /// A guard named `name` checking each segment with `check`.
    pub fn new(
        name: impl Into<Arc<str>>,
        check: impl Fn(&str) -> GuardVerdict + Send + Sync + 'static,
    ) -> Self {
        Self {
            name: name.into(),
            check: Arc::new(check),
            max_hold: DEFAULT_MAX_HOLD,
        }
    }

    /// The longest segment held back, in bytes (default 1 KiB).
    pub fn max_hold(mut self, bytes: usize) -> Self {
        self.max_hold = bytes.max(1);
        self
    }

    fn window(&self) -> Window {
        let check = self.check.clone();
        StreamGuard::new(
            Box::new(move |s: &str| check(s)) as Box<dyn FnMut(&str) -> GuardVerdict + Send>
        )
        .max_hold(self.max_hold)
    }
}

fn trip(b: Blocked) -> BoxError {
    let mut info = b.info.unwrap_or_else(|| json!({}));
    if let Some(map) = info.as_object_mut() {
        map.insert("released_bytes".into(), json!(b.at));
    }
    tripwire_with(b.reason, info).into()
}

impl ModelMiddleware for StreamingOutputGuard {
    fn name(&self) -> &str {
        &self.name
    }

    fn wrap_model<'a>(
        &'a self,
        mut call: ModelCall,
        next: ModelNext,
    ) -> BoxFuture<'a, Result<ModelResponse, BoxError>> {
        let window = Arc::new(Mutex::new(self.window()));
        let blocked = Arc::new(Notify::new());
        let outer = call.stream.take();
        if let Some(sink) = &outer {
            let (window, blocked) = (window.clone(), blocked.clone());
            call.stream = Some(sink.wrap(move |inner, delta| match delta {
                ModelDelta::Text { text } => {
                    let step = window
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(text);
                    if !step.text.is_empty() {
                        inner.send(&ModelDelta::text(step.text));
                    }
                    if step.blocked.is_some() {
                        blocked.notify_one();
                    }
                }
                other => inner.send(other),
            }));
        }
        Box::pin(async move {
            let result = tokio::select! {
                biased;
                () = blocked.notified() => None,
                result = next.run(call) => Some(result),
            };
            let mut window = window.lock().unwrap_or_else(PoisonError::into_inner);
            let mut response = match result {
                None => {
                    let b = window.finish().blocked.expect("notified after a block");
                    return Err(trip(b));
                }
                Some(result) => result?,
            };
            let full = response.message.text().into_owned();
            let seen = window.released_text().len() + window.held().len();
            if seen == 0 && !full.is_empty() {
                // Not streamed (or the backend sent no text deltas).
                let step = window.push(&full);
                if let (Some(sink), false) = (&outer, step.text.is_empty()) {
                    sink.send(&ModelDelta::text(step.text));
                }
                if let Some(b) = step.blocked {
                    return Err(trip(b));
                }
            }
            let step = window.finish();
            if let (Some(sink), false) = (&outer, step.text.is_empty()) {
                sink.send(&ModelDelta::text(step.text));
            }
            if let Some(b) = step.blocked {
                return Err(trip(b));
            }
            if !full.is_empty() {
                response.message.set_text(window.released_text().to_owned());
            }
            Ok(response)
        })
    }
}
