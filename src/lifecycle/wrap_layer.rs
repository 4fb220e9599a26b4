//! [`WrapModelLayer`] and [`WrapToolLayer`]: a wrap-only middleware as a
//! tower layer over any model or tool service.

use std::fmt;
use std::sync::Arc;

use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};

use super::next::guarded;
use super::wrap::WrapRequest;
use super::{ModelMiddleware, ModelNext, Next, ToolMiddleware, ToolNext};
use crate::error::BoxError;
use crate::request::{ModelCall, ToolInvocation};

/// A [`ModelMiddleware`] as a tower [`Layer`](tower::Layer) over any model
/// service.
///
/// ```
/// use futures::future::BoxFuture;
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_agent::lifecycle::{ModelMiddleware, ModelNext, WrapModelLayer};
/// use tower_agent::types::{Message, ModelRequest, ModelResponse};
/// use tower_agent::{BoxError, ModelCall, RunContext, ScriptedModel, ScriptedTurn};
///
/// /// Answers greetings itself: the model is never called.
/// struct Greeter;
///
/// impl ModelMiddleware for Greeter {
///     fn name(&self) -> &str {
///         "greeter"
///     }
///
///     fn wrap_model<'a>(&'a self, call: ModelCall, next: ModelNext) -> BoxFuture<'a, Result<ModelResponse, BoxError>> {
///         if call.request.messages.last().is_some_and(|m| m.text() == "hi") {
///             let mut response = ModelResponse::new("greeter", Message::assistant("Hello!"));
///             response.usage_recorded = true; // nothing reached a backend
///             return Box::pin(async move { Ok(response) });
///         }
///         Box::pin(next.run(call))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let model = ServiceBuilder::new()
///     .layer(WrapModelLayer::new(Greeter))
///     .service(ScriptedModel::new([ScriptedTurn::text("from the model")]));
/// let call = ModelCall::new(ModelRequest::new("m", vec![Message::user("hi")]), RunContext::new());
/// let response = model.oneshot(call).await.unwrap();
/// assert_eq!(response.message.text(), "Hello!");
/// # }
/// ```
#[derive(Clone)]
pub struct WrapModelLayer {
    name: Arc<str>,
    middleware: Arc<dyn ModelMiddleware>,
}

impl WrapModelLayer {
    /// A layer running `middleware` around the service it wraps.
    pub fn new(middleware: impl ModelMiddleware) -> Self {
        let middleware: Arc<dyn ModelMiddleware> = Arc::new(middleware);
        Self {
            name: Arc::from(middleware.name()),
            middleware,
        }
    }
}

impl fmt::Debug for WrapModelLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WrapModelLayer")
            .field("name", &self.name)
            .finish()
    }
}

/// A [`ToolMiddleware`] as a tower [`Layer`](tower::Layer) over any tool
/// service.
#[derive(Clone)]
pub struct WrapToolLayer {
    name: Arc<str>,
    middleware: Arc<dyn ToolMiddleware>,
}

impl WrapToolLayer {
    /// A layer running `middleware` around the service it wraps.
    pub fn new(middleware: impl ToolMiddleware) -> Self {
        let middleware: Arc<dyn ToolMiddleware> = Arc::new(middleware);
        Self {
            name: Arc::from(middleware.name()),
            middleware,
        }
    }
}

impl fmt::Debug for WrapToolLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WrapToolLayer")
            .field("name", &self.name)
            .finish()
    }
}

macro_rules! wrap_service {
    ($layer:ident, $service:ident, $middleware_trait:ident, $req:ty, $next:ty, $method:ident, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone)]
        pub struct $service<S> {
            inner: S,
            name: Arc<str>,
            middleware: Arc<dyn $middleware_trait>,
        }

        impl<S> $service<S> {
            inner_accessors!(inner: S);
        }

        impl<S> fmt::Debug for $service<S> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($service))
                    .field("name", &self.name)
                    .finish_non_exhaustive()
            }
        }

        impl<S> tower::Layer<S> for $layer {
            type Service = $service<S>;

            fn layer(&self, inner: S) -> $service<S> {
                $service {
                    inner,
                    name: self.name.clone(),
                    middleware: self.middleware.clone(),
                }
            }
        }

        impl<S> Service<$req> for $service<S>
        where
            S: Service<$req, Response = <$req as WrapRequest>::Response>
                + Clone
                + Send
                + Sync
                + 'static,
            S::Error: Into<BoxError>,
            S::Future: Send + 'static,
        {
            type Response = <$req as WrapRequest>::Response;
            type Error = BoxError;
            type Future = super::ResponseFuture<Self::Response>;

            fn poll_ready(
                &mut self,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), BoxError>> {
                self.inner.poll_ready(cx).map_err(Into::into)
            }

            fn call(&mut self, req: $req) -> Self::Future {
                // Take the service that was made ready; leave a clone behind.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                let next: $next = Next::service(
                    BoxCloneSyncService::new(ready.map_err(Into::into)),
                    &self.name,
                    &req,
                );
                let name = self.name.clone();
                let middleware = self.middleware.clone();
                super::ResponseFuture::new(async move {
                    let ctx = req.context().clone();
                    guarded(
                        &ctx,
                        &name,
                        <$req as super::wrap::sealed::Plumbing>::wrap_hook(),
                        || middleware.$method(req, next),
                    )
                    .await
                })
            }
        }
    };
}

wrap_service!(
    WrapModelLayer,
    WrapModel,
    ModelMiddleware,
    ModelCall,
    ModelNext,
    wrap_model,
    "A model service wrapped in a [`ModelMiddleware`]; made by [`WrapModelLayer`]."
);
wrap_service!(
    WrapToolLayer,
    WrapTool,
    ToolMiddleware,
    ToolInvocation,
    ToolNext,
    wrap_tool,
    "A tool service wrapped in a [`ToolMiddleware`]; made by [`WrapToolLayer`]."
);
