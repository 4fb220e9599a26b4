//! N workers sharing one quota and one budget on Redis, printing each
//! worker's admissions per second.
//!
//! Each worker has a connection of its own, as a separate process would,
//! and calls the scripted model as fast as it is let through: the rate
//! limit (10 requests a second, on `RedisQuotaStore`) and a budget of one
//! dollar at a cent a call (on `RedisBudgetStore`) are shared by all.
//!
//! ```sh
//! redis-server --port 6379 --save '' &
//! TOWER_AGENT_REDIS_URL=redis://127.0.0.1:6379/ cargo run --example workers --features redis -- 4
//! ```

use std::time::{Duration, Instant};

use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent::error::kind_of;
use tower_agent::layers::rate_limit::ModelRateLimitLayer;
use tower_agent::stores::budget::{BudgetLine, BudgetStore, Spend};
use tower_agent::stores::redis::{RedisBudgetStore, RedisConfig, RedisQuotaStore};
use tower_agent::types::{Message, ModelRequest};
use tower_agent::{BoxError, ErrorKind, ModelCall, RunContext, ScriptedModel, ScriptedTurn};

const SECONDS: u64 = 3;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let workers: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(3);
    let url = std::env::var("TOWER_AGENT_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned());
    // A prefix of this run's own, so runs never share state.
    let prefix = format!("workers-example-{}:", std::process::id());

    let handles: Vec<_> = (0..workers)
        .map(|id| tokio::spawn(worker(id, url.clone(), prefix.clone())))
        .collect();
    let mut totals = Vec::new();
    for handle in handles {
        totals.push(handle.await??);
    }
    let admitted: u64 = totals.iter().sum();
    println!(
        "{workers} workers, {SECONDS} s: admitted {totals:?}, {admitted} in all \
         (quota: 10 at once, then 10/s; budget: 100 calls)"
    );
    Ok(())
}

async fn worker(id: usize, url: String, prefix: String) -> Result<u64, BoxError> {
    let redis = RedisConfig::new(url).prefix(prefix).connect()?;
    let limit = ModelRateLimitLayer::new()
        .requests(10, Duration::from_secs(1))
        .max_wait(Duration::from_millis(200))
        .store(RedisQuotaStore::new(redis.clone()));
    let budget = RedisBudgetStore::new(redis);
    let line = [BudgetLine::new("daily", "tenant:demo").max_cost("1.00".parse()?)];
    let cent = Spend::cost("0.01".parse()?);
    let mut model = ServiceBuilder::new()
        .layer(limit)
        .service(ScriptedModel::from_fn(|_| ScriptedTurn::text("ok")));

    let start = Instant::now();
    let (mut total, mut this_second, mut second) = (0, 0, 0);
    while start.elapsed() < Duration::from_secs(SECONDS) {
        let held = match budget.reserve(&line, cent).await {
            Ok(held) => held,
            Err(_) => {
                println!("worker {id}: budget spent");
                break;
            }
        };
        let call = ModelCall::new(
            ModelRequest::new("m", vec![Message::user("hi")]),
            RunContext::new(),
        );
        let outcome = model.ready().await?.call(call).await;
        let spent = if outcome.is_ok() { cent } else { Spend::ZERO };
        budget.settle(held, spent).await?;
        match outcome {
            Ok(_) => {
                total += 1;
                this_second += 1;
            }
            Err(e) if kind_of(e.as_ref()) == ErrorKind::RateLimited => {}
            Err(e) => return Err(e),
        }
        let now = start.elapsed().as_secs();
        if now > second {
            println!("worker {id}: second {second}: {this_second} admitted");
            (second, this_second) = (now, 0);
        }
    }
    Ok(total)
}
