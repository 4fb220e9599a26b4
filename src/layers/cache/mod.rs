//! A response cache for model calls: an identical request is answered from
//! the cache, without the model.
//!
//! The key ([`CacheKey`]) is a 128-bit XXH3 hash of the request's model
//! name, messages, tools and settings. The messages enter through
//! [`History::digest`](crate::types::History::digest), an incremental prefix
//! chain, so a turn's key costs O(new messages), not O(history); the tool
//! list's digest is remembered while the agent keeps sending the same list.
//! Responses live in a [`CacheStore`]: [`MemoryStore`] (bounded entries, a
//! time to live each, CLOCK eviction) by default, or a store of yours.
//!
//! ```
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_agent::event::{AgentEvent, CollectingSink};
//! use tower_agent::layers::cache::CacheLayer;
//! use tower_agent::types::{Message, ModelRequest};
//! use tower_agent::{ModelCall, RunContext, ScriptedModel, ScriptedTurn};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::BoxError> {
//! let model = ScriptedModel::new([ScriptedTurn::text("Paris.")]);
//! let mut cached = ServiceBuilder::new()
//!     .layer(CacheLayer::new())
//!     .service(model.clone());
//!
//! let events = CollectingSink::new();
//! let ctx = RunContext::builder().events(events.clone()).build();
//! let request = ModelRequest::new("m", vec![Message::user("Capital of France?")]);
//!
//! let first = cached.ready().await?.call(ModelCall::new(request.clone(), ctx.clone())).await?;
//! let second = cached.ready().await?.call(ModelCall::new(request, ctx.clone())).await?;
//! assert_eq!(second.message, first.message);
//! assert!(second.usage.is_zero()); // a hit costs nothing…
//! assert_eq!(ctx.usage(), first.usage); // …and records nothing
//! assert_eq!(model.requests().len(), 1); // the model was asked once
//! assert!(events.events().iter().any(|e| matches!(e, AgentEvent::CacheHit { .. })));
//! # Ok(()) }
//! ```
//!
//! # What a hit returns
//!
//! The stored response — message, finish reason, and the model that answered
//! it (after any fallback) — with `usage` set to zero and
//! [`usage_recorded`](crate::types::ModelResponse::usage_recorded) set, so
//! the run records nothing and `ModelCallCompleted` reports zero: `usage`
//! always says what *this* call cost. The store keeps the usage the model
//! reported when the entry was made. A hit emits
//! [`AgentEvent::CacheHit`]. In a streamed
//! call (`call.stream` is set) a hit reaches the sink in one piece: one
//! [`ModelDelta::Text`] with the whole text, then one
//! [`ModelDelta::ToolCall`] per tool call, complete.
//!
//! # What is cached
//!
//! Every successful response of a cacheable request, for the layer's time to
//! live (default one hour). Errors are never cached.
//!
//! A request with `settings.temperature > 0` asks for sampling, and is passed
//! through uncached unless the layer is told
//! [`cache_nondeterministic(true)`](CacheLayer::cache_nondeterministic). A
//! request with no temperature (the provider's default) is cached: set one
//! above zero on the agent to keep its calls out of the cache.
//!
//! A response that calls tools is cached like any other. A hit replays the
//! same calls, with the same call ids; the tools themselves run again (only
//! model calls are cached), and their results enter the next request's key,
//! so a tool that answers differently leads the next turn to a miss.
//!
//! Identical requests that miss at the same time each call the model (no
//! request coalescing); the last response stored wins. A miss stores the
//! response before returning it.
//!
//! # Errors
//!
//! The layer adds no failure of its own: the inner service's error passes
//! through. It is fail-open: a store that fails to `get` is a miss, and one
//! that fails to `put` is logged with `tracing` (`warn`).
//!
//! # Order
//!
//! Inside retry, timeout and fallback, outside rate limit and PII masking:
//! a hit spends no rate-limit capacity, and the key is computed on the
//! unmasked request (the response stored is the one the user would see).

pub use crate::stores::cache::{CacheKey, CacheStore, MemoryStore};

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tower::{Layer, Service};

use crate::context::RunContext;
use crate::error::BoxError;
use crate::event::AgentEvent;
use crate::request::ModelCall;
use crate::stores::cache::Keyer;
use crate::stores::report_failure;
use crate::types::{ModelDelta, ModelRequest, ModelResponse, Usage};

/// Applies [`Cache`] to a model service. See the [module docs](self).
///
/// # Clone
///
/// Clones share the store: every service built by this layer or its clones
/// reads and fills the same cache.
#[derive(Clone)]
pub struct CacheLayer {
    /// Made on first use when no store was given: a layer that is given
    /// one never builds the default.
    store: Arc<OnceLock<Store>>,
    ttl: Duration,
    nondeterministic: bool,
}

impl CacheLayer {
    /// A cache of at most 10,000 responses in a [`MemoryStore`], each kept an
    /// hour; requests with a temperature above zero are not cached.
    pub fn new() -> Self {
        Self {
            store: Arc::default(),
            ttl: Duration::from_secs(3600),
            nondeterministic: false,
        }
    }

    /// Keeps responses in `store` instead of the default [`MemoryStore`]
    /// (e.g. a bigger one, or one shared across processes).
    pub fn store(mut self, store: impl CacheStore) -> Self {
        let memory = in_memory(&store);
        let store: Arc<dyn CacheStore> = Arc::new(store);
        self.store = Arc::new(OnceLock::from(Store { store, memory }));
        self
    }

    /// How long a response is kept (default one hour).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Whether requests with a temperature above zero are cached too
    /// (default `false`).
    pub fn cache_nondeterministic(mut self, cache: bool) -> Self {
        self.nondeterministic = cache;
        self
    }

    fn store_handle(&self) -> Store {
        self.store
            .get_or_init(|| {
                let memory = MemoryStore::default();
                Store {
                    store: Arc::new(memory.clone()),
                    memory: Some(memory),
                }
            })
            .clone()
    }
}

impl Default for CacheLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for CacheLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheLayer")
            .field("ttl", &self.ttl)
            .field("cache_nondeterministic", &self.nondeterministic)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for CacheLayer {
    type Service = Cache<S>;

    fn layer(&self, inner: S) -> Cache<S> {
        let Store { store, memory } = self.store_handle();
        Cache {
            inner,
            shared: Arc::new(Shared {
                store,
                memory,
                ttl: self.ttl,
                nondeterministic: self.nondeterministic,
                keyer: Keyer::default(),
            }),
        }
    }
}

/// The layer's store, and the same store as a [`MemoryStore`] when it is
/// one.
#[derive(Clone)]
struct Store {
    store: Arc<dyn CacheStore>,
    memory: Option<MemoryStore>,
}

/// `store` as a [`MemoryStore`], when it is one (or an `Arc` of one).
fn in_memory<T: CacheStore>(store: &T) -> Option<MemoryStore> {
    let store: &dyn std::any::Any = store;
    store
        .downcast_ref::<MemoryStore>()
        .or_else(|| store.downcast_ref::<Arc<MemoryStore>>().map(|arc| &**arc))
        .cloned()
}

struct Shared {
    store: Arc<dyn CacheStore>,
    /// `store` when it is in memory: a miss stores its answer there at once
    /// and cannot fail, so its future keeps nothing of the run to report a
    /// failure with.
    memory: Option<MemoryStore>,
    ttl: Duration,
    nondeterministic: bool,
    keyer: Keyer,
}

impl Shared {
    fn cacheable(&self, request: &ModelRequest) -> bool {
        self.nondeterministic || !request.settings.temperature.is_some_and(|t| t > 0.0)
    }
}

/// Answers identical model calls from a cache. See the [module docs](self).
///
/// # Clone
///
/// Clones share the cache; a clone starts without the inner service's
/// readiness (it is cloned, and made ready before it is called).
pub struct Cache<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Cache<S> {
    /// Wraps `inner` in a cache with [`CacheLayer::new`]'s defaults.
    pub fn new(inner: S) -> Self {
        CacheLayer::new().layer(inner)
    }

    inner_accessors!(inner: S);
}

impl<S: Clone> Clone for Cache<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Cache<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("inner", &self.inner)
            .field("ttl", &self.shared.ttl)
            .field("cache_nondeterministic", &self.shared.nondeterministic)
            .finish_non_exhaustive()
    }
}

impl<S> Service<ModelCall> for Cache<S>
where
    S: Service<ModelCall, Response = ModelResponse> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = ModelResponse;
    type Error = S::Error;
    type Future = future::ResponseFuture<S::Future, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ModelCall) -> Self::Future {
        if !self.shared.cacheable(&call.request) {
            return future::ResponseFuture::direct(self.inner.call(call));
        }
        let key = self.shared.keyer.key(&call.request);
        if let Some(memory) = &self.shared.memory {
            // In memory: asked at once, and the answer stored at once.
            if let Some(response) = memory.lookup(key) {
                return future::ResponseFuture::hit(hit(response, &call));
            }
            let shared = self.shared.clone();
            return future::ResponseFuture::miss(self.inner.call(call), key, shared, None);
        }
        if let Some(found) = self.shared.store.get_now(key) {
            // A store that answers at once: no boxed lookup.
            match found {
                Ok(Some(response)) => return future::ResponseFuture::hit(hit(response, &call)),
                Ok(None) => {}
                Err(err) => report_failure(&call.context, "cache", "get", &err, true),
            }
            let shared = self.shared.clone();
            let ctx = Some(call.context.clone());
            return future::ResponseFuture::miss(self.inner.call(call), key, shared, ctx);
        }
        // The ready service goes into the future; a clone stays here.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        future::ResponseFuture::lookup(Box::pin(lookup(shared, key, inner, call)))
    }
}

async fn lookup<S>(
    shared: Arc<Shared>,
    key: CacheKey,
    mut inner: S,
    call: ModelCall,
) -> Result<ModelResponse, S::Error>
where
    S: Service<ModelCall, Response = ModelResponse>,
{
    match shared.store.get(key).await {
        Ok(Some(response)) => return Ok(hit(response, &call)),
        Ok(None) => {}
        Err(err) => report_failure(&call.context, "cache", "get", &err, true),
    }
    let ctx = call.context.clone();
    let response = inner.call(call).await?;
    store(&shared, &ctx, key, &response).await;
    Ok(response)
}

/// Stores the answer of a miss; a failure is logged, not returned.
async fn store(shared: &Shared, ctx: &RunContext, key: CacheKey, response: &ModelResponse) {
    let stored = match shared.store.put_now(key, response, shared.ttl) {
        Some(stored) => stored,
        None => shared.store.put(key, response.clone(), shared.ttl).await,
    };
    report_put(ctx, stored);
}

/// The cache is fail-open: a failed put is reported, and the answer returned.
fn report_put(ctx: &RunContext, stored: Result<(), BoxError>) {
    if let Err(err) = stored {
        report_failure(ctx, "cache", "put", &err, true);
    }
}

/// Turns a stored response into the answer of `call`.
fn hit(mut response: ModelResponse, call: &ModelCall) -> ModelResponse {
    response.usage = Usage::default();
    response.usage_recorded = true;
    if let Some(sink) = &call.stream {
        let text = response.message.text();
        if !text.is_empty() {
            sink.send(&ModelDelta::text(text));
        }
        for (index, tool_call) in response.message.tool_calls.iter().enumerate() {
            sink.send(&ModelDelta::ToolCall {
                index,
                id: Some(tool_call.id.clone()),
                name: Some(tool_call.name.clone()),
                arguments: tool_call.arguments.clone(),
            });
        }
    }
    let ctx = &call.context;
    ctx.emit(|| AgentEvent::CacheHit {
        run_id: ctx.run_id().clone(),
        model: call.request.model.clone(),
    });
    response
}

pub mod future {
    //! The [`Cache`](super::Cache) service's future.

    use std::fmt;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{ready, Context, Poll};

    use futures::future::BoxFuture;
    use pin_project_lite::pin_project;

    use super::{CacheKey, Shared};
    use crate::context::RunContext;
    use crate::types::ModelResponse;

    pin_project! {
        /// The future of [`Cache`](super::Cache): the inner call of a request
        /// that is not cached; with a store that answers at once, a hit, or
        /// the inner call of a miss followed by storing its answer; with a
        /// store that waits, a boxed lookup followed by the inner call on a
        /// miss.
        pub struct ResponseFuture<F, E> {
            #[pin]
            kind: Kind<F, E>,
        }
    }

    pin_project! {
        #[project = KindProj]
        enum Kind<F, E> {
            Direct { #[pin] fut: F },
            Hit { response: Option<ModelResponse> },
            Miss {
                #[pin]
                fut: F,
                key: CacheKey,
                shared: Arc<Shared>,
                // `None` when the store is in memory: nothing to report.
                ctx: Option<RunContext>,
            },
            Storing {
                store: BoxFuture<'static, ()>,
                response: Option<ModelResponse>,
            },
            Lookup { fut: BoxFuture<'static, Result<ModelResponse, E>> },
        }
    }

    impl<F, E> ResponseFuture<F, E> {
        // Inlined: the inner future is built in place, not moved.
        #[inline(always)]
        pub(super) fn direct(fut: F) -> Self {
            Self {
                kind: Kind::Direct { fut },
            }
        }

        pub(super) fn hit(response: ModelResponse) -> Self {
            Self {
                kind: Kind::Hit {
                    response: Some(response),
                },
            }
        }

        // Inlined: the inner future is built in place, not moved.
        #[inline(always)]
        pub(super) fn miss(
            fut: F,
            key: CacheKey,
            shared: Arc<Shared>,
            ctx: Option<RunContext>,
        ) -> Self {
            Self {
                kind: Kind::Miss {
                    fut,
                    key,
                    shared,
                    ctx,
                },
            }
        }

        pub(super) fn lookup(fut: BoxFuture<'static, Result<ModelResponse, E>>) -> Self {
            Self {
                kind: Kind::Lookup { fut },
            }
        }
    }

    impl<F, E> Future for ResponseFuture<F, E>
    where
        F: Future<Output = Result<ModelResponse, E>>,
    {
        type Output = Result<ModelResponse, E>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let mut kind = self.project().kind;
            loop {
                match kind.as_mut().project() {
                    KindProj::Direct { fut } => return fut.poll(cx),
                    KindProj::Hit { response } => {
                        return Poll::Ready(Ok(response
                            .take()
                            .expect("ResponseFuture polled after completion")))
                    }
                    KindProj::Miss {
                        fut,
                        key,
                        shared,
                        ctx,
                    } => {
                        // The inner poll is returned as it came: the response
                        // is stored from a borrow, and never moved here.
                        let poll = fut.poll(cx);
                        let Poll::Ready(Ok(response)) = &poll else {
                            return poll;
                        };
                        let Some(ctx) = ctx else {
                            // In memory: stored at once, and it cannot fail.
                            if let Some(memory) = &shared.memory {
                                memory.store(*key, response, shared.ttl);
                            }
                            return poll;
                        };
                        if let Some(stored) = shared.store.put_now(*key, response, shared.ttl) {
                            super::report_put(ctx, stored);
                            return poll;
                        }
                        // The store waits: store from a boxed future.
                        let (shared, key, ctx) = (shared.clone(), *key, ctx.clone());
                        let Poll::Ready(Ok(response)) = poll else {
                            return poll;
                        };
                        let copy = response.clone();
                        let store = Box::pin(async move {
                            super::report_put(&ctx, shared.store.put(key, copy, shared.ttl).await);
                        });
                        kind.set(Kind::Storing {
                            store,
                            response: Some(response),
                        });
                    }
                    KindProj::Storing { store, response } => {
                        ready!(store.as_mut().poll(cx));
                        return Poll::Ready(Ok(response
                            .take()
                            .expect("ResponseFuture polled after completion")));
                    }
                    KindProj::Lookup { fut } => return fut.as_mut().poll(cx),
                }
            }
        }
    }

    impl<F, E> fmt::Debug for ResponseFuture<F, E> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let kind = match &self.kind {
                Kind::Direct { .. } => "Direct",
                Kind::Hit { .. } => "Hit",
                Kind::Miss { .. } => "Miss",
                Kind::Storing { .. } => "Storing",
                Kind::Lookup { .. } => "Lookup",
            };
            f.debug_struct("ResponseFuture")
                .field("kind", &kind)
                .finish()
        }
    }
}
