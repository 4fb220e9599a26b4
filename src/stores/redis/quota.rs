//! [`RedisQuotaStore`]: the rate limit's quota on Redis, one Lua script per
//! reservation, with the settlements of earlier calls folded into it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use redis::Script;

use super::RedisConnection;
use crate::error::BoxError;
use crate::stores::quota::{micros, Limits, QuotaStore, Rate, Reservation};

/// GCRA on both buckets at once, on the server's clock: admits (and moves
/// both times) only if both fit; otherwise changes nothing and returns the
/// wait in µs.
///
/// First it moves the tokens' time by ARGV[7] tokens, the settlements
/// folded into this call (see [`SETTLE`]).
///
/// KEYS: requests time, tokens time. ARGV per bucket: amount, interval in
/// µs, need (an amount of 0 means no limit); then the folded tokens.
const RESERVE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local fold, amount, per = tonumber(ARGV[7]), tonumber(ARGV[4]), tonumber(ARGV[5])
if fold ~= 0 and amount > 0 then
  local v = redis.call('GET', KEYS[2])
  local tat = now
  if v then tat = tonumber(v) end
  if fold > 0 then tat = math.max(tat, now) + fold * per / amount
  else tat = math.max(tat + fold * per / amount, now) end
  if tat <= now then redis.call('DEL', KEYS[2])
  else redis.call('SET', KEYS[2], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1) end
end
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
/// neither). A settlement waits in the process for the next reservation of
/// its key, which carries it in the same script: under load a call costs one
/// round trip. A settlement that finds no reservation after it (the
/// settling task runs after the calls queued before it) is sent on its own,
/// and one that fails is kept for the next call. A call whose estimate was
/// exact settles with nothing. Keys expire once their bucket has refilled.
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
    folds: Folds,
}

impl RedisQuotaStore {
    /// A quota on `redis`.
    pub fn new(redis: RedisConnection) -> Self {
        Self {
            redis,
            reserve: Script::new(RESERVE),
            settle: Script::new(SETTLE),
            folds: Folds::default(),
        }
    }
}

/// Settlements not yet sent, per tokens key: tokens to add (or, negative,
/// give back). Shared by clones, so every clone's calls carry them.
#[derive(Debug, Clone, Default)]
struct Folds(Arc<Mutex<HashMap<String, i128>>>);

impl Folds {
    fn add(&self, key: &str, tokens: i128) {
        let mut folds = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = folds.entry(key.to_owned()).or_default();
        *entry += tokens;
        if *entry == 0 {
            folds.remove(key);
        }
    }

    fn take(&self, key: &str) -> i128 {
        let mut folds = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        folds.remove(key).unwrap_or(0)
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
        // Taken now, in call order: a settlement made before this call rides
        // on it.
        let fold = if ta > 0 {
            self.folds.take(&token_key)
        } else {
            0
        };
        let folds = self.folds.clone();
        let mut conn = self.redis.manager();
        Box::pin(async move {
            let reserved: Result<(u8, u64), _> = script
                .key(request_key)
                .key(&token_key)
                .arg(ra)
                .arg(rp)
                .arg(requests)
                .arg(ta)
                .arg(tp)
                .arg(tokens)
                .arg(fold.to_string())
                .invoke_async(&mut conn)
                .await;
            let (admitted, wait) = reserved.inspect_err(|_| folds.add(&token_key, fold))?;
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
        let token_key = self.redis.key("quota", &format!("{key}:tokens"));
        // Waits for the next reservation of the key; what none took by the
        // time this future runs is sent on its own.
        self.folds
            .add(&token_key, i128::from(actual) - i128::from(reserved));
        let script = self.settle.clone();
        let folds = self.folds.clone();
        let mut conn = self.redis.manager();
        Box::pin(async move {
            let diff = folds.take(&token_key);
            if diff == 0 {
                return Ok(());
            }
            let settled: Result<i64, _> = script
                .key(&token_key)
                .arg(amount)
                .arg(per)
                .arg(diff.to_string())
                .invoke_async(&mut conn)
                .await;
            settled.inspect_err(|_| folds.add(&token_key, diff))?;
            Ok(())
        })
    }
}
