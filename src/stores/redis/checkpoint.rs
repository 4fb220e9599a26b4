//! [`RedisCheckpointStore`]: paused runs on Redis, taken with an optimistic
//! version check.

use futures::future::BoxFuture;
use redis::Script;

use super::RedisConnection;
use crate::stores::{CheckpointError, CheckpointStore, StoredCheckpoint};
use crate::types::Checkpoint;

/// Stores the checkpoint with the next version of one counter for the whole
/// store (so a version is never reused, even after a take).
///
/// KEYS: the run's hash, the version counter. ARGV: the checkpoint (JSON).
const PUT: &str = r"
local v = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'v', v, 'c', ARGV[1])
return v
";

/// Removes and answers the checkpoint if it is at the version asked for.
///
/// KEYS: the run's hash. ARGV: the version. Answers {0} when there is
/// none, {1, found} on another version, {2, checkpoint} when taken.
const TAKE: &str = r"
local v = redis.call('HGET', KEYS[1], 'v')
if not v then return {0} end
if v ~= ARGV[1] then return {1, v} end
local c = redis.call('HGET', KEYS[1], 'c')
redis.call('DEL', KEYS[1])
return {2, c}
";

/// Paused runs on Redis, shared by every process on the server: a run
/// paused in one worker is resumed in another. Each checkpoint is a hash
/// (`{prefix}checkpoint:{run id}`: version and JSON), kept until it is
/// taken.
///
/// [`put`](CheckpointStore::put) answers once Redis has confirmed the write
/// (a run reports *paused* only then); [`take`](CheckpointStore::take) is
/// one atomic script that removes the checkpoint only at the version the
/// resumer read, so of two workers resuming one run, one gets
/// [`CheckpointError::Conflict`] or [`CheckpointError::NotFound`].
///
/// # Errors
///
/// A Redis failure is [`CheckpointError::Store`]: the pause fails, and what
/// was stored before is untouched.
///
/// ```no_run
/// use tower_agent::stores::CheckpointStore;
/// use tower_agent::stores::redis::{RedisCheckpointStore, RedisConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_agent::BoxError> {
/// let store = RedisCheckpointStore::new(RedisConfig::new("redis://127.0.0.1:6379").connect()?);
/// if let Some(stored) = store.get("run-1").await? {
///     let checkpoint = store.take("run-1", stored.version).await?;
///     # let _ = checkpoint;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisCheckpointStore {
    redis: RedisConnection,
    put: Script,
    take: Script,
}

impl RedisCheckpointStore {
    /// Checkpoints on `redis`.
    pub fn new(redis: RedisConnection) -> Self {
        Self {
            redis,
            put: Script::new(PUT),
            take: Script::new(TAKE),
        }
    }

    fn key(&self, run_id: &str) -> String {
        self.redis.key("checkpoint", run_id)
    }
}

fn store_error(e: impl std::error::Error + Send + Sync + 'static) -> CheckpointError {
    CheckpointError::Store(Box::new(e))
}

impl CheckpointStore for RedisCheckpointStore {
    fn put(&self, checkpoint: Checkpoint) -> BoxFuture<'_, Result<u64, CheckpointError>> {
        Box::pin(async move {
            let json = serde_json::to_vec(&checkpoint).map_err(store_error)?;
            let mut conn = self.redis.manager();
            self.put
                .key(self.key(&checkpoint.run_id))
                .key(self.redis.key("checkpoint-version", "counter"))
                .arg(json)
                .invoke_async(&mut conn)
                .await
                .map_err(store_error)
        })
    }

    fn get<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredCheckpoint>, CheckpointError>> {
        Box::pin(async move {
            let mut conn = self.redis.manager();
            let (version, json): (Option<u64>, Option<Vec<u8>>) = redis::cmd("HMGET")
                .arg(self.key(run_id))
                .arg("v")
                .arg("c")
                .query_async(&mut conn)
                .await
                .map_err(store_error)?;
            match (version, json) {
                (Some(version), Some(json)) => Ok(Some(StoredCheckpoint {
                    checkpoint: serde_json::from_slice(&json).map_err(store_error)?,
                    version,
                })),
                _ => Ok(None),
            }
        })
    }

    fn take<'a>(
        &'a self,
        run_id: &'a str,
        version: u64,
    ) -> BoxFuture<'a, Result<Checkpoint, CheckpointError>> {
        Box::pin(async move {
            let mut conn = self.redis.manager();
            let answer: Vec<redis::Value> = self
                .take
                .key(self.key(run_id))
                .arg(version.to_string())
                .invoke_async(&mut conn)
                .await
                .map_err(store_error)?;
            let text = |value: Option<&redis::Value>| -> Result<Vec<u8>, CheckpointError> {
                match value {
                    Some(redis::Value::BulkString(bytes)) => Ok(bytes.clone()),
                    other => Err(CheckpointError::Store(
                        format!("unexpected answer from redis: {other:?}").into(),
                    )),
                }
            };
            match answer.first() {
                Some(redis::Value::Int(2)) => {
                    serde_json::from_slice(&text(answer.get(1))?).map_err(store_error)
                }
                Some(redis::Value::Int(1)) => {
                    let found = String::from_utf8_lossy(&text(answer.get(1))?)
                        .parse()
                        .unwrap_or(0);
                    Err(CheckpointError::Conflict {
                        run_id: run_id.to_owned(),
                        expected: version,
                        found,
                    })
                }
                _ => Err(CheckpointError::NotFound {
                    run_id: run_id.to_owned(),
                }),
            }
        })
    }
}
