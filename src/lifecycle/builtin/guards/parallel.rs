//! The parallel input guard: the input guards' check, started in
//! `before_run`, runs beside the run's first model call. The call's deltas
//! are held until the check passed; a trip cancels the call, keeps the
//! usage it reported, and sends nothing it produced.

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;

use super::checks::{Config, Stop};
use super::guard::GuardTarget;
use crate::context::RunContext;
use crate::error::{AgentError, BoxError};
use crate::request::{DeltaSink, ModelCall};
use crate::types::{ModelDelta, ModelResponse};

type Check = BoxFuture<'static, Result<Option<String>, Stop>>;

/// The input check of a run, waiting for the run's first model call: kept
/// in the run's state.
#[derive(Clone)]
pub(crate) struct PendingInput(Arc<Mutex<Option<Check>>>);

impl PendingInput {
    /// Starts the input guards of `config` on `text` in `ctx`'s run; the
    /// run's first model call drives them.
    pub(crate) fn start(ctx: &RunContext, config: Arc<Config>, text: String) {
        let run = ctx.clone();
        let check: Check = Box::pin(async move {
            config
                .check(&run, &config.input, GuardTarget::Input, &text)
                .await
        });
        ctx.insert_state(PendingInput(Arc::new(Mutex::new(Some(check)))));
    }

    /// The check waiting in `ctx`'s run, once: for its first model call.
    pub(crate) fn take(ctx: &RunContext) -> Option<Check> {
        let pending = ctx.state::<PendingInput>()?;
        let check = pending
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        check
    }
}

enum HoldState {
    /// The check runs: deltas wait here.
    Holding(Vec<ModelDelta>),
    /// The check passed: deltas go straight on.
    Open,
    /// The check tripped: deltas go nowhere.
    Closed,
}

/// Holds a model call's deltas until the input check decided.
pub(crate) struct Hold {
    state: Arc<Mutex<HoldState>>,
    outer: Option<DeltaSink>,
}

impl Hold {
    /// Puts the hold between `call` and its sink.
    pub(crate) fn install(call: &mut ModelCall) -> Hold {
        let state = Arc::new(Mutex::new(HoldState::Holding(Vec::new())));
        let outer = call.stream.take();
        if let Some(sink) = &outer {
            let state = state.clone();
            call.stream = Some(sink.wrap(move |inner, delta| {
                match &mut *state.lock().unwrap_or_else(PoisonError::into_inner) {
                    HoldState::Holding(held) => held.push(delta.clone()),
                    HoldState::Open => inner.send(delta),
                    HoldState::Closed => {}
                }
            }));
        }
        Hold { state, outer }
    }

    /// Sends what was held, and from now on every delta as it comes.
    fn release(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let HoldState::Holding(held) = std::mem::replace(&mut *state, HoldState::Open) {
            if let Some(sink) = &self.outer {
                for delta in &held {
                    sink.send(delta);
                }
            }
        }
    }

    /// Drops what was held, and every delta from now on.
    fn discard(&self) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = HoldState::Closed;
    }
}

/// Drives `check` and `answer` (the model call) together. The answer is
/// returned once the check passed; a trip cancels the call (if it is still
/// under way) and fails with the tripwire, with the answer's usage recorded
/// if the call had answered without recording it.
pub(crate) async fn race(
    ctx: &RunContext,
    config: &Config,
    check: Check,
    hold: Hold,
    answer: impl Future<Output = Result<ModelResponse, BoxError>>,
) -> Result<ModelResponse, BoxError> {
    let mut check = check;
    let mut answer = pin!(answer);
    let mut answered = None;
    // The call is polled first, so it is under way before the check can
    // answer.
    let verdict = tokio::select! {
        biased;
        result = &mut answer => {
            answered = Some(result);
            check.await
        }
        verdict = &mut check => verdict,
    };
    match verdict {
        Ok(None) => {
            hold.release();
            match answered {
                Some(result) => result,
                None => answer.await,
            }
        }
        Ok(Some(_)) => {
            hold.discard();
            keep_usage(ctx, answered.as_ref());
            Err(AgentError::Config(format!(
                "an input guard of `{}` rewrote the input, which a guard run in parallel \
                 with the model call cannot do",
                config.name
            ))
            .into())
        }
        Err(stop) => {
            hold.discard();
            keep_usage(ctx, answered.as_ref());
            Err(stop.into_error(GuardTarget::Input, None))
        }
    }
}

/// Counts the usage of an answer the run will not use, unless the backend
/// already did.
fn keep_usage(ctx: &RunContext, answered: Option<&Result<ModelResponse, BoxError>>) {
    if let Some(Ok(response)) = answered {
        if !response.usage_recorded {
            ctx.record_usage(&response.model, response.usage);
        }
    }
}
