use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower::Service;

use crate::error::{BoxError, ErrorKind, ProviderError};
use crate::request::ModelCall;
use crate::types::{
    FinishReason, Message, ModelDelta, ModelName, ModelRequest, ModelResponse, ToolCall, Usage,
};

/// One answer of a [`ScriptedModel`]: a message (text, tool calls or both),
/// or an error, with usage and streaming options.
#[derive(Debug, Clone)]
pub struct ScriptedTurn {
    answer: Result<Message, (ErrorKind, String, Option<Duration>)>,
    usage: Option<Usage>,
    chunk_chars: usize,
    delay: Option<Duration>,
}

impl ScriptedTurn {
    fn new(message: Message) -> Self {
        Self {
            answer: Ok(message),
            usage: None,
            chunk_chars: 8,
            delay: None,
        }
    }

    /// A final answer with `text`.
    pub fn text(text: impl Into<String>) -> Self {
        Self::new(Message::assistant(text))
    }

    /// A turn that calls one tool with `arguments` (JSON text). The call id is
    /// `call_<n>`: the model numbers every tool call it makes, from 1.
    pub fn tool_call(name: impl Into<String>, arguments: impl Into<String>) -> Self {
        Self::tool_calls([ToolCall::new("", name, arguments)])
    }

    /// A turn that calls several tools; empty ids are numbered as in
    /// [`tool_call`](Self::tool_call).
    pub fn tool_calls(calls: impl IntoIterator<Item = ToolCall>) -> Self {
        Self::new(Message::assistant_tool_calls(calls.into_iter().collect()))
    }

    /// A turn answering `message` as it is.
    pub fn message(message: Message) -> Self {
        Self::new(message)
    }

    /// A turn that fails with a [`ProviderError`] of `kind`.
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            answer: Err((kind, message.into(), None)),
            ..Self::text("")
        }
    }

    /// A turn that fails as rate-limited, asking to retry after `after`.
    pub fn rate_limited(after: Duration) -> Self {
        Self {
            answer: Err((ErrorKind::RateLimited, "rate limited".into(), Some(after))),
            ..Self::text("")
        }
    }

    /// The usage to report. Without it, the model reports a deterministic
    /// estimate: a token per 4 bytes of input and of output, rounded up.
    pub fn usage(mut self, usage: Usage) -> Self {
        self.usage = Some(usage);
        self
    }

    /// Streams the text in pieces of at most `chars` characters (default 8).
    pub fn chunk_chars(mut self, chars: usize) -> Self {
        self.chunk_chars = chars.max(1);
        self
    }

    /// Waits `delay` before answering (on tokio's clock); zero waits not at
    /// all.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }
}

type Responder = dyn Fn(&ModelRequest) -> ScriptedTurn + Send + Sync;

enum Script {
    Turns(Mutex<VecDeque<ScriptedTurn>>),
    Function(Box<Responder>),
}

struct Inner {
    name: ModelName,
    script: Script,
    latency: Option<Duration>,
    record: bool,
    seen: Mutex<Vec<ModelRequest>>,
    next_call_id: std::sync::atomic::AtomicU64,
}

/// The embedded, deterministic model: for the quickstart, tests and benches.
///
/// It answers from a script of [`ScriptedTurn`]s, in order, or from a function
/// of the request. It streams text and tool-call deltas when the call has a
/// sink, reports usage (and records it into the run's ledger, as a provider
/// does), and keeps the requests it saw.
///
/// ```
/// use tower::ServiceExt;
/// use tower_agent::{ModelCall, RunContext, ScriptedModel, ScriptedTurn};
/// use tower_agent::types::{Message, ModelRequest};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let model = ScriptedModel::new([ScriptedTurn::text("hello")]);
/// let call = ModelCall::new(ModelRequest::new("scripted", vec![Message::user("hi")]), RunContext::new());
/// let response = model.clone().oneshot(call).await.unwrap();
/// assert_eq!(response.message.text(), "hello");
/// assert_eq!(model.requests().len(), 1);
/// # }
/// ```
///
/// # Clone
///
/// Clones share the script and the record of requests.
#[derive(Clone)]
pub struct ScriptedModel {
    inner: Arc<Inner>,
}

impl ScriptedModel {
    /// A model answering `turns` in order; past the last, calls fail with
    /// `INVALID_REQUEST`.
    pub fn new(turns: impl IntoIterator<Item = ScriptedTurn>) -> Self {
        Self::with_script(Script::Turns(Mutex::new(turns.into_iter().collect())))
    }

    /// A model answering with `f(request)`.
    pub fn from_fn(f: impl Fn(&ModelRequest) -> ScriptedTurn + Send + Sync + 'static) -> Self {
        Self::with_script(Script::Function(Box::new(f)))
    }

    fn with_script(script: Script) -> Self {
        Self {
            inner: Arc::new(Inner {
                name: ModelName::from("scripted"),
                script,
                latency: None,
                record: true,
                seen: Mutex::default(),
                next_call_id: Default::default(),
            }),
        }
    }

    fn inner_mut(&mut self) -> &mut Inner {
        Arc::get_mut(&mut self.inner).expect("configure a ScriptedModel before cloning it")
    }

    /// The model name it reports when the request names none.
    ///
    /// # Panics
    ///
    /// If called after the model was cloned.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.inner_mut().name = ModelName::from(name.into());
        self
    }

    /// Waits `latency` before every answer (on tokio's clock);
    /// `Duration::ZERO` waits not at all, with no timer.
    ///
    /// # Panics
    ///
    /// If called after the model was cloned.
    pub fn latency(mut self, latency: Duration) -> Self {
        self.inner_mut().latency = Some(latency);
        self
    }

    /// Whether to keep the requests it sees (default `true`). Keeping them
    /// holds each turn's history alive, so turn it off for benchmarks.
    ///
    /// # Panics
    ///
    /// If called after the model was cloned.
    pub fn record(mut self, record: bool) -> Self {
        self.inner_mut().record = record;
        self
    }

    /// The requests it saw, in order.
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.inner
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many turns of the script are left.
    pub fn remaining(&self) -> usize {
        match &self.inner.script {
            Script::Turns(turns) => turns.lock().unwrap_or_else(PoisonError::into_inner).len(),
            Script::Function(_) => usize::MAX,
        }
    }

    fn next_turn(&self, request: &ModelRequest) -> Option<ScriptedTurn> {
        match &self.inner.script {
            Script::Turns(turns) => turns
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop_front(),
            Script::Function(f) => Some(f(request)),
        }
    }
}

impl fmt::Debug for ScriptedModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedModel")
            .field("name", &self.inner.name)
            .field("remaining", &self.remaining())
            .finish_non_exhaustive()
    }
}

/// `call_<n>`, written without the formatting machinery.
fn call_id(n: u64) -> String {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let digits = &digits[at..];
    let mut id = String::with_capacity(5 + digits.len());
    id.push_str("call_");
    id.extend(digits.iter().map(|&d| char::from(d)));
    id
}

fn estimate(bytes: u64) -> u64 {
    bytes.div_ceil(4)
}

fn no_more_turns() -> BoxError {
    ProviderError::new(ErrorKind::InvalidRequest, "the script has no more turns").into()
}

impl ScriptedModel {
    /// The wait before every answer; zero for none.
    fn wait(&self) -> Duration {
        self.inner.latency.unwrap_or_default()
    }

    fn note(&self, call: &ModelCall) {
        if self.inner.record {
            self.inner
                .seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(call.request.clone());
        }
    }

    /// Answers `call` with `turn`, or with the script's next turn: now, or
    /// after the turn's own delay. An answer now is returned as it is made,
    /// never held across an `.await` nor moved through a wrapper: it is the
    /// size of a whole response.
    fn reply(
        &self,
        call: ModelCall,
        turn: Option<ScriptedTurn>,
    ) -> Result<Result<ModelResponse, BoxError>, BoxFuture<'static, Result<ModelResponse, BoxError>>>
    {
        let Some(turn) = turn.or_else(|| self.next_turn(&call.request)) else {
            return Ok(Err(no_more_turns()));
        };
        match turn.delay.filter(|d| !d.is_zero()) {
            // Rare: the wait and what it keeps get a future of their own.
            Some(delay) => {
                let this = self.clone();
                Err(Box::pin(async move {
                    tokio::time::sleep(delay).await;
                    this.answer(&call, turn)
                }))
            }
            None => Ok(self.answer(&call, turn)),
        }
    }

    /// The response to `call`: built only now, once every wait is over.
    fn answer(&self, call: &ModelCall, turn: ScriptedTurn) -> Result<ModelResponse, BoxError> {
        let mut message = match turn.answer {
            Ok(message) => message,
            Err((kind, text, retry_after)) => {
                let mut err = ProviderError::new(kind, text);
                if let Some(after) = retry_after {
                    err = err.retry_after(after);
                }
                return Err(err.into());
            }
        };
        for tool_call in &mut message.tool_calls {
            // Every call counts, so numbered ids never repeat given ones.
            let n = self
                .inner
                .next_call_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if tool_call.id.is_empty() {
                tool_call.id = call_id(n + 1);
            }
        }
        if let Some(sink) = &call.stream {
            let text = message.text();
            let mut rest: &str = &text;
            while !rest.is_empty() {
                let end = rest
                    .char_indices()
                    .nth(turn.chunk_chars)
                    .map_or(rest.len(), |(i, _)| i);
                sink.send(&ModelDelta::text(&rest[..end]));
                rest = &rest[end..];
            }
            for (index, tool_call) in message.tool_calls.iter().enumerate() {
                sink.send(&ModelDelta::ToolCall {
                    index,
                    id: Some(tool_call.id.clone()),
                    name: Some(tool_call.name.clone()),
                    arguments: tool_call.arguments.clone(),
                });
            }
        }
        let request = &call.request;
        let usage = turn.usage.unwrap_or_else(|| {
            Usage::new(
                estimate(request.messages.text_len()),
                estimate(message.text_len() as u64),
            )
        });
        // Shared names: no copy of the text.
        let model = if request.model.is_empty() {
            self.inner.name.clone()
        } else {
            request.model.clone()
        };
        call.context.record_usage_of(&model, usage);
        // Built in place: a response is moved as a whole at every step.
        Ok(ModelResponse {
            finish_reason: if message.tool_calls.is_empty() {
                FinishReason::Stop
            } else {
                FinishReason::ToolCalls
            },
            message,
            usage,
            model,
            usage_recorded: true,
        })
    }
}

impl Service<ModelCall> for ScriptedModel {
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = ScriptedFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    /// The call begins at the first poll. A call waiting on the model's
    /// latency holds the model, the call and the timer, nothing else: a
    /// function script answers once the wait is over, and the response is
    /// built then. A list of turns gives each call its turn when the call
    /// begins, in call order.
    fn call(&mut self, call: ModelCall) -> ScriptedFuture {
        ScriptedFuture {
            state: State::Call {
                model: self.clone(),
                call: Some(call),
                turn: None,
                wait: None,
            },
        }
    }
}

pin_project! {
    /// The future of a [`ScriptedModel`] call: the call, then the model's
    /// latency (on tokio's clock), then the answer. Unboxed, so a model
    /// stack that boxes its futures boxes this one once.
    pub struct ScriptedFuture {
        #[pin]
        state: State,
    }
}

pin_project! {
    #[project = StateProj]
    enum State {
        /// The call, and once it began, the wait for the model's latency.
        Call {
            model: ScriptedModel,
            // Taken when the call is answered.
            call: Option<ModelCall>,
            // A list's turn, taken when the call began (boxed: a function
            // script's call holds no room for it).
            turn: Option<Box<ScriptedTurn>>,
            // `None` until the call began, and for a model without latency,
            // which answers at once, with no timer (tokio's would still
            // round a zero sleep up to its next millisecond tick).
            #[pin]
            wait: Option<Sleep>,
        },
        /// A turn's own delay, after the model's: rare, so on the heap.
        Later {
            fut: BoxFuture<'static, Result<ModelResponse, BoxError>>,
        },
    }
}

impl fmt::Debug for ScriptedFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScriptedFuture")
    }
}

impl Future for ScriptedFuture {
    type Output = Result<ModelResponse, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        let reply = match state.as_mut().project() {
            StateProj::Later { fut } => return fut.as_mut().poll(cx),
            StateProj::Call {
                model,
                call,
                turn,
                mut wait,
            } => {
                if let Some(sleep) = wait.as_mut().as_pin_mut() {
                    ready!(sleep.poll(cx));
                } else {
                    let pending = call
                        .as_ref()
                        .expect("ScriptedFuture polled after it completed");
                    model.note(pending);
                    if let Script::Turns(_) = &model.inner.script {
                        match model.next_turn(&pending.request) {
                            Some(next) => *turn = Some(Box::new(next)),
                            None => {
                                *call = None;
                                return Poll::Ready(Err(no_more_turns()));
                            }
                        }
                    }
                    let latency = model.wait();
                    if !latency.is_zero() {
                        // The latency is read again where the wait begins,
                        // not kept beside the timer.
                        wait.set(Some(tokio::time::sleep(latency)));
                        let sleep = wait.as_pin_mut().expect("set just above");
                        ready!(sleep.poll(cx));
                    }
                }
                let call = call
                    .take()
                    .expect("ScriptedFuture polled after it completed");
                model.reply(call, turn.take().map(|turn| *turn))
            }
        };
        match reply {
            Ok(result) => Poll::Ready(result),
            Err(mut fut) => {
                let polled = fut.as_mut().poll(cx);
                if polled.is_pending() {
                    state.set(State::Later { fut });
                }
                polled
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::call_id;

    #[test]
    fn call_ids_are_numbered_in_decimal() {
        assert_eq!(call_id(1), "call_1");
        assert_eq!(call_id(10), "call_10");
        assert_eq!(call_id(u64::MAX), format!("call_{}", u64::MAX));
    }
}
