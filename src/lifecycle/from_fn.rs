//! [`from_fn`]: a wrap middleware from an async closure, as a tower layer
//! or as an entry of a [`MiddlewareStack`](super::MiddlewareStack).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceExt};

use futures::future::BoxFuture;

use super::next::guarded;
use super::wrap::WrapRequest;
use super::{ModelMiddleware, ModelNext, Next, ResponseFuture, ToolMiddleware, ToolNext};
use crate::error::BoxError;
use crate::request::{ModelCall, ToolInvocation, ToolOutput};
use crate::types::ModelResponse;

/// A wrap middleware from an async function of the call and [`Next`], in
/// axum's style, with one meaning at two depths:
///
/// - as a tower [`Layer`] over a model service (`ModelCall`) or a tool
///   service (`ToolInvocation`), it sees the calls of that service only;
/// - pushed onto a [`MiddlewareStack`](super::MiddlewareStack)
///   ([`push_model`](super::MiddlewareStack::push_model),
///   [`push_tool`](super::MiddlewareStack::push_tool)), it is one of the
///   run's wrap hooks: it also sees the calls of nested runs (sub-agents),
///   in its place in the onion.
///
/// `next` is the rest of the stack, made ready: call
/// [`next.run(call)`](Next::run) once to proceed, never to answer yourself,
/// or on clones to call it again. Its invocations are bracketed by
/// `MiddlewareStarted`/`MiddlewareCompleted` events (hook `wrap_model` or
/// `wrap_tool`) named after [`FromFnLayer::name`] (default `from_fn`), and a
/// [`tripwire`](crate::tripwire) it raises carries that name.
///
/// ```
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_agent::lifecycle::{from_fn, ModelNext};
/// use tower_agent::types::{Message, ModelRequest};
/// use tower_agent::{ModelCall, RunContext, ScriptedModel, ScriptedTurn};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let model = ServiceBuilder::new()
///     .layer(from_fn(|mut call: ModelCall, next: ModelNext| async move {
///         call.request.settings_mut().temperature = Some(0.0);
///         let mut response = next.run(call).await?;
///         response.message.set_text(response.message.text().to_uppercase());
///         Ok::<_, tower_agent::BoxError>(response)
///     }).name("shout"))
///     .service(ScriptedModel::new([ScriptedTurn::text("hello")]));
///
/// let call = ModelCall::new(ModelRequest::new("m", vec![Message::user("hi")]), RunContext::new());
/// let response = model.oneshot(call).await.unwrap();
/// assert_eq!(response.message.text(), "HELLO");
/// # }
/// ```
///
/// On a stack:
///
/// ```
/// use tower_agent::lifecycle::{from_fn, MiddlewareStack, ModelNext};
/// use tower_agent::ModelCall;
///
/// let stack = MiddlewareStack::new().push_model(
///     from_fn(|mut call: ModelCall, next: ModelNext| async move {
///         call.request.settings_mut().temperature = Some(0.0);
///         next.run(call).await
///     })
///     .name("deterministic"),
/// );
/// assert_eq!(stack.names().collect::<Vec<_>>(), ["deterministic"]);
/// ```
pub fn from_fn<F>(f: F) -> FromFnLayer<F> {
    FromFnLayer {
        f,
        name: Arc::from("from_fn"),
    }
}

/// A [`Layer`] from an async function; see [`from_fn`].
#[derive(Clone)]
pub struct FromFnLayer<F> {
    f: F,
    name: Arc<str>,
}

impl<F> FromFnLayer<F> {
    /// The name its events and tripwires carry (default `from_fn`).
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = name.into();
        self
    }
}

impl<F> fmt::Debug for FromFnLayer<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FromFnLayer")
            .field("name", &self.name)
            .field("f", &format_args!("{}", std::any::type_name::<F>()))
            .finish()
    }
}

impl<S, F: Clone> Layer<S> for FromFnLayer<F> {
    type Service = FromFn<F, S>;

    fn layer(&self, inner: S) -> FromFn<F, S> {
        FromFn {
            f: self.f.clone(),
            name: self.name.clone(),
            inner,
        }
    }
}

/// A service wrapped by an async function; see [`from_fn`].
#[derive(Clone)]
pub struct FromFn<F, S> {
    f: F,
    name: Arc<str>,
    inner: S,
}

impl<F, S> FromFn<F, S> {
    inner_accessors!(inner: S);
}

impl<F, S: fmt::Debug> fmt::Debug for FromFn<F, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FromFn")
            .field("name", &self.name)
            .field("f", &format_args!("{}", std::any::type_name::<F>()))
            .field("inner", &self.inner)
            .finish()
    }
}

impl<F, Fut, E, S, Req> Service<Req> for FromFn<F, S>
where
    Req: WrapRequest,
    F: Fn(Req, Next<Req>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Req::Response, E>> + Send + 'static,
    E: Into<BoxError>,
    S: Service<Req, Response = Req::Response> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = Req::Response;
    type Error = BoxError;
    type Future = ResponseFuture<Req::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        // Take the service that was made ready; leave a clone behind.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        let next = Next::service(
            BoxCloneSyncService::new(ready.map_err(Into::into)),
            &self.name,
            &req,
        );
        let f = self.f.clone();
        let name = self.name.clone();
        ResponseFuture::new(async move {
            let ctx = req.context().clone();
            guarded(&ctx, &name, Req::wrap_hook(), || {
                let fut = f(req, next);
                async move { fut.await.map_err(Into::into) }
            })
            .await
        })
    }
}

impl<F, Fut, E> ModelMiddleware for FromFnLayer<F>
where
    F: Fn(ModelCall, ModelNext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<ModelResponse, E>> + Send + 'static,
    E: Into<BoxError>,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn wrap_model<'a>(
        &'a self,
        call: ModelCall,
        next: ModelNext,
    ) -> BoxFuture<'a, Result<ModelResponse, BoxError>> {
        let fut = (self.f)(call, next);
        Box::pin(async move { fut.await.map_err(Into::into) })
    }
}

impl<F, Fut, E> ToolMiddleware for FromFnLayer<F>
where
    F: Fn(ToolInvocation, ToolNext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<ToolOutput, E>> + Send + 'static,
    E: Into<BoxError>,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> BoxFuture<'a, Result<ToolOutput, BoxError>> {
        let fut = (self.f)(invocation, next);
        Box::pin(async move { fut.await.map_err(Into::into) })
    }
}
