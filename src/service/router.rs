use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::Either;
use rustc_hash::FxBuildHasher;
use tower::util::Oneshot;
use tower::{Service, ServiceExt};

use super::{box_tool, BoxTool, FnTool};
use crate::error::BoxError;
use crate::request::{ToolInvocation, ToolOutput};
use crate::types::ToolSpec;

/// A tool for the [`ToolRouter`]: its spec, how it may be called, and the
/// service that runs it.
#[derive(Clone)]
pub struct ToolDef {
    /// What the model sees.
    pub spec: ToolSpec,
    /// Whether calling it twice is safe (a retry layer may then retry it).
    pub idempotent: bool,
    /// Whether each call needs approval.
    pub requires_approval: bool,
    /// Whether it only reads (changes nothing): a tool policy's rules can
    /// match on it.
    pub read_only: bool,
    /// Whether it may send progress on [`ToolInvocation::stream`]: `true`
    /// for any service, `false` for a [`tool_fn`](crate::tool_fn) tool,
    /// which has no sink to send on. A run builds the sink that runs the
    /// delta hooks (`on_tool_delta`) only when one of its tools may stream.
    pub streams: bool,
    /// The service.
    pub service: BoxTool,
}

impl ToolDef {
    /// A tool from a spec and any tool service.
    pub fn new<S>(spec: ToolSpec, service: S) -> Self
    where
        S: Service<ToolInvocation, Response = ToolOutput> + Clone + Send + Sync + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        Self {
            spec,
            idempotent: false,
            requires_approval: false,
            read_only: false,
            streams: true,
            service: box_tool(service),
        }
    }

    /// What it declares of itself.
    pub fn traits(&self) -> ToolTraits {
        ToolTraits {
            idempotent: self.idempotent,
            requires_approval: self.requires_approval,
            read_only: self.read_only,
        }
    }

    /// Marks it idempotent.
    pub fn idempotent(mut self) -> Self {
        self.idempotent = true;
        self
    }

    /// Marks it as needing approval.
    pub fn requires_approval(mut self) -> Self {
        self.requires_approval = true;
        self
    }

    /// Marks it read-only: it changes nothing.
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// Says whether it may send progress on [`ToolInvocation::stream`].
    pub fn streams(mut self, streams: bool) -> Self {
        self.streams = streams;
        self
    }
}

/// What a tool declares of itself: see [`ToolDef`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolTraits {
    /// Calling it twice is safe.
    pub idempotent: bool,
    /// Each call needs approval.
    pub requires_approval: bool,
    /// It only reads.
    pub read_only: bool,
}

/// The traits of an agent's tools, by name. In a run with hooks, the run's
/// state holds its agent's table, so a middleware can ask what a called tool
/// declares.
///
/// ```
/// use tower_agent::service::{RunTools, ToolTraits};
/// use tower_agent::RunContext;
///
/// let ctx = RunContext::new();
/// assert!(RunTools::of(&ctx).is_none(), "set by the agent, in a run with hooks");
/// let tools = RunTools::from_iter([("read".to_owned(), ToolTraits { read_only: true, ..ToolTraits::default() })]);
/// ctx.insert_state(tools);
/// assert!(RunTools::of(&ctx).unwrap().get("read").unwrap().read_only);
/// ```
///
/// # Clone
///
/// Cheap: the table is shared.
#[derive(Debug, Clone, Default)]
pub struct RunTools(Arc<NameMap<ToolTraits>>);

impl RunTools {
    /// The table in `ctx`'s run state, if any: one inserted there with
    /// [`insert_state`](crate::context::RunContext::insert_state) since the
    /// run began, or else the agent's.
    pub fn of(ctx: &crate::context::RunContext) -> Option<RunTools> {
        ctx.state::<RunTools>().or_else(|| {
            let tools = ctx.run_tools()?.downcast::<NameMap<ToolTraits>>();
            tools.ok().map(RunTools)
        })
    }

    /// Sets this table as the agent's in `ctx`'s run, in place of any in
    /// the run's state: a pointer, not an entry of the state map.
    pub(crate) fn install(&self, ctx: &crate::context::RunContext) {
        if ctx.state_maybe_written() {
            ctx.with_state(|state| state.remove::<RunTools>());
        }
        ctx.set_run_tools(self.0.clone());
    }

    /// The traits of the tool `name`.
    pub fn get(&self, name: &str) -> Option<&ToolTraits> {
        self.0.get(name)
    }

    /// Whether the traits of any tool meet `f`.
    pub(crate) fn any(&self, f: impl Fn(&ToolTraits) -> bool) -> bool {
        self.0.values().any(f)
    }

    /// The number of tools.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it has no tools.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<(String, ToolTraits)> for RunTools {
    fn from_iter<I: IntoIterator<Item = (String, ToolTraits)>>(iter: I) -> Self {
        RunTools(Arc::new(iter.into_iter().collect()))
    }
}

impl fmt::Debug for ToolDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolDef")
            .field("name", &self.spec.name)
            .field("idempotent", &self.idempotent)
            .field("requires_approval", &self.requires_approval)
            .field("read_only", &self.read_only)
            .field("streams", &self.streams)
            .finish_non_exhaustive()
    }
}

impl From<FnTool> for ToolDef {
    fn from(tool: FnTool) -> Self {
        let (spec, idempotent, requires_approval, read_only) = (
            ToolSpec::clone(&tool.spec),
            tool.idempotent,
            tool.requires_approval,
            tool.read_only,
        );
        Self {
            idempotent,
            requires_approval,
            read_only,
            streams: false,
            ..ToolDef::new(spec, tool)
        }
    }
}

/// A table by tool name. Its names are fixed when it is built; a name a
/// model sends only looks one up, so it is hashed the quick way (FxHash)
/// rather than with a DoS-resistant hash (each tool call looks up two such
/// tables).
type NameMap<V> = HashMap<String, V, FxBuildHasher>;

#[derive(Clone)]
struct Entry {
    def: ToolDef,
    validator: Result<Arc<jsonschema::Validator>, String>,
}

impl Entry {
    fn new(def: ToolDef) -> Self {
        let validator = jsonschema::validator_for(&def.spec.parameters)
            .map(Arc::new)
            .map_err(|e| e.to_string());
        Self { def, validator }
    }
}

/// Tools a [`ToolRouter`] looks up when a call names none of its own: a
/// tool set that changes while agents run, such as an MCP server's (see
/// `McpTools`, feature `mcp`). Looked up at each call, so a tool the source
/// gained after the router was built is found.
pub trait ToolSource: Send + Sync + 'static {
    /// The tool called `name`, as the source has it now.
    fn tool(&self, name: &str) -> Option<ToolDef>;

    /// The names of the tools it has now.
    fn names(&self) -> Vec<String>;
}

/// Dispatches [`ToolInvocation`]s by tool name, validating the arguments
/// against the tool's JSON Schema first.
///
/// What the model did wrong becomes a [`ToolOutput::error`] the model reads,
/// never a failed run: arguments that are not JSON, arguments that do not
/// match the schema, an unknown tool. A tool's own error passes through as
/// `Err`, so the run can tell a [`tripwire`](crate::tripwire) from a failure
/// the model should read.
///
/// ```
/// use tower::ServiceExt;
/// use tower_agent::{tool_sync, BoxError, RunContext, ToolInvocation, ToolRouter};
/// use tower_agent::types::ToolCall;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Sum { a: i64, b: i64 }
/// let router = ToolRouter::new().tool(tool_sync("add", "Adds", |s: Sum| Ok::<_, BoxError>(s.a + s.b)));
///
/// let call = ToolCall::new("c1", "add", r#"{"a": 2, "b": "x"}"#);
/// let out = router.oneshot(ToolInvocation::new(call, RunContext::new())).await.unwrap();
/// assert!(out.is_error);
/// assert!(out.content.contains("\"x\" is not of type \"integer\""), "{}", out.content);
/// # }
/// ```
///
/// # Clone
///
/// Cheap: the table is shared.
#[derive(Clone, Default)]
pub struct ToolRouter {
    /// One pointer: a clone (one per tool call) is one reference count.
    table: Arc<Table>,
}

/// What a router's clones share.
#[derive(Clone, Default)]
struct Table {
    tools: NameMap<Entry>,
    specs: Arc<[ToolSpec]>,
    sources: Arc<[Arc<dyn ToolSource>]>,
}

impl ToolRouter {
    /// A router with no tools.
    pub fn new() -> Self {
        Self::default()
    }

    /// Looks up `source` for a call that names none of the router's own
    /// tools (after the sources added before it). Its tools' arguments are
    /// validated as the router's own are; their specs are not in
    /// [`specs`](Self::specs), which stays what the router was built with.
    pub fn source(self, source: impl ToolSource) -> Self {
        let mut table = Arc::unwrap_or_clone(self.table);
        let mut sources = table.sources.to_vec();
        sources.push(Arc::new(source));
        table.sources = sources.into();
        Self {
            table: Arc::new(table),
        }
    }

    /// Adds a tool, replacing one of the same name.
    ///
    /// # Panics
    ///
    /// Never; a tool whose schema does not compile answers every call with
    /// an error naming the schema problem.
    pub fn tool(self, tool: impl Into<ToolDef>) -> Self {
        let def = tool.into();
        let mut table = Arc::unwrap_or_clone(self.table);
        let mut specs: Vec<ToolSpec> = table
            .specs
            .iter()
            .filter(|s| s.name != def.spec.name)
            .cloned()
            .collect();
        specs.push(def.spec.clone());
        table.tools.insert(def.spec.name.clone(), Entry::new(def));
        table.specs = specs.into();
        Self {
            table: Arc::new(table),
        }
    }

    /// The specs of every tool, in the order they were added.
    pub fn specs(&self) -> &Arc<[ToolSpec]> {
        &self.table.specs
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&ToolDef> {
        self.table.tools.get(name).map(|e| &e.def)
    }

    /// The number of tools.
    pub fn len(&self) -> usize {
        self.table.tools.len()
    }

    /// Whether it has no tools.
    pub fn is_empty(&self) -> bool {
        self.table.tools.is_empty()
    }

    /// Whether a tool it routes to may stream its progress: one of its own
    /// that [`streams`](ToolDef::streams), or any a source holds.
    pub(crate) fn may_stream(&self) -> bool {
        !self.table.sources.is_empty() || self.table.tools.values().any(|e| e.def.streams)
    }

    /// Whether a call of the tool `name` may stream its progress: what its
    /// definition says, and `true` for a name a source may answer.
    pub(crate) fn tool_may_stream(&self, name: &str) -> bool {
        match self.table.tools.get(name) {
            Some(entry) => entry.def.streams,
            None => !self.table.sources.is_empty(),
        }
    }

    /// The tool `invocation` goes to, or the router's own answer when it
    /// refuses it (an unknown tool, arguments that miss the schema).
    pub(crate) fn check(&self, invocation: &ToolInvocation) -> Result<BoxTool, ToolOutput> {
        let name = &invocation.call.name;
        let found;
        let entry = match self.table.tools.get(name) {
            Some(entry) => entry,
            None => {
                let Some(def) = self.table.sources.iter().find_map(|s| s.tool(name)) else {
                    return Err(self.unknown(name));
                };
                found = Entry::new(def);
                &found
            }
        };
        // `null` is what arguments that are not JSON parse to: say why.
        if invocation.args.is_null() {
            if let Err(e) =
                serde_json::from_str::<serde::de::IgnoredAny>(&invocation.call.arguments)
            {
                return Err(ToolOutput::error(format!(
                    "the arguments of `{name}` are not valid JSON ({e}); send a JSON object"
                )));
            }
        }
        let validator = entry
            .validator
            .as_ref()
            .map_err(|e| ToolOutput::error(format!("tool `{name}` has an invalid schema: {e}")))?;
        // The quick check first: it allocates nothing, and most calls pass.
        if validator.is_valid(&invocation.args) {
            return Ok(entry.def.service.clone());
        }
        let errors: Vec<String> = validator
            .iter_errors(&invocation.args)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() {
                    e.to_string()
                } else {
                    format!("{path}: {e}")
                }
            })
            .collect();
        if !errors.is_empty() {
            return Err(ToolOutput::error(format!(
                "the arguments of `{name}` do not match its schema: {}",
                errors.join("; ")
            )));
        }
        Ok(entry.def.service.clone())
    }
}

impl ToolRouter {
    fn unknown(&self, name: &str) -> ToolOutput {
        let mut known: Vec<String> = self.table.tools.keys().cloned().collect();
        for source in self.table.sources.iter() {
            known.extend(source.names());
        }
        known.sort_unstable();
        known.dedup();
        ToolOutput::error(format!(
            "unknown tool `{name}`; the tools are: {}",
            known.join(", ")
        ))
    }
}

impl fmt::Debug for ToolRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.table.specs.iter().map(|s| &s.name))
            .finish()
    }
}

impl ToolRouter {
    /// Routes `invocation` through a shared router: what
    /// [`call`](Service::call) does, without a clone of the router. The
    /// tool's service is cloned and driven to readiness in the returned
    /// future, held in it rather than on the heap.
    pub(crate) fn route(&self, invocation: ToolInvocation) -> RouterFuture {
        match self.check(&invocation) {
            Ok(service) => Either::Right(service.oneshot(invocation)),
            Err(output) => Either::Left(futures::future::ready(Ok(output))),
        }
    }
}

/// The future of a [`ToolRouter`] call: an answer the router gave itself
/// (an unknown tool, arguments that miss the schema), or the tool's service
/// driven to readiness and called.
pub type RouterFuture =
    Either<futures::future::Ready<Result<ToolOutput, BoxError>>, Oneshot<BoxTool, ToolInvocation>>;

impl Service<ToolInvocation> for ToolRouter {
    type Response = ToolOutput;
    type Error = BoxError;
    type Future = RouterFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Each tool is driven to readiness in `call`, on its own clone.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, invocation: ToolInvocation) -> Self::Future {
        self.route(invocation)
    }
}
