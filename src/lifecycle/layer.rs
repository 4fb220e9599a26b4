//! [`LifecycleLayer`]: installs the hooks into a run and brackets it; the
//! same bracketing behind an agent's own middleware ([`AgentMiddleware`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use tower::{Layer, Service};

use futures::future::BoxFuture;
use tower::ServiceExt;

use super::installed::{InstalledHooks, Levels};
use super::placement::AgentLevels;
use super::runtime::RunMiddleware;
use super::stack::CompiledStack;
use super::{Middleware, MiddlewareStack};
use crate::context::PortSlot;
use crate::context::RunContext;
use crate::error::{AgentError, BoxError};
use crate::hooks::{
    install, install_slot, port_slot, AgentMiddleware, HookPort, RunBracket, RunOutcome, RunStart,
};
use crate::request::{BoxAgent, RunInput, RunRequest};
use crate::types::AgentRun;

/// The response future of the lifecycle adapters
/// ([`FromFn`](super::FromFn), [`WrapModel`](super::WrapModel),
/// [`WrapTool`](super::WrapTool)), and of a [`Lifecycle`] run its hooks
/// bracket.
///
/// Boxed behind this name so that it can change without breaking users.
pub type ResponseFuture<T, E = BoxError> = crate::future::BoxResponseFuture<T, E>;

/// A tower [`Layer`] over a run service (an [`Agent`](crate::Agent), layered
/// or not) that runs a [`MiddlewareStack`]'s hooks in every run through it.
///
/// For each run it
/// - composes the middleware: those the run inherited (from the parent run
///   of a nested agent, or from an outer lifecycle layer) outermost, then
///   the runtime's ([`Runtime::layer`](super::Runtime::layer)), this layer's
///   (the agent's), the run's ([`RunMiddleware`] in the request's
///   extensions) and the built-ins nearest the model;
/// - installs them into the run's [`RunContext`], where the run loop calls
///   them, and nested runs inherit them;
/// - brackets the run: `before_agent` before the service is called, then
///   `on_error` (if it failed) and `after_agent` once, with the result the
///   caller gets, also when the service or a layer between fails.
///
/// See the [module docs](super) for an example.
#[derive(Clone)]
pub struct LifecycleLayer {
    levels: AgentLevels,
    /// The frames of the root runs these levels make, once made.
    roots: Arc<RootFrames>,
}

/// The hooks of a root run of a layer's service that claims no runtime and
/// has no middleware of its own: the same for each such run, so made once
/// (by the layer's own services, and by those of an agent's own
/// middleware, whose built-ins are placed apart).
#[derive(Default)]
struct RootFrames {
    frames: [OnceLock<(Arc<InstalledHooks>, PortSlot)>; 2],
}

impl LifecycleLayer {
    /// A layer running `stack` (the agent's middleware).
    pub fn new(stack: MiddlewareStack) -> Self {
        Self {
            levels: AgentLevels {
                runtime: None,
                agent: stack.compile(),
                builtins: CompiledStack::empty(),
            },
            roots: Arc::default(),
        }
    }

    pub(crate) fn with_runtime(runtime: Arc<CompiledStack>, agent: Arc<CompiledStack>) -> Self {
        Self {
            levels: AgentLevels {
                runtime: Some(runtime),
                agent,
                builtins: CompiledStack::empty(),
            },
            roots: Arc::default(),
        }
    }

    /// Middleware placed nearest the model, inside the run's.
    pub fn builtins(mut self, stack: MiddlewareStack) -> Self {
        self.levels.builtins = stack.compile();
        self.roots = Arc::default();
        self
    }
}

impl fmt::Debug for LifecycleLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LifecycleLayer")
            .field("runtime", &self.levels.runtime)
            .field("agent", &self.levels.agent)
            .field("builtins", &self.levels.builtins)
            .finish()
    }
}

impl<S> Layer<S> for LifecycleLayer {
    type Service = Lifecycle<S>;

    fn layer(&self, inner: S) -> Lifecycle<S> {
        Lifecycle {
            inner,
            layer: Arc::new(self.clone()),
            own: false,
        }
    }
}

/// A run service whose runs are bracketed by lifecycle hooks; made by
/// [`LifecycleLayer`].
#[derive(Clone)]
pub struct Lifecycle<S> {
    inner: S,
    /// Shared: a clone of the service (one a run) is one reference count.
    layer: Arc<LifecycleLayer>,
    /// The agent's own middleware ([`AgentMiddleware`]): its built-ins are
    /// the agent's too, and go with it when the run is handed over.
    own: bool,
}

impl<S> Lifecycle<S> {
    inner_accessors!(inner: S);
}

impl<S: fmt::Debug> fmt::Debug for Lifecycle<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lifecycle")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S> Service<RunRequest> for Lifecycle<S>
where
    S: Service<RunRequest, Response = AgentRun> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = AgentRun;
    type Error = AgentError;
    type Future = LifecycleFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), AgentError>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| AgentError::classify(e.into()))
    }

    fn call(&mut self, mut request: RunRequest) -> Self::Future {
        let run = request.extensions.remove::<RunMiddleware>();
        // No middleware that could ever run, and none the run inherited:
        // nothing to install, nothing to bracket.
        if self.layer.levels.inert()
            && run.as_ref().is_none_or(|r| r.stack.inert())
            && crate::hooks::installed(&request.context).is_none()
        {
            return LifecycleFuture {
                kind: Kind::Inert {
                    fut: self.inner.call(request),
                },
            };
        }
        let ctx = request.context.clone();
        // An outer lifecycle layer on this same run already brackets it:
        // this one adds its middleware inside and brackets only those.
        let nested = ctx.is_bracketed();
        let root = !nested
            && self.layer.levels.runtime.is_none()
            && run.is_none()
            && ctx.depth() == 0
            && crate::hooks::installed(&ctx).is_none();
        let frame = if root {
            let (frame, slot) = self.layer.roots.frames[usize::from(self.own)].get_or_init(|| {
                let frame = Arc::new(InstalledHooks::new(&ctx, self.levels(None, None)));
                let slot = port_slot(frame.clone() as Arc<dyn HookPort>);
                (frame, slot)
            });
            install_slot(&ctx, slot);
            frame.clone()
        } else {
            let runtime = self.layer.levels.claim_runtime(&ctx).cloned();
            let frame = Arc::new(InstalledHooks::new(&ctx, self.levels(runtime, run)));
            install(&ctx, frame.clone() as Arc<dyn HookPort>);
            frame
        };
        let resumed = matches!(request.input, RunInput::Resume { .. });
        let start = RunStart {
            resumed,
            has_history: resumed || !request.history.is_empty(),
        };
        // Take the service that was made ready; leave a clone behind.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        LifecycleFuture {
            kind: Kind::Bracketed {
                fut: ResponseFuture::new(bracket(frame, nested, ctx, start, inner, request)),
            },
        }
    }
}

impl<S> Lifecycle<S> {
    /// The levels of a run with `runtime` claimed and `run`'s middleware.
    fn levels(&self, runtime: Option<Arc<CompiledStack>>, run: Option<RunMiddleware>) -> Levels {
        let empty = CompiledStack::empty();
        let (builtins, agent_builtins) = if self.own {
            (empty.clone(), self.layer.levels.builtins.clone())
        } else {
            (self.layer.levels.builtins.clone(), empty.clone())
        };
        Levels {
            runtime: runtime.unwrap_or_else(|| empty.clone()),
            agent: self.layer.levels.agent.clone(),
            run: run.map_or_else(|| empty.clone(), |r| r.stack),
            builtins,
            agent_builtins,
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`Lifecycle`]: the inner service's own, with
    /// nothing boxed, when no middleware can run in the run; otherwise the
    /// run bracketed by its hooks.
    #[must_use = "futures do nothing unless polled"]
    pub struct LifecycleFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Inert { #[pin] fut: F },
        Bracketed { fut: ResponseFuture<AgentRun, AgentError> },
    }
}

impl<F, E> Future for LifecycleFuture<F>
where
    F: Future<Output = Result<AgentRun, E>>,
    E: Into<BoxError>,
{
    type Output = Result<AgentRun, AgentError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inert { fut } => fut.poll(cx).map_err(|e| AgentError::classify(e.into())),
            KindProj::Bracketed { fut } => Pin::new(fut).poll(cx),
        }
    }
}

impl<F> fmt::Debug for LifecycleFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LifecycleFuture")
    }
}

/// `before_agent`, the run, then `on_error` and `after_agent` exactly once.
async fn bracket<S>(
    frame: Arc<InstalledHooks>,
    nested: bool,
    ctx: RunContext,
    start: RunStart,
    mut inner: S,
    request: RunRequest,
) -> Result<AgentRun, AgentError>
where
    S: Service<RunRequest, Response = AgentRun>,
    S::Error: Into<BoxError>,
{
    let opened = if nested {
        frame.stack.before_agent(&ctx, start).await
    } else {
        frame
            .before_agent(&ctx, start)
            .await
            .map_err(AgentError::classify)
    };
    let result = match opened {
        Ok(context) => {
            ctx.mark_bracketed(context);
            inner
                .call(request)
                .await
                .map_err(|e| AgentError::classify(e.into()))
        }
        Err(err) => Err(err),
    };
    if let Err(err) = &result {
        if nested {
            // Their errors are logged inside, never returned.
            let _ = frame.stack.on_error(&ctx, err).await;
        } else {
            let _ = frame.on_error(&ctx, err).await;
        }
    }
    let outcome = RunOutcome::of(&result);
    if nested {
        let _ = frame.stack.after_agent(&ctx, outcome).await;
    } else {
        let _ = frame.after_agent(&ctx, outcome).await;
    }
    result
}

impl RunBracket for LifecycleLayer {
    fn run(
        self: Arc<Self>,
        request: RunRequest,
        run: BoxAgent,
    ) -> BoxFuture<'static, Result<AgentRun, AgentError>> {
        let service = Lifecycle {
            inner: run,
            layer: self,
            own: true,
        };
        Box::pin(service.oneshot(request))
    }

    fn frame(&self, ctx: &RunContext, outer: Option<Arc<dyn HookPort>>) -> Arc<dyn HookPort> {
        let (agent, agent_builtins) = self.levels.handed(ctx);
        let empty = CompiledStack::empty();
        let levels = Levels {
            runtime: empty.clone(),
            agent,
            run: empty.clone(),
            builtins: empty,
            agent_builtins,
        };
        Arc::new(InstalledHooks::inside(ctx, outer, levels))
    }

    fn then(&self, inner: &AgentMiddleware) -> AgentMiddleware {
        let mut merged = self.clone();
        merged.roots = Arc::default();
        if let Some(inner) = inner.0.as_any().downcast_ref::<LifecycleLayer>() {
            merged.levels.agent =
                CompiledStack::compose(&[&self.levels.agent, &inner.levels.agent]);
            merged.levels.builtins =
                CompiledStack::compose(&[&self.levels.builtins, &inner.levels.builtins]);
        }
        AgentMiddleware(Arc::new(merged))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn levels(&self) -> &dyn std::any::Any {
        &self.levels
    }

    fn fmt_names(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AgentMiddleware")
            .field(&self.levels.agent)
            .finish()
    }
}

impl From<LifecycleLayer> for AgentMiddleware {
    fn from(layer: LifecycleLayer) -> Self {
        AgentMiddleware(Arc::new(layer))
    }
}

impl From<MiddlewareStack> for AgentMiddleware {
    fn from(stack: MiddlewareStack) -> Self {
        LifecycleLayer::new(stack).into()
    }
}

impl<M: Middleware> From<M> for AgentMiddleware {
    fn from(middleware: M) -> Self {
        MiddlewareStack::new().push(middleware).into()
    }
}
