//! [`RedisBudgetStore`]: the budget ledger on Redis, one Lua script per
//! reservation and one per settlement.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use redis::Script;
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;

use super::RedisConnection;
use crate::error::{AgentError, BoxError, BudgetExceeded};
use crate::stores::budget::{BudgetLine, BudgetStore, HeldLine, LineState, Reservation, Spend};
use crate::types::{Amount, Cost};

/// Checks every line, then holds the amount on every line (or on none).
///
/// KEYS: one hash per line (fields `sc`/`st` spent cost and tokens, `rc`/`rt`
/// reserved). ARGV: the amount's cost (nano units) and tokens, then per
/// line its cost limit, token limit (-1 for none) and time to live in ms
/// (0 for a line without windows).
const RESERVE: &str = r"
local ac, at = tonumber(ARGV[1]), tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  local b = 2 + (i - 1) * 3
  local mc, mt = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local v = redis.call('HMGET', key, 'sc', 'st', 'rc', 'rt')
  local hc = (tonumber(v[1]) or 0) + (tonumber(v[3]) or 0)
  local ht = (tonumber(v[2]) or 0) + (tonumber(v[4]) or 0)
  if (mc >= 0 and hc + ac > mc) or (mt >= 0 and ht + at > mt) then
    return {0, i, string.format('%.0f', hc), string.format('%.0f', ht)}
  end
end
for i, key in ipairs(KEYS) do
  local ttl = tonumber(ARGV[2 + (i - 1) * 3 + 3])
  redis.call('HINCRBY', key, 'rc', ac)
  redis.call('HINCRBY', key, 'rt', at)
  if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
end
return {1, 0, '0', '0'}
";

/// Gives the held amount back (never below zero) and charges the actual
/// spend, on every line whose window is still kept.
///
/// KEYS: the held lines' hashes. ARGV: held cost, held tokens, actual cost,
/// actual tokens.
const SETTLE: &str = r"
local hc, ht, ac, at = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    local v = redis.call('HMGET', key, 'rc', 'rt')
    redis.call('HSET', key, 'rc', math.max((tonumber(v[1]) or 0) - hc, 0),
      'rt', math.max((tonumber(v[2]) or 0) - ht, 0))
    redis.call('HINCRBY', key, 'sc', ac)
    redis.call('HINCRBY', key, 'st', at)
  end
end
return 1
";

/// Costs are kept on Redis as whole nano units (10⁻⁹), rounded up.
const NANO: u32 = 9;

fn nanos(cost: Cost) -> i64 {
    (cost.amount() * Decimal::from(1_000_000_000u64))
        .ceil()
        .to_i64()
        .unwrap_or(i64::MAX)
}

fn cost_of(nanos: i64) -> Cost {
    Cost::new(Decimal::new(nanos, NANO).normalize())
}

fn tokens(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The budget ledger on Redis: one hash per line and window
/// (`{prefix}budget:{budget}:{key}:{window}`), windows aligned to wall-clock
/// time (window `n` of a day-long line is the `n`-th UTC day since 1970), so
/// every process on the server shares one ledger. Each reservation is one
/// atomic script over all its lines: workers reserving at once can never
/// together hold more than a line allows. A windowed line's hash expires
/// one window after its window ends.
///
/// A call settled after its window ended is charged to the window it was
/// reserved in (while that window's hash is kept), not the current one.
///
/// # Errors
///
/// A refusal is [`AgentError::BudgetExceeded`]; any Redis failure is
/// returned as it is, and the budget layer treats it as its fail setting
/// says.
///
/// ```no_run
/// use tower_agent::stores::budget::{BudgetLine, BudgetStore, Spend};
/// use tower_agent::stores::redis::{RedisBudgetStore, RedisConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_agent::BoxError> {
/// let store = RedisBudgetStore::new(RedisConfig::new("redis://127.0.0.1:6379").connect()?);
/// let lines = [BudgetLine::new("daily", "tenant:acme").max_cost("1.00".parse()?)];
/// let held = store.reserve(&lines, Spend::cost("0.60".parse()?)).await?;
/// store.settle(held, Spend::cost("0.25".parse()?)).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisBudgetStore {
    redis: RedisConnection,
    reserve: Script,
    settle: Script,
}

impl RedisBudgetStore {
    /// A ledger on `redis`.
    pub fn new(redis: RedisConnection) -> Self {
        Self {
            redis,
            reserve: Script::new(RESERVE),
            settle: Script::new(SETTLE),
        }
    }

    fn key(&self, budget: &str, key: &str, window: u64) -> String {
        self.redis
            .key("budget", &format!("{budget}:{key}:{window}"))
    }
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// The line's current window, and how long its hash is kept (ms; 0 for
/// ever).
fn window_of(window: Option<Duration>) -> (u64, u64) {
    match window.map(|w| w.as_millis()).filter(|w| *w > 0) {
        Some(w) => {
            let now = now_ms();
            let index = now / w;
            let ttl = (index + 2) * w - now;
            (
                u64::try_from(index).unwrap_or(u64::MAX),
                u64::try_from(ttl).unwrap_or(u64::MAX),
            )
        }
        None => (0, 0),
    }
}

impl BudgetStore for RedisBudgetStore {
    fn reserve<'a>(
        &'a self,
        lines: &'a [BudgetLine],
        amount: Spend,
    ) -> BoxFuture<'a, Result<Reservation, BoxError>> {
        Box::pin(async move {
            let mut invocation = self.reserve.prepare_invoke();
            invocation
                .arg(nanos(amount.cost))
                .arg(tokens(amount.tokens));
            let mut held = Vec::with_capacity(lines.len());
            for line in lines {
                let (window, ttl) = window_of(line.window);
                invocation
                    .key(self.key(&line.budget, &line.key, window))
                    .arg(line.max_cost.map_or(-1, nanos))
                    .arg(line.max_tokens.map_or(-1, tokens))
                    .arg(ttl);
                held.push(HeldLine {
                    budget: line.budget.clone(),
                    key: line.key.clone(),
                    window,
                });
            }
            let mut conn = self.redis.manager();
            let (ok, index, held_cost, held_tokens): (u8, usize, i64, i64) =
                invocation.invoke_async(&mut conn).await?;
            if ok == 1 {
                return Ok(Reservation {
                    amount,
                    lines: held,
                });
            }
            let line = &lines[index.saturating_sub(1).min(lines.len().saturating_sub(1))];
            let held = Spend::new(cost_of(held_cost), u64::try_from(held_tokens).unwrap_or(0));
            let refusal = line.check(held, amount).err().unwrap_or_else(|| {
                // Rounding to nano units refused what the exact check lets
                // through: name the cost limit (the only one rounded).
                BudgetExceeded {
                    budget: line.budget.to_string(),
                    key: line.key.clone(),
                    limit: Amount::Cost(line.max_cost.unwrap_or(Cost::ZERO)),
                    spent: Amount::Cost(held.cost),
                    requested: Amount::Cost(amount.cost),
                }
            });
            Err(Box::new(AgentError::BudgetExceeded(refusal)) as BoxError)
        })
    }

    fn settle(
        &self,
        reservation: Reservation,
        actual: Spend,
    ) -> BoxFuture<'_, Result<(), BoxError>> {
        Box::pin(async move {
            let mut invocation = self.settle.prepare_invoke();
            for held in &reservation.lines {
                invocation.key(self.key(&held.budget, &held.key, held.window));
            }
            invocation
                .arg(nanos(reservation.amount.cost))
                .arg(tokens(reservation.amount.tokens))
                .arg(nanos(actual.cost))
                .arg(tokens(actual.tokens));
            let mut conn = self.redis.manager();
            let _: i64 = invocation.invoke_async(&mut conn).await?;
            Ok(())
        })
    }

    fn state<'a>(&'a self, line: &'a BudgetLine) -> BoxFuture<'a, Result<LineState, BoxError>> {
        Box::pin(async move {
            let (window, _) = window_of(line.window);
            let mut conn = self.redis.manager();
            let (sc, st, rc, rt): (Option<i64>, Option<i64>, Option<i64>, Option<i64>) =
                redis::cmd("HMGET")
                    .arg(self.key(&line.budget, &line.key, window))
                    .arg("sc")
                    .arg("st")
                    .arg("rc")
                    .arg("rt")
                    .query_async(&mut conn)
                    .await?;
            let spend = |c: Option<i64>, t: Option<i64>| {
                Spend::new(
                    cost_of(c.unwrap_or(0)),
                    u64::try_from(t.unwrap_or(0)).unwrap_or(0),
                )
            };
            Ok(LineState {
                spent: spend(sc, st),
                reserved: spend(rc, rt),
            })
        })
    }
}
