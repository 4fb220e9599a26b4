//! Where the walk down a call's wrap hooks left it, for a caller that
//! calls the service below itself when every hook hands the call on
//! ([`HookPort::walk_model`], [`HookPort::walk_tool`]).

use std::sync::Arc;
use std::task::Waker;

use futures::future::BoxFuture;

use super::HookFuture;
#[cfg(doc)]
use super::HookPort;
use crate::error::BoxError;
use crate::request::{BoxModel, BoxTool, ModelCall, ToolInvocation, ToolOutput};
use crate::types::ModelResponse;

/// Where [`HookPort::walk_model`] left a model call.
pub(crate) enum ModelWalk<'a> {
    /// Every wrap hook handed the call on (or none may run): the caller
    /// makes `service` ready, calls it with `call` and, when `guarded`,
    /// hands its answer, panic caught, to [`HookPort::model_answer`]. The
    /// service is the caller's again once the call is done.
    Service {
        service: BoxModel,
        call: ModelCall,
        guarded: bool,
    },
    /// A wrap hook answers with a future of its own (or the call goes
    /// through more than this run's hooks).
    Future(BoxFuture<'a, Result<ModelResponse, BoxError>>),
}

/// Where [`HookPort::walk_tool`] left a tool call.
pub(crate) enum ToolWalk<'a> {
    /// Every wrap hook handed the call on (or none may run): the caller
    /// makes `service` ready (`None`: the tool stack it handed the walk,
    /// which was not cloned), calls it with `invocation` and hands what
    /// comes of it to [`HookPort::finish_tool`] with `finish`, watching
    /// `finish`'s abort meanwhile.
    Service {
        service: Option<BoxTool>,
        invocation: ToolInvocation,
        finish: ToolFinish,
    },
    /// A wrap hook answers with a future of its own (or the call goes
    /// through more than this run's hooks).
    Future(HookFuture<'a, ToolOutput>),
}

/// What becomes of a tool call's answer that [`ToolWalk::Service`] left
/// to its caller.
pub(crate) struct ToolFinish {
    /// The depth of the run the lifecycle chain above the tool was
    /// installed for; with one, the tool's panic is caught, its nameless
    /// tripwire named, and its failure the model's error result.
    pub(crate) home: Option<usize>,
    /// The first error of the stack's delta hooks, which cuts the call.
    pub(crate) abort: Option<Arc<dyn CallAbort>>,
}

impl ToolFinish {
    /// Nothing above the tool: its answer goes out as it is.
    pub(crate) fn plain() -> Self {
        Self {
            home: None,
            abort: None,
        }
    }

    /// Whether a lifecycle chain is above the tool.
    pub(crate) fn guarded(&self) -> bool {
        self.home.is_some()
    }
}

/// What a tool call of a [`ToolWalk::Service`] came to, for
/// [`HookPort::finish_tool`].
pub(crate) enum ToolAnswer {
    /// The tool's answer, or its panic when the call is guarded.
    Answered(std::thread::Result<Result<ToolOutput, BoxError>>),
    /// The tool stack failed to get ready, or a delta hook failed first.
    Failed(BoxError),
}

/// The first error of a call's delta hooks, shared with the sink they run
/// on.
pub(crate) trait CallAbort: Send + Sync {
    /// The error, once a delta hook failed (taken: the call's own answer
    /// gives way to it).
    fn failed(&self) -> Option<BoxError>;
    /// Whether a delta hook failed, its error left in place.
    fn has_failed(&self) -> bool;
    /// Wakes `waker`'s task when a delta hook fails.
    fn register(&self, waker: &Waker);
    /// The error a delta hook failed with, taken (the call's own answer
    /// gives way to it).
    fn take(&self) -> Option<BoxError>;
}
