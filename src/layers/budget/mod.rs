//! Budgets: token and cost limits per run, per thread and per tenant, over a
//! window or in total, reserved before each model call and settled after it.
//!
//! [`BudgetLayer`] sits closest to the backend, so every attempt that
//! reaches a model passes through it: each retry, each model a fallback
//! tries, and the model calls of middleware whose model stack carries the
//! layer (a clone shares the ledger). For each attempt it:
//!
//! 1. **estimates** the call: its input at four characters a token
//!    ([`estimate`]), or counted by a [`TokenCounter`](crate::tokens::TokenCounter)
//!    when the layer has [`token_counter`](BudgetLayer::token_counter)
//!    (incrementally: a turn counts only the messages it added), plus its `max_tokens` (or
//!    [`default_output_tokens`](BudgetLayer::default_output_tokens)), priced
//!    at the model's dearest input and output rates;
//! 2. **reserves** that amount on every budget line the call draws on (its
//!    run's, every enclosing run's, its thread's, its tenant's), all or none,
//!    so concurrent calls cannot overspend together; a line it does not fit
//!    refuses the call with [`AgentError::BudgetExceeded`]
//!    (`BUDGET_EXCEEDED`, a tripwire: it ends the run, also from inside a
//!    nested run), naming the budget, its limit and what was spent;
//! 3. **settles** after the attempt with the real usage (a failed attempt
//!    is charged the usage its provider recorded for it, usually nothing).
//!
//! Money is a [`Cost`] (a decimal) from a [`PriceTable`]; tokens are input
//! plus output. The layer gives the run its price table
//! ([`RunContext::set_prices`](crate::RunContext::set_prices)), so every
//! usage entry of the ledger carries its cost, each priced call emits
//! [`AgentEvent::CostRecorded`](crate::event::AgentEvent::CostRecorded), and
//! [`AgentRun::cost`](crate::types::AgentRun::cost) is the run's total. A
//! model the table does not know is refused, or counted in tokens only
//! ([`UnknownModel`]).
//!
//! # Example
//!
//! ```
//! use tower::ServiceBuilder;
//! use tower_agent::layers::budget::{Budget, BudgetLayer, Tenant};
//! use tower_agent::types::{Decimal, Price, PriceTable};
//! use tower_agent::{Agent, RunContext, RunRequest, ScriptedModel, ScriptedTurn};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_agent::AgentError> {
//! let prices = PriceTable::new().price("gpt-4o", Price::new(Decimal::new(250, 2), Decimal::new(1000, 2)));
//! let budgets = BudgetLayer::new(prices)
//!     .per_run(Budget::new("run").max_tokens(50_000))
//!     .per_tenant(Budget::new("daily").max_cost("5.00".parse().unwrap()).daily());
//! let model = ServiceBuilder::new()
//!     .layer(budgets)
//!     .service(ScriptedModel::new([ScriptedTurn::text("Hello!")]));
//! let agent = Agent::builder("assistant").model(model).model_name("gpt-4o").build()?;
//!
//! let ctx = RunContext::builder().state(Tenant::new("acme")).build();
//! let run = agent.oneshot(RunRequest::new("Hi").context(ctx)).await?;
//! assert!(run.cost.is_some_and(|cost| cost > tower_agent::types::Cost::ZERO));
//! # Ok(()) }
//! ```
//!
//! # Lines
//!
//! - **per run** ([`per_run`](BudgetLayer::per_run)): kept in the run's
//!   context for `run:<id>`; a nested run's calls are held on its own run's
//!   lines and on every enclosing run's, so a sub-agent's spend rolls up and
//!   it is held to what its parent has left. These lines live as long as
//!   the run.
//! - **per thread** and **per tenant** ([`per_thread`](BudgetLayer::per_thread),
//!   [`per_tenant`](BudgetLayer::per_tenant)): kept in the
//!   [`BudgetStore`] for `thread:<id>` and `tenant:<key>`. The tenant is the
//!   [`Tenant`] in the run's state (or an enclosing run's), or what
//!   [`tenant_fn`](BudgetLayer::tenant_fn) says.
//!
//! Lines an enclosing run drew on (also through another budget layer) hold
//! the nested run's calls too.
//!
//! # Why a layer, not a lifecycle hook
//!
//! A `before_model` hook runs once per turn, outside retry and fallback; it
//! would reserve once for attempts it never sees. The layer, innermost, sees
//! each attempt before it goes out and its answer after.
//!
//! # Order
//!
//! Innermost: `retry ▸ fallback ▸ cache ▸ circuit-breaker ▸ rate-limit ▸ pii ▸ budget ─► model`.
//! A cache hit or a refusal further out reserves nothing.
//!
//! [`Cost`]: crate::types::Cost

mod attempt;
#[cfg(test)]
mod tests;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tower::{Layer, Service};

use crate::context::RunContext;
use crate::error::{AgentError, BoxError};
use crate::future::BoxResponseFuture;
use crate::request::ModelCall;
use crate::stores::budget::{BudgetLine, BudgetStore, MemoryBudgetStore, Spend};
use crate::tokens::{request_tokens, TokenCounters};
use crate::types::{Cost, ModelRequest, ModelResponse, PriceTable};

/// The input tokens of `request`, estimated at four bytes of text a token
/// (its messages and its tool definitions), rounded up.
pub fn estimate(request: &ModelRequest) -> u64 {
    let tools: usize = request
        .tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
        .sum();
    (request.messages.text_len() + tools as u64).div_ceil(4)
}

/// One budget: a name, limits, and a window. See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    name: Arc<str>,
    window: Option<Duration>,
    max_cost: Option<Cost>,
    max_tokens: Option<u64>,
}

impl Budget {
    /// A budget named `name`, with no limits yet, over the whole time.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self {
            name: name.into(),
            window: None,
            max_cost: None,
            max_tokens: None,
        }
    }

    /// At most `cost`.
    pub fn max_cost(mut self, cost: Cost) -> Self {
        self.max_cost = Some(cost);
        self
    }

    /// At most `tokens` (input plus output).
    pub fn max_tokens(mut self, tokens: u64) -> Self {
        self.max_tokens = Some(tokens);
        self
    }

    /// Counts over windows of `window` instead of the whole time.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = Some(window);
        self
    }

    /// Counts per day.
    pub fn daily(self) -> Self {
        self.window(Duration::from_secs(24 * 60 * 60))
    }

    /// The budget's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This budget's line for `key` (`tenant:acme`, `thread:t-1`): what a
    /// [`BudgetStore`] keeps.
    pub fn line(&self, key: impl Into<String>) -> BudgetLine {
        BudgetLine {
            budget: self.name.clone(),
            key: key.into(),
            window: self.window,
            max_cost: self.max_cost,
            max_tokens: self.max_tokens,
        }
    }
}

/// What to do with a call to a model the price table does not know.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UnknownModel {
    /// Refuse it (`INVALID_CONFIG`): a cost limit cannot hold it.
    #[default]
    Refuse,
    /// Let it through, counting its tokens and no money.
    CountTokens,
}

/// The tenant a run belongs to, in its state: what per-tenant budgets key
/// on. Nested runs belong to their root's tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenant(pub Arc<str>);

impl Tenant {
    /// The tenant `key`.
    pub fn new(key: impl Into<Arc<str>>) -> Self {
        Self(key.into())
    }
}

type TenantFn = dyn Fn(&ModelCall) -> Option<String> + Send + Sync;

#[derive(Clone)]
struct Config {
    prices: Arc<PriceTable>,
    store: Arc<dyn BudgetStore>,
    run: Vec<Budget>,
    thread: Vec<Budget>,
    tenant: Vec<Budget>,
    unknown: UnknownModel,
    default_output_tokens: u64,
    tenant_fn: Option<Arc<TenantFn>>,
    fail_open: bool,
    counters: Option<TokenCounters>,
}

/// Holds model calls to budgets. See the [module docs](self).
///
/// The layer is its own builder: [`new`](Self::new) prices with a table and
/// keeps its ledger in a fresh [`MemoryBudgetStore`]; each setter returns it
/// changed.
///
/// # Clone
///
/// Clones share the store (and so the thread and tenant lines).
#[derive(Clone)]
pub struct BudgetLayer {
    config: Arc<Config>,
}

impl fmt::Debug for BudgetLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BudgetLayer")
            .field("run", &self.config.run)
            .field("thread", &self.config.thread)
            .field("tenant", &self.config.tenant)
            .field("unknown", &self.config.unknown)
            .field("default_output_tokens", &self.config.default_output_tokens)
            .field("fail_open", &self.config.fail_open)
            .finish_non_exhaustive()
    }
}

impl BudgetLayer {
    /// Prices calls with `prices`, with no budgets yet, a fresh in-memory
    /// store, unknown models refused, 1024 output tokens assumed for a
    /// call without `max_tokens`, and store errors failing the call.
    pub fn new(prices: PriceTable) -> Self {
        Self {
            config: Arc::new(Config {
                prices: Arc::new(prices),
                store: Arc::new(MemoryBudgetStore::new()),
                run: Vec::new(),
                thread: Vec::new(),
                tenant: Vec::new(),
                unknown: UnknownModel::Refuse,
                default_output_tokens: 1024,
                tenant_fn: None,
                fail_open: false,
                counters: None,
            }),
        }
    }

    fn map(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// Keeps thread and tenant lines in `store` (share it across layers
    /// and processes).
    pub fn store(self, store: impl BudgetStore) -> Self {
        self.store_arc(Arc::new(store))
    }

    /// Like [`store`](Self::store), shared.
    pub fn store_arc(self, store: Arc<dyn BudgetStore>) -> Self {
        self.map(|c| c.store = store)
    }

    /// Adds a budget per run (a run and the runs nested in it).
    pub fn per_run(self, budget: Budget) -> Self {
        self.map(|c| c.run.push(budget))
    }

    /// Adds a budget per thread.
    pub fn per_thread(self, budget: Budget) -> Self {
        self.map(|c| c.thread.push(budget))
    }

    /// Adds a budget per tenant.
    pub fn per_tenant(self, budget: Budget) -> Self {
        self.map(|c| c.tenant.push(budget))
    }

    /// What to do with models the price table does not know.
    pub fn unknown_models(self, rule: UnknownModel) -> Self {
        self.map(|c| c.unknown = rule)
    }

    /// The output tokens a call without `max_tokens` reserves (default 1024).
    pub fn default_output_tokens(self, tokens: u64) -> Self {
        self.map(|c| c.default_output_tokens = tokens)
    }

    /// Finds a call's tenant with `f` instead of the [`Tenant`] state.
    pub fn tenant_fn(
        self,
        f: impl Fn(&ModelCall) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.map(|c| c.tenant_fn = Some(Arc::new(f)))
    }

    /// Whether a store error lets the call through unheld (`true`) or fails
    /// it (`false`, the default).
    pub fn fail_open(self, open: bool) -> Self {
        self.map(|c| c.fail_open = open)
    }

    /// Estimates a call's input by counting its tokens with the model's
    /// counter from `counters` (see [`request_tokens`]) instead of four
    /// bytes a token. Counting is incremental per run: a turn counts only
    /// the messages it added.
    ///
    /// ```
    /// use tower_agent::layers::budget::BudgetLayer;
    /// use tower_agent::tokens::TokenCounters;
    /// use tower_agent::types::PriceTable;
    ///
    /// let layer = BudgetLayer::new(PriceTable::new()).token_counter(TokenCounters::openai());
    /// # let _ = layer;
    /// ```
    pub fn token_counter(self, counters: TokenCounters) -> Self {
        self.map(|c| c.counters = Some(counters))
    }
}

impl<S> Layer<S> for BudgetLayer {
    type Service = BudgetService<S>;

    fn layer(&self, inner: S) -> BudgetService<S> {
        BudgetService {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The lines a run draws on, as the first call through a layer found them.
struct Mark {
    owner: usize,
    store_id: usize,
    run: MemoryBudgetStore,
    run_lines: Vec<BudgetLine>,
    store: Arc<dyn BudgetStore>,
    store_lines: Vec<BudgetLine>,
}

/// The marks of one run (one per budget layer that served it), in its state.
#[derive(Clone, Default)]
struct Marks(Arc<Mutex<Vec<Arc<Mark>>>>);

impl Marks {
    fn of(ctx: &RunContext) -> Option<Vec<Arc<Mark>>> {
        ctx.state::<Marks>()
            .map(|m| m.0.lock().unwrap_or_else(PoisonError::into_inner).clone())
    }
}

impl Config {
    fn tenant(&self, call: &ModelCall) -> Option<String> {
        if let Some(f) = &self.tenant_fn {
            return f(call);
        }
        let mut ctx = Some(&call.context);
        while let Some(c) = ctx {
            if let Some(Tenant(key)) = c.state::<Tenant>() {
                return Some(key.to_string());
            }
            ctx = c.parent();
        }
        None
    }

    /// This layer's mark on the call's run, made on its first call.
    fn mark(&self, owner: usize, call: &ModelCall) -> Arc<Mark> {
        let ctx = &call.context;
        let marks = ctx.with_state(|s| s.get_or_insert_with(Marks::default).clone());
        let mut marks = marks.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(mark) = marks.iter().find(|m| m.owner == owner) {
            return mark.clone();
        }
        let run_key = format!("run:{}", ctx.run_id());
        let mut store_lines = Vec::new();
        if let Some(thread) = ctx.thread_id() {
            store_lines.extend(
                self.thread
                    .iter()
                    .map(|b| b.line(format!("thread:{thread}"))),
            );
        }
        if let Some(tenant) = self.tenant(call) {
            store_lines.extend(
                self.tenant
                    .iter()
                    .map(|b| b.line(format!("tenant:{tenant}"))),
            );
        }
        let mark = Arc::new(Mark {
            owner,
            store_id: Arc::as_ptr(&self.store) as *const () as usize,
            run: MemoryBudgetStore::new(),
            run_lines: self.run.iter().map(|b| b.line(run_key.clone())).collect(),
            store: self.store.clone(),
            store_lines,
        });
        marks.push(mark.clone());
        mark
    }

    /// Every group of lines the call draws on: its run's, every enclosing
    /// run's, and the stores' (each line once).
    fn groups(
        &self,
        owner: usize,
        call: &ModelCall,
    ) -> Vec<(Arc<dyn BudgetStore>, Vec<BudgetLine>)> {
        let own = self.mark(owner, call);
        let mut marks = vec![own];
        let mut ctx = Some(&call.context);
        while let Some(c) = ctx {
            for mark in Marks::of(c).unwrap_or_default() {
                if !marks.iter().any(|m| Arc::ptr_eq(m, &mark)) {
                    marks.push(mark);
                }
            }
            ctx = c.parent();
        }
        let mut groups: Vec<(Arc<dyn BudgetStore>, Vec<BudgetLine>)> = Vec::new();
        let mut seen: Vec<(usize, &BudgetLine)> = Vec::new();
        for mark in &marks {
            if !mark.run_lines.is_empty() {
                groups.push((Arc::new(mark.run.clone()), mark.run_lines.clone()));
            }
            let lines: Vec<BudgetLine> = mark
                .store_lines
                .iter()
                .filter(|line| {
                    let fresh = !seen.iter().any(|(s, l)| *s == mark.store_id && l == line);
                    if fresh {
                        seen.push((mark.store_id, line));
                    }
                    fresh
                })
                .cloned()
                .collect();
            if !lines.is_empty() {
                groups.push((mark.store.clone(), lines));
            }
        }
        groups
    }
}

/// Holds each model call to its budgets. See the [module docs](self).
///
/// # Clone
///
/// Clones share the configuration and the store.
#[derive(Clone)]
pub struct BudgetService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> BudgetService<S> {
    inner_accessors!(inner: S);
}

impl<S: fmt::Debug> fmt::Debug for BudgetService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BudgetService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> Service<ModelCall> for BudgetService<S>
where
    S: Service<ModelCall, Response = ModelResponse> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, call: ModelCall) -> ResponseFuture {
        let config = self.config.clone();
        call.context.set_prices(&config.prices);
        let price = config.prices.get(&call.request.model).cloned();
        if price.is_none() && config.unknown == UnknownModel::Refuse {
            let err = AgentError::Config(format!(
                "the budget has no price for model `{}`",
                call.request.model
            ));
            return ResponseFuture(BoxResponseFuture::new(async move { Err(err.into()) }));
        }
        let input = match &config.counters {
            Some(counters) => request_tokens(&call.context, counters, &call.request),
            None => estimate(&call.request),
        };
        let output = call
            .request
            .settings
            .max_tokens
            .map_or(config.default_output_tokens, u64::from);
        let cost = price
            .as_ref()
            .map_or(Cost::ZERO, |p| p.ceiling(input, output));
        let estimate = Spend::new(cost, input + output);
        let groups = config.groups(Arc::as_ptr(&config) as usize, &call);
        // The inner service was made ready by `poll_ready`: take it into the
        // future, which calls it once the reservation holds.
        let inner = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, inner);
        ResponseFuture(BoxResponseFuture::new(attempt::attempt(
            config, groups, estimate, price, inner, call,
        )))
    }
}

/// The response future of [`BudgetService`]: reserve, call, settle.
pub struct ResponseFuture(BoxResponseFuture<ModelResponse>);

impl Future for ResponseFuture {
    type Output = Result<ModelResponse, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}
