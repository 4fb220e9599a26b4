//! Wrap middleware: [`ModelMiddleware`] and [`ToolMiddleware`] surround the
//! call with a [`Next`] handler they may call 0..N times.

use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::Value;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};

use super::builtin::EditLog;
use super::invoke::{attribute, name_tripwire, panic_message, panicked, Bracket};
use super::HookPoint;
use crate::context::RunContext;
use crate::error::{AgentError, BoxError, ErrorKind};
use crate::request::{ModelCall, ToolInvocation, ToolOutput};
use crate::types::{History, ModelName, ModelResponse};

/// Around each model call: proceed (`next.run(call)` once), short-circuit
/// (answer without it), retry (call it in a loop, cloning `next`), or fall
/// back (call it, then answer something else on error).
///
/// Push it with [`MiddlewareStack::push_model`](super::MiddlewareStack::push_model),
/// or make it a tower layer with [`WrapModelLayer`](super::WrapModelLayer).
///
/// ```
/// use futures::future::BoxFuture;
/// use tower_agent::lifecycle::{ModelMiddleware, ModelNext};
/// use tower_agent::types::ModelResponse;
/// use tower_agent::{BoxError, ModelCall};
///
/// /// Tries the call once more when it fails.
/// struct RetryOnce;
///
/// impl ModelMiddleware for RetryOnce {
///     fn name(&self) -> &str {
///         "retry-once"
///     }
///
///     fn wrap_model<'a>(&'a self, call: ModelCall, next: ModelNext) -> BoxFuture<'a, Result<ModelResponse, BoxError>> {
///         Box::pin(async move {
///             match next.clone().run(call.clone()).await {
///                 Ok(response) => Ok(response),
///                 Err(_) => next.run(call).await,
///             }
///         })
///     }
/// }
/// ```
pub trait ModelMiddleware: Send + Sync + 'static {
    /// The name events and tripwires carry.
    fn name(&self) -> &str;

    /// Whether the run must hold each turn's text until `after_model` ran:
    /// set it when the middleware retries or blocks answers whose text would
    /// otherwise already have streamed.
    fn holds_stream(&self) -> bool {
        false
    }

    /// Wraps one model call.
    fn wrap_model<'a>(
        &'a self,
        call: ModelCall,
        next: ModelNext,
    ) -> BoxFuture<'a, Result<ModelResponse, BoxError>>;
}

/// Around each tool call that passed approval: change the arguments, retry,
/// or answer for the tool. Arguments it changes are validated against the
/// tool's schema again, and the layers inside see `approved == false`: an
/// approval never carries over to new arguments.
///
/// Push it with [`MiddlewareStack::push_tool`](super::MiddlewareStack::push_tool),
/// or make it a tower layer with [`WrapToolLayer`](super::WrapToolLayer).
pub trait ToolMiddleware: Send + Sync + 'static {
    /// The name events and tripwires carry.
    fn name(&self) -> &str;

    /// Wraps one tool call.
    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> BoxFuture<'a, Result<ToolOutput, BoxError>>;
}

mod sealed {
    #[allow(unreachable_pub)]
    pub trait Sealed {}
    impl Sealed for crate::ModelCall {}
    impl Sealed for crate::ToolInvocation {}
}

/// A request wrap middleware can wrap: [`ModelCall`] or [`ToolInvocation`].
pub trait WrapRequest: sealed::Sealed + Send + Sized + 'static {
    /// What the call answers.
    type Response: Send + 'static;
    #[doc(hidden)]
    type Snapshot: Clone + Send + Sync + 'static;

    /// The run's context.
    fn context(&self) -> &RunContext;

    #[doc(hidden)]
    fn wrap_hook() -> HookPoint;
    #[doc(hidden)]
    fn snapshot(&self) -> Self::Snapshot;
    /// Called on the request middleware `by` hands to `next`, with what it
    /// was handed itself.
    #[doc(hidden)]
    fn reconcile(&mut self, by: &Arc<str>, received: &Self::Snapshot);
    /// What is called: `model` or `tool`.
    #[doc(hidden)]
    const KIND: &'static str;
    /// The name of what is called (read only on an error, so cheap to take).
    #[doc(hidden)]
    type Name: fmt::Display + Send + 'static;
    /// The model's or the tool's name.
    #[doc(hidden)]
    fn name(&self) -> Self::Name;
    /// What an error of the service below a lifecycle chain becomes: a tool's
    /// failure is an error result the middleware (and the model) read.
    #[doc(hidden)]
    fn recover(name: &Self::Name, err: BoxError) -> Result<Self::Response, BoxError>;
    /// What the error of a middleware in a lifecycle chain becomes.
    #[doc(hidden)]
    fn link_error(err: BoxError, name: &str) -> BoxError;
}

impl WrapRequest for ModelCall {
    type Response = ModelResponse;
    type Snapshot = History;

    fn context(&self) -> &RunContext {
        &self.context
    }

    fn wrap_hook() -> HookPoint {
        HookPoint::WrapModel
    }

    fn snapshot(&self) -> History {
        self.request.messages.clone()
    }

    /// Tells a prompt-cache guard, if the run has one, that `by` changed the
    /// messages.
    fn reconcile(&mut self, by: &Arc<str>, received: &History) {
        if !History::ptr_eq(received, &self.request.messages) {
            if let Some(log) = EditLog::of(&self.context) {
                log.record(by, received.clone(), &self.request.messages);
            }
        }
    }

    const KIND: &'static str = "model";
    type Name = ModelName;

    fn name(&self) -> ModelName {
        self.request.model.clone()
    }

    fn recover(_name: &ModelName, err: BoxError) -> Result<ModelResponse, BoxError> {
        // Retry and fallback middleware must see the model's failures.
        Err(err)
    }

    fn link_error(err: BoxError, name: &str) -> BoxError {
        name_tripwire(err, name, HookPoint::WrapModel.as_str())
    }
}

impl WrapRequest for ToolInvocation {
    type Response = ToolOutput;
    type Snapshot = (String, Value);

    fn context(&self) -> &RunContext {
        &self.context
    }

    fn wrap_hook() -> HookPoint {
        HookPoint::WrapTool
    }

    fn snapshot(&self) -> (String, Value) {
        (self.call.arguments.clone(), self.args.clone())
    }

    /// Keeps the argument text and the parsed arguments in step, whichever
    /// the middleware changed, and withdraws the approval when they changed.
    fn reconcile(&mut self, _by: &Arc<str>, (text, args): &(String, Value)) {
        let text_changed = self.call.arguments != *text;
        let args_changed = self.args != *args;
        if text_changed && !args_changed {
            self.args = serde_json::from_str(&self.call.arguments).unwrap_or(Value::Null);
        } else if args_changed && !text_changed {
            self.call.arguments = self.args.to_string();
        }
        let changed = self.args != *args || (self.args.is_null() && self.call.arguments != *text);
        if changed {
            self.approved = false;
        }
    }

    const KIND: &'static str = "tool";
    type Name = String;

    fn name(&self) -> String {
        self.call.name.clone()
    }

    fn recover(name: &String, err: BoxError) -> Result<ToolOutput, BoxError> {
        let err = AgentError::classify(err);
        match err.kind() {
            ErrorKind::Tripwire
            | ErrorKind::Cancelled
            | ErrorKind::Middleware
            | ErrorKind::Approval
            | ErrorKind::HistoryIntegrity => Err(Box::new(err)),
            _ => Ok(ToolOutput::error(format!(
                "The tool `{name}` failed: {err}"
            ))),
        }
    }

    fn link_error(err: BoxError, name: &str) -> BoxError {
        Box::new(attribute(err, name, HookPoint::WrapTool))
    }
}

type BoxService<Req> = BoxCloneSyncService<Req, <Req as WrapRequest>::Response, BoxError>;

/// One wrap middleware of a stack.
pub(crate) trait Wrap<Req: WrapRequest>: Send + Sync + 'static {
    fn wrap(&self, req: Req, next: Next<Req>) -> BoxFuture<'_, Result<Req::Response, BoxError>>;
}

pub(crate) struct ModelLink(pub(crate) Arc<dyn ModelMiddleware>);

impl Wrap<ModelCall> for ModelLink {
    fn wrap(
        &self,
        call: ModelCall,
        next: ModelNext,
    ) -> BoxFuture<'_, Result<ModelResponse, BoxError>> {
        self.0.wrap_model(call, next)
    }
}

pub(crate) struct ToolLink(pub(crate) Arc<dyn ToolMiddleware>);

impl Wrap<ToolInvocation> for ToolLink {
    fn wrap(
        &self,
        call: ToolInvocation,
        next: ToolNext,
    ) -> BoxFuture<'_, Result<ToolOutput, BoxError>> {
        self.0.wrap_tool(call, next)
    }
}

/// A named wrap middleware in a stack.
pub(crate) struct Link<Req: WrapRequest> {
    pub(crate) name: Arc<str>,
    pub(crate) wrap: Arc<dyn Wrap<Req>>,
}

impl<Req: WrapRequest> Clone for Link<Req> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            wrap: self.wrap.clone(),
        }
    }
}

/// The rest of the stack below a wrap middleware: what `next` calls.
///
/// Call [`run`](Self::run) once to proceed, never to answer yourself, or on
/// clones to call it again (retry, fallback). Each run drives the service it
/// calls to readiness first.
///
/// # Clone
///
/// Cheap: clones share the rest of the stack. The service that was made
/// ready before the middleware was called goes to the first run, whichever
/// clone makes it; later runs call a clone of it, driven to readiness then.
pub struct Next<Req: WrapRequest> {
    /// The wrap middleware still to run (`None` below a tower adapter).
    links: Option<Arc<[Link<Req>]>>,
    index: usize,
    base: Arc<Base<Req>>,
    /// The middleware that was handed what request, to compare with what it
    /// hands on.
    received: Option<(Arc<str>, Req::Snapshot)>,
}

/// The service below the last middleware.
struct Base<Req: WrapRequest> {
    /// Made ready by `poll_ready` (holding whatever it reserved): for the
    /// first run.
    ready: Mutex<Option<BoxService<Req>>>,
    /// For the runs after it.
    template: BoxService<Req>,
    /// Below a lifecycle chain: a tool's failure becomes its error result.
    recover: bool,
}

impl<Req: WrapRequest> Base<Req> {
    fn new(service: BoxService<Req>, recover: bool) -> Arc<Self> {
        Arc::new(Self {
            template: service.clone(),
            ready: Mutex::new(Some(service)),
            recover,
        })
    }

    fn take(&self) -> BoxService<Req> {
        let ready = self
            .ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        ready.unwrap_or_else(|| self.template.clone())
    }
}

/// The `next` of a [`ModelMiddleware`].
pub type ModelNext = Next<ModelCall>;

/// The `next` of a [`ToolMiddleware`].
pub type ToolNext = Next<ToolInvocation>;

impl<Req: WrapRequest> Next<Req> {
    /// A `next` calling `service` (made ready), for middleware `by` handed
    /// `received`.
    pub(crate) fn service(service: BoxService<Req>, by: &Arc<str>, received: &Req) -> Self {
        Self {
            links: None,
            index: 0,
            base: Base::new(service, false),
            received: Some((by.clone(), received.snapshot())),
        }
    }

    /// The chain `links` (the first outermost) around `base`.
    pub(crate) fn chain(links: Arc<[Link<Req>]>, base: BoxService<Req>) -> Self {
        Self {
            links: Some(links),
            index: 0,
            base: Base::new(base, true),
            received: None,
        }
    }

    /// Calls the rest of the stack with `req`.
    ///
    /// # Errors
    ///
    /// What the rest of the stack fails with.
    pub async fn run(self, mut req: Req) -> Result<Req::Response, BoxError> {
        if let Some((by, received)) = &self.received {
            req.reconcile(by, received);
        }
        let link = self
            .links
            .as_ref()
            .and_then(|links| links.get(self.index))
            .cloned();
        let Some(link) = link else {
            return call_base(self.base.take(), req, self.base.recover).await;
        };
        let next = Next {
            links: self.links,
            index: self.index + 1,
            base: self.base,
            received: Some((link.name.clone(), req.snapshot())),
        };
        let ctx = req.context().clone();
        guarded(&ctx, &link.name, Req::wrap_hook(), || {
            link.wrap.wrap(req, next)
        })
        .await
        .map_err(|err| Req::link_error(err, &link.name))
    }
}

impl<Req: WrapRequest> Clone for Next<Req> {
    fn clone(&self) -> Self {
        Self {
            links: self.links.clone(),
            index: self.index,
            base: self.base.clone(),
            received: self.received.clone(),
        }
    }
}

impl<Req: WrapRequest> fmt::Debug for Next<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rest: Vec<&str> = self
            .links
            .iter()
            .flat_map(|links| links[self.index.min(links.len())..].iter())
            .map(|l| &*l.name)
            .collect();
        f.debug_struct("Next")
            .field("middleware", &rest)
            .finish_non_exhaustive()
    }
}

/// Calls the service below the last middleware: made ready first; a panic
/// becomes an error, and a nameless tripwire names the model or the tool.
/// Below a lifecycle chain (`recover`), a tool's failure becomes the error
/// result the model would read, so that what a middleware fails with is its
/// own error.
async fn call_base<Req: WrapRequest>(
    mut service: BoxService<Req>,
    req: Req,
    recover: bool,
) -> Result<Req::Response, BoxError> {
    let name = req.name();
    let base = || format!("{}:{name}", Req::KIND);
    service.ready().await?;
    let result = match AssertUnwindSafe(service.call(req)).catch_unwind().await {
        Ok(result) => result.map_err(|e| name_tripwire(e, &base(), "call")),
        Err(panic) => Err(format!("`{}` panicked: {}", base(), panic_message(&*panic)).into()),
    };
    match result {
        Err(err) if recover => Req::recover(&name, err),
        result => result,
    }
}

/// Runs one wrap middleware: events around it, its panic a typed error, its
/// nameless tripwire named after it.
pub(crate) async fn guarded<R, F>(
    ctx: &RunContext,
    name: &Arc<str>,
    hook: HookPoint,
    make: impl FnOnce() -> F,
) -> Result<R, BoxError>
where
    F: Future<Output = Result<R, BoxError>>,
{
    let bracket = Bracket::open(ctx, name, hook);
    let result = match catch_unwind(AssertUnwindSafe(make)) {
        Ok(future) => AssertUnwindSafe(future).catch_unwind().await,
        Err(panic) => Err(panic),
    };
    match result {
        Ok(Ok(response)) => {
            bracket.close("ok");
            Ok(response)
        }
        Ok(Err(err)) => {
            bracket.close("error");
            Err(name_tripwire(err, name, hook.as_str()))
        }
        Err(panic) => {
            bracket.close("panic");
            Err(Box::new(panicked(name, hook, &*panic)))
        }
    }
}
