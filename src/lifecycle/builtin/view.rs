//! What the context built-ins keep per run: a slot of state per middleware
//! instance ([`run_slot`]), and the request they derived last turn
//! ([`View`]), extended in place while the run only appends.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::context::RunContext;
use crate::types::History;

/// Slots of type `T`, one per middleware instance, in a run's state.
struct Slots<T>(Arc<Mutex<Vec<Slot<T>>>>);

/// One middleware instance's slot: its id and its state.
type Slot<T> = (usize, Arc<Mutex<T>>);

impl<T> Clone for Slots<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Self(Arc::default())
    }
}

/// The `T` that the middleware instance `owner` keeps in `ctx`'s run, made
/// on first use.
pub(crate) fn run_slot<T: Default + Send + 'static>(
    ctx: &RunContext,
    owner: usize,
) -> Arc<Mutex<T>> {
    let slots = ctx.with_state(|s| s.get_or_insert_with(Slots::<T>::default).clone());
    let mut slots = lock(&slots.0);
    if let Some((_, slot)) = slots.iter().find(|(o, _)| *o == owner) {
        return slot.clone();
    }
    let slot = Arc::new(Mutex::new(T::default()));
    slots.push((owner, slot.clone()));
    slot
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A request derived from a run's messages last turn: which input it came
/// from (its length and digest) and what it became.
#[derive(Default)]
pub(crate) struct View {
    input_len: usize,
    input_digest: [u8; 16],
    output: Option<History>,
}

impl View {
    /// `input` grew from the input last seen by appends only: the output
    /// last made, with the new messages appended (shared, O(new)).
    pub(crate) fn extend(&self, input: &History) -> Option<History> {
        let output = self.output.as_ref()?;
        if input.len() < self.input_len || input.prefix_digest(self.input_len) != self.input_digest
        {
            return None;
        }
        let mut output = output.clone();
        for i in self.input_len..input.len() {
            output.push(input[i].clone());
        }
        Some(output)
    }

    /// Remembers that `input` became `output`.
    pub(crate) fn set(&mut self, input: &History, output: &History) {
        self.input_len = input.len();
        self.input_digest = input.digest();
        self.output = Some(output.clone());
    }

    /// Forgets it.
    pub(crate) fn clear(&mut self) {
        self.output = None;
    }
}

/// Where each system message of a run's messages is, and the last user
/// message, found once: the
/// messages before `scanned` were looked at, and are still the same while
/// the prefix digest holds.
#[derive(Default)]
pub(crate) struct SystemIndex {
    scanned: usize,
    digest: [u8; 16],
    at: Vec<usize>,
    last_user: Option<usize>,
}

impl SystemIndex {
    /// The positions of the system messages among `history`'s first `upto`.
    pub(crate) fn before(&mut self, history: &History, upto: usize) -> &[usize] {
        let upto = upto.min(history.len());
        if self.scanned > history.len() || history.prefix_digest(self.scanned) != self.digest {
            self.scanned = 0;
            self.at.clear();
            self.last_user = None;
        }
        if upto > self.scanned {
            for i in self.scanned..upto {
                match history[i].role {
                    crate::types::Role::System => self.at.push(i),
                    crate::types::Role::User => self.last_user = Some(i),
                    _ => {}
                }
            }
            self.scanned = upto;
            self.digest = history.prefix_digest(upto);
        }
        let n = self.at.partition_point(|&i| i < upto);
        &self.at[..n]
    }

    /// The last user message among the messages scanned so far.
    pub(crate) fn last_user(&self) -> Option<usize> {
        self.last_user
    }
}

/// The latest position at or before `want` where `history` can be cut in
/// two without separating a tool call from its result: no tool result at
/// or after it answers a call before it. Walks back from the newest
/// message, so it costs the part after the cut. `0` if there is none.
pub(crate) fn tool_safe_cut(history: &History, want: usize) -> usize {
    let n = history.len();
    let mut pending: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (k, message) in history.iter().rev().enumerate() {
        let i = n - 1 - k;
        if message.role == crate::types::Role::Tool {
            if let Some(id) = &message.tool_call_id {
                pending.insert(id.as_str());
            }
        }
        for call in &message.tool_calls {
            pending.remove(call.id.as_str());
        }
        if i <= want && pending.is_empty() && message.role != crate::types::Role::Tool {
            return i;
        }
    }
    0
}
