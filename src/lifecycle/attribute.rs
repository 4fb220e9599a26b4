//! What a middleware's error or panic becomes: an error naming the
//! middleware and the hook. Tripwires are named by
//! `error::attribute_tripwire`, the one place.

use std::any::Any;

use super::HookPoint;
use crate::error::{attribute_tripwire, panic_message, AgentError, BoxError};

/// The error a middleware's panic at `hook` becomes.
pub(crate) fn panicked(name: &str, hook: HookPoint, payload: &(dyn Any + Send)) -> AgentError {
    AgentError::Middleware {
        middleware: name.to_owned(),
        hook: hook.as_str().to_owned(),
        source: format!("panicked: {}", panic_message(payload)).into(),
    }
}

/// The run error a hook's error becomes: a tripwire gets the middleware and
/// the hook filled in, an unclassified error becomes
/// [`AgentError::Middleware`], anything the run knows (a provider error, a
/// cancellation, a nested run's tripwire) stays as it is.
pub(crate) fn attribute(err: BoxError, name: &str, hook: HookPoint) -> AgentError {
    match AgentError::classify(err) {
        AgentError::Other(source) => AgentError::Middleware {
            middleware: name.to_owned(),
            hook: hook.as_str().to_owned(),
            source,
        },
        other => attribute_tripwire(other, name, hook.as_str()),
    }
}

/// Fills in the middleware and hook of a nameless tripwire; leaves any other
/// error as it is (a wrap middleware passes its inner call's errors on).
pub(crate) fn name_tripwire(err: BoxError, name: &str, hook: &str) -> BoxError {
    if !matches!(err.downcast_ref::<AgentError>(), Some(AgentError::Tripwire { middleware, .. }) if middleware.is_empty())
    {
        return err;
    }
    match err.downcast::<AgentError>() {
        Ok(agent) => Box::new(attribute_tripwire(*agent, name, hook)),
        Err(err) => err,
    }
}
