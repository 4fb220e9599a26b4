//! [`RedisQuotaStore`]: the rate limit's quota on Redis, one Lua script per
//! reservation and one per settlement.

use futures::future::BoxFuture;
use redis::Script;

use super::RedisConnection;
use crate::error::BoxError;
use crate::stores::quota::{micros, Limits, QuotaStore, Rate, Reservation};

/// GCRA on both buckets at once, on the server's clock: admits (and moves
/// both times) only if both fit; otherwise changes nothing and returns the
/// wait in µs.
///
/// KEYS: requests time, tokens time. ARGV per bucket: amount, interval in
/// µs, need (an amount of 0 means no limit).
const RESERVE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function plan(key, amount, per, need)
  if amount <= 0 or need <= 0 then return nil, 0 end
  if need > amount then need = amount end
  local v = redis.call('GET', key)
  local tat = now
  if v then tat = math.max(tonumber(v), now) end
  local next = tat + need * per / amount
  return next, math.max(next - per - now, 0)
end
local rt, rw = plan(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]))
local tt, tw = plan(KEYS[2], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]))
local wait = math.max(rw, tw)
if wait > 0 then return {0, math.ceil(wait)} end
if rt then redis.call('SET', KEYS[1], string.format('%.0f', rt), 'PX', math.ceil((rt - now) / 1000) + 1) end
if tt then redis.call('SET', KEYS[2], string.format('%.0f', tt), 'PX', math.ceil((tt - now) / 1000) + 1) end
return {1, 0}
";

/// Moves the tokens' time by `actual - reserved` tokens: later when more
/// were used, earlier (never before now) when fewer.
///
/// KEYS: tokens time. ARGV: amount, interval in µs, actual minus reserved.
const SETTLE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local amount, per, diff = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local v = redis.call('GET', KEYS[1])
local tat = now
if v then tat = tonumber(v) end
if diff > 0 then tat = math.max(tat, now) + diff * per / amount
else tat = math.max(tat + diff * per / amount, now) end
if tat <= now then redis.call('DEL', KEYS[1]) return 0 end
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
return 0
";

/// The rate limit's quota on Redis: per key, two values
/// (`{prefix}quota:{key}:requests` and `…:tokens`), each a GCRA time kept on
/// the Redis server's clock, so every process sharing the server shares one
/// quota whatever its own clock says. See [the algorithm](crate::stores::quota#the-algorithm-gcra).
///
/// A reservation is one `EVALSHA` (both buckets, atomically: both or
/// neither), a settlement another, and a call whose estimate was exact
/// settles without one. Keys expire once their bucket has refilled.
///
/// # Errors
///
/// Any Redis failure (down, dropped, timed out) is returned; the layer then
/// refuses the call (fail closed) unless told
/// [`FailPolicy::Open`](crate::stores::FailPolicy::Open).
///
/// ```no_run
/// use std::time::Duration;
/// use tower_agent::layers::rate_limit::ModelRateLimitLayer;
/// use tower_agent::stores::redis::{RedisConfig, RedisQuotaStore};
///
/// # fn main() -> Result<(), tower_agent::AgentError> {
/// let redis = RedisConfig::new("redis://127.0.0.1:6379").connect()?;
/// let layer = ModelRateLimitLayer::new()
///     .requests(500, Duration::from_secs(60))
///     .tokens(30_000, Duration::from_secs(60))
///     .store(RedisQuotaStore::new(redis));
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisQuotaStore {
    redis: RedisConnection,
    reserve: Script,
    settle: Script,
}

impl RedisQuotaStore {
    /// A quota on `redis`.
    pub fn new(redis: RedisConnection) -> Self {
        Self {
            redis,
            reserve: Script::new(RESERVE),
            settle: Script::new(SETTLE),
        }
    }
}

fn rate_args(rate: Option<Rate>) -> (u64, u64) {
    rate.map_or((0, 0), |r| {
        (
            r.amount(),
            u64::try_from(r.per().as_micros()).unwrap_or(u64::MAX),
        )
    })
}

impl QuotaStore for RedisQuotaStore {
    fn reserve(
        &self,
        key: &str,
        limits: Limits,
        requests: u64,
        tokens: u64,
    ) -> BoxFuture<'static, Result<Reservation, BoxError>> {
        let script = self.reserve.clone();
        let (ra, rp) = rate_args(limits.request_rate());
        let (ta, tp) = rate_args(limits.token_rate());
        let request_key = self.redis.key("quota", &format!("{key}:requests"));
        let token_key = self.redis.key("quota", &format!("{key}:tokens"));
        let mut conn = self.redis.manager();
        Box::pin(async move {
            let (admitted, wait): (u8, u64) = script
                .key(request_key)
                .key(token_key)
                .arg(ra)
                .arg(rp)
                .arg(requests)
                .arg(ta)
                .arg(tp)
                .arg(tokens)
                .invoke_async(&mut conn)
                .await?;
            Ok(if admitted == 1 {
                Reservation::Admitted {
                    tokens: limits.token_rate().map_or(0, |r| tokens.min(r.amount())),
                }
            } else {
                Reservation::Wait(micros(wait as f64))
            })
        })
    }

    fn settle(
        &self,
        key: &str,
        limits: Limits,
        reserved: u64,
        actual: u64,
    ) -> BoxFuture<'static, Result<(), BoxError>> {
        let Some(rate) = limits.token_rate().filter(|_| reserved != actual) else {
            return Box::pin(std::future::ready(Ok(())));
        };
        let (amount, per) = rate_args(Some(rate));
        let diff = i128::from(actual) - i128::from(reserved);
        let script = self.settle.clone();
        let token_key = self.redis.key("quota", &format!("{key}:tokens"));
        let mut conn = self.redis.manager();
        Box::pin(async move {
            let _: i64 = script
                .key(token_key)
                .arg(amount)
                .arg(per)
                .arg(diff.to_string())
                .invoke_async(&mut conn)
                .await?;
            Ok(())
        })
    }
}
