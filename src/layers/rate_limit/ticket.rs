//! What a call holds of a key's quota: its place in the queue ([`Waiter`]),
//! then its grants ([`Ticket`]), then, once sent, what it still has to
//! settle ([`Settlement`]); and its arrival ([`Arrival`]), which hands it
//! the first of them.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Sleep;

use super::bucket::Grant;
use super::key::{Admit, Entered, KeyShared, Taken};
use super::pool::Drawn;

/// A call refused on arrival: it would wait longer than it may.
pub(super) struct Refused {
    pub(super) key: Arc<KeyShared>,
    pub(super) retry_after: Duration,
}

/// The outcome of arriving at a key's queue.
pub(super) enum Arrival {
    /// Admitted at once.
    Admitted(Ticket),
    /// Queued: poll the waiter until it is admitted.
    Queued(Waiter),
}

impl KeyShared {
    /// Arrives at the key's queue needing `requests` (0 for a caller that
    /// already holds its request slot) and `tokens`.
    ///
    /// # Errors
    ///
    /// When the call would wait longer than `max_wait`: the key and how
    /// long the call would wait. Nothing is taken or queued then.
    #[inline]
    pub(super) fn arrive(
        self: Arc<Self>,
        requests: u64,
        tokens: u64,
        max_wait: Duration,
    ) -> Result<Arrival, Refused> {
        match self.enter(requests, tokens, max_wait) {
            Ok(Entered::Admitted(taken)) => Ok(Arrival::Admitted(Ticket::new(self, taken))),
            Ok(Entered::Queued(id)) => Ok(Arrival::Queued(Waiter::new(self, id))),
            Err(retry_after) => Err(Refused {
                key: self,
                retry_after,
            }),
        }
    }
}

/// A place in a key's queue. Dropped before admission, it leaves the queue.
pub(super) struct Waiter {
    shared: Arc<KeyShared>,
    id: u64,
    sleep: Option<Pin<Box<Sleep>>>,
    admitted: bool,
}

impl Waiter {
    /// The place `id` in `shared`'s queue.
    pub(super) fn new(shared: Arc<KeyShared>, id: u64) -> Self {
        Self {
            shared,
            id,
            sleep: None,
            admitted: false,
        }
    }

    /// The key's name.
    pub(super) fn key(&self) -> &str {
        self.shared.key()
    }

    /// Resolves once admitted.
    pub(super) fn poll_admitted(&mut self, cx: &mut Context<'_>) -> Poll<Ticket> {
        loop {
            match self.shared.poll_admit(self.id, cx.waker()) {
                Admit::Admitted(taken) => {
                    self.admitted = true;
                    let ticket = Ticket::new(self.shared.clone(), taken);
                    return Poll::Ready(ticket);
                }
                Admit::Gone => {
                    // Not queued: admit with nothing held rather than hang.
                    self.admitted = true;
                    return Poll::Ready(Ticket::new(self.shared.clone(), (None, None, None)));
                }
                Admit::NotHead => return Poll::Pending,
                Admit::WaitUntil(deadline) => {
                    let sleep = match &mut self.sleep {
                        Some(sleep) => {
                            sleep.as_mut().reset(deadline);
                            sleep
                        }
                        None => self
                            .sleep
                            .insert(Box::pin(tokio::time::sleep_until(deadline))),
                    };
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
            }
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if !self.admitted {
            self.shared.leave(self.id);
        }
    }
}

impl fmt::Debug for Waiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiter")
            .field("key", &self.key())
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// What one call holds of a key's quota. Dropped before the call was sent,
/// it gives it back; once sent, its tokens are settled with the real usage,
/// or kept as reserved if the call failed.
pub(super) struct Ticket {
    /// `None` once sent: the ticket is then a [`Settlement`].
    shared: Option<Arc<KeyShared>>,
    requests: Option<Grant>,
    tokens: Option<Grant>,
    /// Where the token grant's settlement is posted, if it holds a slot.
    slot: Option<u8>,
}

impl Ticket {
    #[inline]
    pub(super) fn new(shared: Arc<KeyShared>, (requests, tokens, slot): Taken) -> Self {
        Self {
            shared: Some(shared),
            requests,
            tokens,
            slot,
        }
    }

    /// The state of the ticket's key.
    pub(super) fn shared(&self) -> &Arc<KeyShared> {
        self.shared
            .as_ref()
            .expect("a ticket holds its key until it is sent")
    }

    /// The key's name.
    pub(super) fn key(&self) -> &str {
        self.shared().key()
    }

    /// `ticket`, or a slot held from `poll_ready` (`held`) that takes over
    /// what `ticket` holds.
    pub(super) fn merged(held: Option<Ticket>, ticket: Ticket) -> Ticket {
        match held {
            Some(mut held) => {
                held.merge(ticket);
                held
            }
            None => ticket,
        }
    }

    /// Takes over what `other` (of the same key) holds that this ticket
    /// lacks; `other` gives back the rest as it drops.
    pub(super) fn merge(&mut self, mut other: Ticket) {
        if self.requests.is_none() {
            self.requests = other.requests.take();
        }
        if self.tokens.is_none() {
            self.tokens = other.tokens.take();
            self.slot = other.slot.take();
        }
    }

    /// The call went out: from now on the reservation is kept, and only
    /// the tokens are settled, with the response's usage.
    #[inline]
    pub(super) fn send(mut self) -> Settlement {
        let shared = self.shared.take().expect("a ticket is sent once");
        Settlement::new(shared, self.tokens.take(), self.slot.take())
    }
}

/// What a call that went out still has to settle: its token reservation.
/// A few words, as it moves with the response future: the grant of a call
/// that holds a posting slot stays with the key. Dropped unsettled (the
/// call failed), it keeps the reservation.
pub(super) struct Settlement {
    shared: Arc<KeyShared>,
    pending: Pending,
}

/// What a [`Settlement`] still has to do.
enum Pending {
    /// Nothing: no token limit, or settled already.
    Settled,
    /// Post the outcome in this slot (the key keeps the grant).
    Posted {
        slot: u8,
        /// What the grant reserved: a settlement beyond it is applied at
        /// once, before the lock-free pool admits anyone on top of it.
        reserved: u64,
    },
    /// Settle this grant under the key's lock (no slot was free). Boxed:
    /// every settlement moves with its response future, and this is rare.
    Locked(Box<Grant>),
    /// Settle what was drawn from the lock-free pool.
    Drawn(Drawn),
}

impl Settlement {
    /// What a call admitted with `tokens` (and the posting `slot`, if
    /// any) settles once sent.
    #[inline]
    pub(super) fn new(shared: Arc<KeyShared>, tokens: Option<Grant>, slot: Option<u8>) -> Self {
        let pending = match (tokens, slot) {
            (Some(grant), Some(slot)) => Pending::Posted {
                slot,
                reserved: grant.amount,
            },
            (Some(grant), None) => Pending::Locked(Box::new(grant)),
            (None, _) => Pending::Settled,
        };
        Self { shared, pending }
    }

    /// What a call admitted from the lock-free pool settles once sent.
    #[inline]
    pub(super) fn drawn(shared: Arc<KeyShared>, drawn: Drawn) -> Self {
        Self {
            shared,
            pending: Pending::Drawn(drawn),
        }
    }

    /// Charges the difference between the real token count and the
    /// reservation, or refunds it. Once: the tokens are then settled.
    #[inline]
    pub(super) fn settle(&mut self, actual_tokens: u64) {
        // Drawn from the lock-free pool: the path of most calls, inlined.
        if let Pending::Drawn(drawn) = self.pending {
            self.pending = Pending::Settled;
            self.shared.settle_drawn(drawn, Some(actual_tokens));
            return;
        }
        self.settle_locked(actual_tokens);
    }

    #[inline(never)]
    fn settle_locked(&mut self, actual_tokens: u64) {
        match std::mem::replace(&mut self.pending, Pending::Settled) {
            Pending::Posted { slot, reserved } => {
                self.shared
                    .post(slot, Some(actual_tokens), actual_tokens > reserved);
            }
            Pending::Locked(grant) => self.shared.settle(&grant, actual_tokens),
            Pending::Drawn(drawn) => self.shared.settle_drawn(drawn, Some(actual_tokens)),
            Pending::Settled => {}
        }
    }
}

impl Drop for Settlement {
    #[inline]
    fn drop(&mut self) {
        match self.pending {
            Pending::Settled | Pending::Locked(_) => {}
            Pending::Posted { slot, .. } => self.shared.post(slot, None, false),
            Pending::Drawn(drawn) => self.shared.settle_drawn(drawn, None),
        }
    }
}

impl fmt::Debug for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pending = match self.pending {
            Pending::Settled => "settled",
            Pending::Posted { .. } => "posted",
            Pending::Locked(_) => "locked",
            Pending::Drawn(_) => "drawn",
        };
        f.debug_struct("Settlement")
            .field("key", &self.shared.key())
            .field("pending", &pending)
            .finish()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            if self.requests.is_some() || self.tokens.is_some() {
                shared.release(self.requests.as_ref(), self.tokens.as_ref(), self.slot);
            }
        }
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("key", &self.shared.as_ref().map(|shared| shared.key()))
            .field("requests", &self.requests.map(|g| g.amount))
            .field("tokens", &self.tokens.map(|g| g.amount))
            .finish()
    }
}
