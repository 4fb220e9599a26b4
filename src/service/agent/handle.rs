//! Messages queued into a running run: [`AgentExt::start`](super::AgentExt::start)
//! returns a [`RunHandle`] that takes user messages while the run goes on.
//!
//! A queued message joins the conversation before the run's next model
//! call, never between a tool call and its result: while the model's tool
//! calls run, it waits, and goes in once every call of the turn has its
//! result. Each one is first seen by `before_run`, the input guard, as the
//! run's input was (so a [`tripwire`](crate::tripwire) there ends the run),
//! then reported by an [`AgentEvent::QueuedMessage`](crate::event::AgentEvent::QueuedMessage)
//! event and, in a streamed run, a [`ModelDelta::UserMessage`]. Messages go
//! in in the order they were sent.
//!
//! A message that arrives once the run decided to finish (the model gave its
//! final answer) starts a continuation by default: the run takes it in and
//! asks the model again. With [`LateMessages::Return`] the run finishes and
//! the message comes back unread in [`Finished::unread`]. No message is
//! lost: it is taken in, returned unread with the result (also when the run
//! paused, stopped or failed), or, sent after the run ended, handed back by
//! [`RunHandle::send`] as [`Unsent`].
//!
//! ```
//! use tower_agent::{Agent, RunRequest, ScriptedModel, ScriptedTurn};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::AgentError> {
//! let model = ScriptedModel::new([ScriptedTurn::text("Booked for Tuesday.")]);
//! let agent = Agent::builder("booking").model(model).build()?;
//!
//! let handle = agent.start(RunRequest::new("Book me a table for Monday."));
//! // From another task, use `handle.sender()`.
//! handle.send("Make that Tuesday.").expect("the run is still going");
//! let finished = handle.await;
//! assert!(finished.unread.is_empty());
//! let run = finished.result?;
//! // The queued message joined before the first model call.
//! let texts: Vec<_> = run.messages.iter().map(|m| m.text().into_owned()).collect();
//! assert_eq!(texts, ["Book me a table for Monday.", "Make that Tuesday.", "Booked for Tuesday."]);
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

use super::inbox::Inbox;
pub use super::inbox::{LateMessages, Unsent};
use super::state::{classify, Run};
use crate::context::RunContext;
use crate::error::AgentError;
use crate::event::AgentEvent;
use crate::types::{AgentRun, Message, ModelDelta};

/// How a run started with a handle ended: its result, and the messages sent
/// to it that it never took in, in the order they were sent.
#[derive(Debug)]
pub struct Finished {
    /// The run's result.
    pub result: Result<AgentRun, AgentError>,
    /// Queued messages the run did not take in.
    pub unread: Vec<Message>,
}

impl Finished {
    /// The run's result, for `?`: unread messages are dropped.
    ///
    /// # Errors
    ///
    /// The run's error.
    pub fn into_result(self) -> Result<AgentRun, AgentError> {
        self.result
    }
}

/// Sends messages into a running run, and cancels it; a cheap clone of
/// what [`RunHandle`] holds, for another task.
#[derive(Debug, Clone)]
pub struct RunSender {
    inbox: Inbox,
    ctx: RunContext,
}

impl RunSender {
    /// Queues a user message with `text`. See [`send_message`](Self::send_message).
    ///
    /// # Errors
    ///
    /// [`Unsent`] with the message when the run has already ended.
    pub fn send(&self, text: impl Into<String>) -> Result<(), Unsent> {
        self.send_message(Message::user(text))
    }

    /// Queues `message`: it joins the conversation before the run's next
    /// model call. See the [module docs](self).
    ///
    /// # Errors
    ///
    /// [`Unsent`] with the message when the run has already ended.
    pub fn send_message(&self, message: Message) -> Result<(), Unsent> {
        self.inbox.push(message)
    }

    /// Cancels the run: it fails with [`AgentError::Cancelled`].
    pub fn cancel(&self) {
        self.ctx.cancel();
    }
}

/// A run in progress that takes messages: made by
/// [`AgentExt::start`](super::AgentExt::start) or [`Agent::start`](super::Agent::start).
/// Await it for the [`Finished`] run. See the [module docs](self).
///
/// The run makes progress while the handle is polled (awaited, or in a
/// `select!`/`join!`); send from another task with a [`sender`](Self::sender).
/// Dropping the handle drops the run.
#[must_use = "the run makes progress only while its handle is awaited"]
pub struct RunHandle {
    sender: RunSender,
    run: BoxFuture<'static, Finished>,
}

impl RunHandle {
    pub(crate) fn new(
        inbox: Inbox,
        ctx: RunContext,
        run: BoxFuture<'static, Result<AgentRun, AgentError>>,
    ) -> Self {
        let queue = inbox.clone();
        Self {
            sender: RunSender { inbox, ctx },
            run: Box::pin(async move {
                let result = run.await;
                let unread = queue.close();
                Finished { result, unread }
            }),
        }
    }

    /// Queues a user message with `text`.
    ///
    /// # Errors
    ///
    /// [`Unsent`] with the message when the run has already ended.
    pub fn send(&self, text: impl Into<String>) -> Result<(), Unsent> {
        self.sender.send(text)
    }

    /// Queues `message`.
    ///
    /// # Errors
    ///
    /// [`Unsent`] with the message when the run has already ended.
    pub fn send_message(&self, message: Message) -> Result<(), Unsent> {
        self.sender.send_message(message)
    }

    /// Cancels the run: it fails with [`AgentError::Cancelled`].
    pub fn cancel(&self) {
        self.sender.cancel();
    }

    /// A sender for another task.
    pub fn sender(&self) -> RunSender {
        self.sender.clone()
    }

    /// The run's context.
    pub fn context(&self) -> &RunContext {
        &self.sender.ctx
    }

    /// What the run does with messages queued after it decided to finish
    /// (default [`LateMessages::Continue`]).
    pub fn late_messages(self, late: LateMessages) -> Self {
        self.sender.inbox.set_late(late);
        self
    }
}

impl fmt::Debug for RunHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunHandle")
            .field("run_id", self.sender.ctx.run_id())
            .field("inbox", &self.sender.inbox)
            .finish_non_exhaustive()
    }
}

impl Future for RunHandle {
    type Output = Finished;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Finished> {
        self.run.as_mut().poll(cx)
    }
}

impl Run {
    /// Takes in the queued messages, in order, each through `before_run`.
    pub(super) async fn take_queued(&mut self) -> Result<(), AgentError> {
        let Some(inbox) = self.inbox.clone() else {
            return Ok(());
        };
        while let Some(mut message) = inbox.pop() {
            let added = match &self.hooks {
                Some(hooks) => hooks
                    .before_run(&self.ctx, &mut message, &self.messages)
                    .await
                    .map_err(classify)?,
                None => Vec::new(),
            };
            let text = message.text().into_owned();
            let ctx = &self.ctx;
            tracing::debug!(target: "tower_agent", run_id = %ctx.run_id(), "queued message taken in");
            ctx.emit(|| AgentEvent::QueuedMessage {
                run_id: ctx.run_id().clone(),
                text: text.clone(),
            });
            if let Some(sink) = &self.stream {
                sink.send(&ModelDelta::UserMessage { text });
            }
            self.messages.push(message);
            self.messages.extend(added.into_iter().map(Message::system));
        }
        Ok(())
    }

    /// Whether the run, about to finish, goes on for queued messages.
    pub(super) fn continues_for_queued(&self) -> bool {
        self.inbox.as_ref().is_some_and(Inbox::continues)
    }
}
