//! The queue between a [`RunHandle`](super::handle::RunHandle) and its
//! run: what the handle sends, what the run takes in, what comes back.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use crate::types::Message;

/// What a run does with messages queued after it decided to finish.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LateMessages {
    /// Take them in and go on: the model answers them (the default).
    #[default]
    Continue,
    /// Finish; they come back unread in [`Finished::unread`](super::handle::Finished::unread).
    Return,
}

/// The queue between a [`RunHandle`](super::handle::RunHandle) and its run, carried in the run
/// request's extensions until the run loop takes it out.
#[derive(Clone, Default)]
pub(crate) struct Inbox {
    shared: Arc<Mutex<Queue>>,
}

#[derive(Default)]
struct Queue {
    messages: VecDeque<Message>,
    closed: bool,
    late: LateMessages,
}

impl Inbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn push(&self, message: Message) -> Result<(), Unsent> {
        let mut queue = self.lock();
        if queue.closed {
            return Err(Unsent(message));
        }
        queue.messages.push_back(message);
        Ok(())
    }

    pub(super) fn pop(&self) -> Option<Message> {
        self.lock().messages.pop_front()
    }

    /// Whether the run, about to finish, goes on for queued messages.
    pub(super) fn continues(&self) -> bool {
        let queue = self.lock();
        queue.late == LateMessages::Continue && !queue.messages.is_empty()
    }

    /// The run ended: no more messages; those left come back.
    pub(super) fn close(&self) -> Vec<Message> {
        let mut queue = self.lock();
        queue.closed = true;
        queue.messages.drain(..).collect()
    }
}

impl Inbox {
    /// What the run does with late messages.
    pub(super) fn set_late(&self, late: LateMessages) {
        self.lock().late = late;
    }
}

impl fmt::Debug for Inbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox")
            .field("queued", &self.lock().messages.len())
            .finish()
    }
}

/// A message sent to a run that had already ended; it comes back.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the run has ended; the message was not taken in")]
pub struct Unsent(pub Message);
