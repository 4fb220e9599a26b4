use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{BoxFuture, Either};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tower::Service;

use crate::context::RunContext;
use crate::error::BoxError;
use crate::request::{ToolInvocation, ToolOutput};
use crate::types::ToolSpec;

type AsyncHandler =
    dyn Fn(Value, RunContext) -> BoxFuture<'static, Result<ToolOutput, BoxError>> + Send + Sync;
type SyncHandler = dyn Fn(Value, RunContext) -> Result<ToolOutput, BoxError> + Send + Sync;

#[derive(Clone)]
enum Handler {
    Async(Arc<AsyncHandler>),
    Sync { f: Arc<SyncHandler>, blocking: bool },
}

/// A tool made from a function with typed arguments: see [`tool_fn`].
///
/// Its arguments' JSON Schema comes from `schemars`; the
/// [`ToolRouter`](crate::ToolRouter) validates the model's arguments against
/// it before the function runs, and the model reads any mismatch.
///
/// # Clone
///
/// Cheap: the function is shared.
#[derive(Clone)]
pub struct FnTool {
    pub(crate) spec: Arc<ToolSpec>,
    pub(crate) idempotent: bool,
    pub(crate) requires_approval: bool,
    pub(crate) read_only: bool,
    handler: Handler,
}

impl fmt::Debug for FnTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnTool")
            .field("name", &self.spec.name)
            .field("idempotent", &self.idempotent)
            .field("requires_approval", &self.requires_approval)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

/// The JSON Schema of `A`, as an object schema for a tool's parameters.
pub(crate) fn parameters_schema<A: JsonSchema>() -> Value {
    let mut schema = schemars::schema_for!(A);
    schema.remove("$schema");
    schema.remove("title");
    let mut value = schema.to_value();
    if let Value::Object(map) = &mut value {
        map.entry("type").or_insert_with(|| "object".into());
        map.entry("properties")
            .or_insert_with(|| Value::Object(Default::default()));
    }
    value
}

fn into_output<R: Serialize>(value: R) -> Result<ToolOutput, BoxError> {
    Ok(match serde_json::to_value(value)? {
        Value::String(text) => ToolOutput::text(text),
        other => ToolOutput::text(other.to_string()),
    })
}

fn parse_args<A: DeserializeOwned>(name: &str, args: Value) -> Result<A, ToolOutput> {
    serde_json::from_value(args)
        .map_err(|e| ToolOutput::error(format!("invalid arguments for `{name}`: {e}")))
}

impl FnTool {
    fn with_handler<A: JsonSchema>(name: String, description: String, handler: Handler) -> Self {
        Self {
            spec: Arc::new(ToolSpec::new(name, description, parameters_schema::<A>())),
            idempotent: false,
            requires_approval: false,
            read_only: false,
            handler,
        }
    }

    /// Marks the tool idempotent: a retry layer may call it again.
    pub fn idempotent(mut self) -> Self {
        self.idempotent = true;
        self
    }

    /// Marks the tool as needing approval before each call.
    pub fn requires_approval(mut self) -> Self {
        self.requires_approval = true;
        self
    }

    /// Marks the tool read-only: it changes nothing. A tool policy's rules
    /// can match on it.
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// For a [`tool_sync`] function that blocks (file or network I/O, heavy
    /// work): run it with `tokio::task::spawn_blocking` instead of inline.
    pub fn blocking(mut self) -> Self {
        if let Handler::Sync { blocking, .. } = &mut self.handler {
            *blocking = true;
        }
        self
    }

    /// The tool's spec.
    pub fn spec(&self) -> &ToolSpec {
        &self.spec
    }
}

/// A tool from an async function of typed arguments.
///
/// The function's error becomes a tool message the model reads, except a
/// [`tripwire`](crate::tripwire), which ends the run.
///
/// ```
/// use schemars::JsonSchema;
/// use serde::Deserialize;
/// use tower_agent::{tool_fn, BoxError};
///
/// #[derive(Deserialize, JsonSchema)]
/// struct Order {
///     /// The order's id.
///     id: String,
/// }
///
/// let status = tool_fn("order_status", "Where an order is", |order: Order| async move {
///     Ok::<_, BoxError>(format!("order {} shipped", order.id))
/// });
/// assert_eq!(status.spec().parameters["required"][0], "id");
/// ```
pub fn tool_fn<A, F, Fut, R, E>(
    name: impl Into<String>,
    description: impl Into<String>,
    f: F,
) -> FnTool
where
    A: DeserializeOwned + JsonSchema + Send + 'static,
    F: Fn(A) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, E>> + Send + 'static,
    R: Serialize,
    E: Into<BoxError>,
{
    tool_fn_ctx(name, description, move |args: A, _ctx| f(args))
}

/// Like [`tool_fn`], for a function that also takes the run's
/// [`RunContext`] (to read state, add context or stop the run).
pub fn tool_fn_ctx<A, F, Fut, R, E>(
    name: impl Into<String>,
    description: impl Into<String>,
    f: F,
) -> FnTool
where
    A: DeserializeOwned + JsonSchema + Send + 'static,
    F: Fn(A, RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, E>> + Send + 'static,
    R: Serialize,
    E: Into<BoxError>,
{
    let name = name.into();
    let tool_name = name.clone();
    let handler = Handler::Async(Arc::new(move |args: Value, ctx: RunContext| {
        let parsed = parse_args::<A>(&tool_name, args);
        let fut = parsed.map(|args| f(args, ctx));
        Box::pin(async move {
            match fut {
                Ok(fut) => fut.await.map_err(Into::into).and_then(into_output),
                Err(output) => Ok(output),
            }
        })
    }));
    FnTool::with_handler::<A>(name, description.into(), handler)
}

/// A tool from a synchronous function. It runs inline on the run's task,
/// unless marked [`blocking`](FnTool::blocking).
///
/// ```
/// use schemars::JsonSchema;
/// use serde::Deserialize;
/// use tower_agent::{tool_sync, BoxError};
///
/// #[derive(Deserialize, JsonSchema)]
/// struct Sum { a: i64, b: i64 }
///
/// let add = tool_sync("add", "Adds two numbers", |s: Sum| Ok::<_, BoxError>(s.a + s.b));
/// # let _ = add;
/// ```
pub fn tool_sync<A, F, R, E>(
    name: impl Into<String>,
    description: impl Into<String>,
    f: F,
) -> FnTool
where
    A: DeserializeOwned + JsonSchema + Send + 'static,
    F: Fn(A) -> Result<R, E> + Send + Sync + 'static,
    R: Serialize,
    E: Into<BoxError>,
{
    let name = name.into();
    let tool_name = name.clone();
    let handler = Handler::Sync {
        f: Arc::new(
            move |args: Value, _ctx| match parse_args::<A>(&tool_name, args) {
                Ok(args) => f(args).map_err(Into::into).and_then(into_output),
                Err(output) => Ok(output),
            },
        ),
        blocking: false,
    };
    FnTool::with_handler::<A>(name, description.into(), handler)
}

impl Service<ToolInvocation> for FnTool {
    type Response = ToolOutput;
    type Error = BoxError;
    /// An inline function's answer, ready at once; an async or blocking
    /// one's future, on the heap.
    type Future = Either<
        futures::future::Ready<Result<ToolOutput, BoxError>>,
        BoxFuture<'static, Result<ToolOutput, BoxError>>,
    >;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, invocation: ToolInvocation) -> Self::Future {
        let ToolInvocation { args, context, .. } = invocation;
        match &self.handler {
            Handler::Async(f) => Either::Right(f(args, context)),
            Handler::Sync { f, blocking: false } => {
                Either::Left(futures::future::ready(f(args, context)))
            }
            Handler::Sync { f, blocking: true } => {
                let f = f.clone();
                Either::Right(Box::pin(async move {
                    match tokio::task::spawn_blocking(move || f(args, context)).await {
                        Ok(result) => result,
                        // The panic goes on in the caller, as an inline
                        // tool's would: the run turns it into a result.
                        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                        Err(e) => Err(Box::new(e) as BoxError),
                    }
                }))
            }
        }
    }
}
