//! [`SqliteMemory`]: threads and memory items in one SQLite file, with
//! versioned migrations.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use rusqlite::{params, Connection, OptionalExtension};

use super::store::{Memory, MemoryError, MemoryItem, Provenance, Timestamp};
use crate::types::Message;

/// The schema, one step per version: `MIGRATIONS[i]` takes a file from
/// version `i` to `i + 1`. A file's version is its `PRAGMA user_version`.
/// Steps are only ever appended.
const MIGRATIONS: &[&str] = &[
    // 1: threads and items.
    "CREATE TABLE thread_messages (
         thread TEXT NOT NULL,
         pos INTEGER NOT NULL,
         message TEXT NOT NULL,
         PRIMARY KEY (thread, pos)
     ) WITHOUT ROWID;
     CREATE TABLE memory_items (
         id INTEGER PRIMARY KEY AUTOINCREMENT,
         namespace TEXT NOT NULL,
         kind TEXT NOT NULL,
         text TEXT NOT NULL,
         run_id TEXT NOT NULL,
         thread_id TEXT,
         message INTEGER,
         created_at INTEGER NOT NULL,
         last_used_at INTEGER NOT NULL
     );
     CREATE INDEX memory_items_by_namespace ON memory_items (namespace, id);",
];

/// The newest schema version this crate writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

fn store_err(err: impl std::error::Error + Send + Sync + 'static) -> MemoryError {
    MemoryError::Store(Box::new(err))
}

/// A [`Memory`] in a SQLite file (the SQLite library is compiled in): every
/// process that opens the same file sees the same threads and items, so a
/// thread a run saved is continued by a run in another process, or after a
/// restart.
///
/// [`open`](Self::open) creates the file on first use and brings its schema
/// up to date: each migration runs once, in a transaction, and the file
/// records its version. A file written by a newer version of this crate is
/// refused ([`MemoryError::NewerSchema`]) rather than misread. The file is in
/// WAL mode, so readers in other processes do not wait for a writer.
///
/// Each operation runs on tokio's blocking pool (it needs a tokio runtime).
///
/// ```
/// use tower_agent::memory::{Memory, SqliteMemory};
/// use tower_agent::Message;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_agent::memory::MemoryError> {
/// let path = std::env::temp_dir().join(format!("tower-agent-doc-{}.db", std::process::id()));
/// # let _ = std::fs::remove_file(&path);
/// let memory = SqliteMemory::open(&path)?;
/// memory.save_thread("t-1", 0, &[Message::user("hi")]).await?;
///
/// // Another handle (here, or in another process) reads the same thread.
/// let again = SqliteMemory::open(&path)?;
/// assert_eq!(again.load_thread("t-1").await?[0].text(), "hi");
/// # drop((memory, again)); let _ = std::fs::remove_file(&path);
/// # Ok(()) }
/// ```
///
/// # Clone
///
/// Clones share one connection.
#[derive(Clone)]
pub struct SqliteMemory {
    connection: Arc<Mutex<Connection>>,
    path: Arc<PathBuf>,
}

impl fmt::Debug for SqliteMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteMemory")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SqliteMemory {
    /// Opens the memory in the file at `path`, creating the file and its
    /// schema if needed.
    ///
    /// # Errors
    ///
    /// [`MemoryError::Store`] when the file cannot be opened or migrated,
    /// [`MemoryError::NewerSchema`] when a newer version of this crate wrote
    /// it.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, MemoryError> {
        let path = path.as_ref().to_path_buf();
        let mut connection = Connection::open(&path).map_err(store_err)?;
        connection
            .busy_timeout(std::time::Duration::from_secs(5))
            .map_err(store_err)?;
        // WAL lets readers of other processes go on while one writes.
        let _mode: String = connection
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(store_err)?;
        migrate(&mut connection)?;
        Ok(Self {
            connection: Arc::new(Mutex::new(connection)),
            path: Arc::new(path),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's schema version (after [`open`](Self::open), the newest).
    ///
    /// # Errors
    ///
    /// [`MemoryError::Store`] when the file cannot be read.
    pub fn schema_version(&self) -> Result<u32, MemoryError> {
        let connection = self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        user_version(&connection)
    }

    /// Runs `f` with the connection on the blocking pool.
    fn run<'a, T, F>(&self, f: F) -> BoxFuture<'a, Result<T, MemoryError>>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, MemoryError> + Send + 'static,
    {
        let connection = self.connection.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let mut connection = connection.lock().unwrap_or_else(PoisonError::into_inner);
                f(&mut connection)
            })
            .await
            .map_err(store_err)?
        })
    }
}

fn user_version(connection: &Connection) -> Result<u32, MemoryError> {
    connection
        .query_row("PRAGMA user_version", [], |row| row.get::<_, u32>(0))
        .map_err(store_err)
}

/// Brings the file's schema to [`SCHEMA_VERSION`], one migration per
/// transaction, each recording its version.
fn migrate(connection: &mut Connection) -> Result<(), MemoryError> {
    let found = user_version(connection)?;
    if found > SCHEMA_VERSION {
        return Err(MemoryError::NewerSchema {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (version, step) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let tx = connection.transaction().map_err(store_err)?;
        tx.execute_batch(step).map_err(store_err)?;
        tx.pragma_update(None, "user_version", version as u32 + 1)
            .map_err(store_err)?;
        tx.commit().map_err(store_err)?;
    }
    Ok(())
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn item_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<MemoryItem> {
    Ok(MemoryItem {
        id: row.get::<_, i64>(0)?.max(0) as u64,
        namespace: row.get(1)?,
        kind: row.get(2)?,
        text: row.get(3)?,
        provenance: Provenance {
            run_id: row.get(4)?,
            thread_id: row.get(5)?,
            message: row.get::<_, Option<i64>>(6)?.map(|m| m.max(0) as u32),
        },
        created_at: row.get::<_, i64>(7)?.max(0) as u64,
        last_used_at: row.get::<_, i64>(8)?.max(0) as u64,
    })
}

impl Memory for SqliteMemory {
    fn load_thread<'a>(
        &'a self,
        thread: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Message>, MemoryError>> {
        let thread = thread.to_owned();
        self.run(move |connection| {
            let mut statement = connection
                .prepare_cached(
                    "SELECT message FROM thread_messages WHERE thread = ?1 ORDER BY pos",
                )
                .map_err(store_err)?;
            let rows = statement
                .query_map([&thread], |row| row.get::<_, String>(0))
                .map_err(store_err)?;
            rows.map(|row| {
                let json = row.map_err(store_err)?;
                serde_json::from_str(&json).map_err(|e| {
                    MemoryError::Corrupt(format!("a message of thread `{thread}`: {e}"))
                })
            })
            .collect()
        })
    }

    fn save_thread<'a>(
        &'a self,
        thread: &'a str,
        keep: usize,
        tail: &'a [Message],
    ) -> BoxFuture<'a, Result<(), MemoryError>> {
        let thread = thread.to_owned();
        let tail: Result<Vec<String>, MemoryError> = tail
            .iter()
            .map(|m| serde_json::to_string(m).map_err(store_err))
            .collect();
        self.run(move |connection| {
            let tail = tail?;
            let tx = connection.transaction().map_err(store_err)?;
            let len: i64 = tx
                .query_row(
                    "SELECT COUNT(*) FROM thread_messages WHERE thread = ?1",
                    [&thread],
                    |row| row.get(0),
                )
                .map_err(store_err)?;
            let keep = to_i64(keep as u64).min(len);
            tx.execute(
                "DELETE FROM thread_messages WHERE thread = ?1 AND pos >= ?2",
                params![thread, keep],
            )
            .map_err(store_err)?;
            {
                let mut insert = tx
                    .prepare_cached(
                        "INSERT INTO thread_messages (thread, pos, message) VALUES (?1, ?2, ?3)",
                    )
                    .map_err(store_err)?;
                for (i, json) in tail.iter().enumerate() {
                    insert
                        .execute(params![thread, keep + i as i64, json])
                        .map_err(store_err)?;
                }
            }
            tx.commit().map_err(store_err)
        })
    }

    fn add_items(&self, items: Vec<MemoryItem>) -> BoxFuture<'_, Result<Vec<u64>, MemoryError>> {
        self.run(move |connection| {
            let tx = connection.transaction().map_err(store_err)?;
            let mut ids = Vec::with_capacity(items.len());
            {
                let mut insert = tx
                    .prepare_cached(
                        "INSERT INTO memory_items (namespace, kind, text, run_id, thread_id, message, created_at, last_used_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    )
                    .map_err(store_err)?;
                for item in &items {
                    insert
                        .execute(params![
                            item.namespace,
                            item.kind,
                            item.text,
                            item.provenance.run_id,
                            item.provenance.thread_id,
                            item.provenance.message.map(i64::from),
                            to_i64(item.created_at),
                            to_i64(item.last_used_at),
                        ])
                        .map_err(store_err)?;
                    ids.push(tx.last_insert_rowid().max(0) as u64);
                }
            }
            tx.commit().map_err(store_err)?;
            Ok(ids)
        })
    }

    fn items<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<MemoryItem>, MemoryError>> {
        let namespace = namespace.to_owned();
        self.run(move |connection| {
            let mut statement = connection
                .prepare_cached(
                    "SELECT id, namespace, kind, text, run_id, thread_id, message, created_at, last_used_at
                     FROM memory_items WHERE namespace = ?1 ORDER BY id",
                )
                .map_err(store_err)?;
            let rows = statement
                .query_map([&namespace], item_from_row)
                .map_err(store_err)?;
            rows.map(|row| row.map_err(store_err)).collect()
        })
    }

    fn touch<'a>(
        &'a self,
        ids: &'a [u64],
        at: Timestamp,
    ) -> BoxFuture<'a, Result<(), MemoryError>> {
        let ids = ids.to_vec();
        self.run(move |connection| {
            let tx = connection.transaction().map_err(store_err)?;
            {
                let mut update = tx
                    .prepare_cached("UPDATE memory_items SET last_used_at = ?1 WHERE id = ?2")
                    .map_err(store_err)?;
                for id in ids {
                    update
                        .execute(params![to_i64(at), to_i64(id)])
                        .map_err(store_err)?;
                }
            }
            tx.commit().map_err(store_err)
        })
    }

    fn remove_item(&self, id: u64) -> BoxFuture<'_, Result<bool, MemoryError>> {
        self.run(move |connection| {
            let removed = connection
                .execute("DELETE FROM memory_items WHERE id = ?1", [to_i64(id)])
                .map_err(store_err)?;
            Ok(removed > 0)
        })
    }
}

/// The schema version of the memory file at `path` without migrating it:
/// `None` if there is no such file.
///
/// # Errors
///
/// [`MemoryError::Store`] when the file exists but cannot be read.
pub fn file_schema_version(path: impl AsRef<Path>) -> Result<Option<u32>, MemoryError> {
    let path = path.as_ref();
    if !path.exists() {
        return Ok(None);
    }
    let connection = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(store_err)?;
    let version = connection
        .query_row("PRAGMA user_version", [], |row| row.get::<_, u32>(0))
        .optional()
        .map_err(store_err)?;
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_path(name: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!(
            "tower-agent-memory-{name}-{}-{}.db",
            std::process::id(),
            rand::random::<u32>()
        ));
        let _ = std::fs::remove_file(&path);
        path
    }

    fn cleanup(path: &Path) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }

    #[tokio::test]
    async fn creates_the_file_on_first_use_and_migrates_once() {
        let path = temp_path("create");
        assert_eq!(file_schema_version(&path).unwrap(), None);
        let memory = SqliteMemory::open(&path).unwrap();
        assert_eq!(memory.schema_version().unwrap(), SCHEMA_VERSION);
        memory
            .save_thread("t", 0, &[Message::user("kept")])
            .await
            .unwrap();
        drop(memory);
        // Reopening runs no migration again (it would fail: the tables exist).
        let memory = SqliteMemory::open(&path).unwrap();
        assert_eq!(memory.load_thread("t").await.unwrap()[0].text(), "kept");
        assert_eq!(file_schema_version(&path).unwrap(), Some(SCHEMA_VERSION));
        drop(memory);
        cleanup(&path);
    }

    #[tokio::test]
    async fn a_file_of_a_newer_version_is_refused() {
        let path = temp_path("newer");
        {
            let connection = Connection::open(&path).unwrap();
            connection
                .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
                .unwrap();
        }
        match SqliteMemory::open(&path) {
            Err(MemoryError::NewerSchema { found, supported }) => {
                assert_eq!((found, supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
            }
            other => panic!("expected NewerSchema, got {other:?}"),
        }
        cleanup(&path);
    }

    #[tokio::test]
    async fn threads_and_items_round_trip() {
        let path = temp_path("round-trip");
        let memory = SqliteMemory::open(&path).unwrap();
        let call = crate::types::ToolCall::new("c1", "weather", r#"{"city":"Paris"}"#);
        let thread = [
            Message::system("s"),
            Message::user("a"),
            Message::assistant_tool_calls(vec![call]),
            Message::tool("c1", "sunny"),
        ];
        memory.save_thread("t", 0, &thread).await.unwrap();
        memory
            .save_thread(
                "t",
                3,
                &[Message::tool("c1", "rain"), Message::assistant("ok")],
            )
            .await
            .unwrap();
        let loaded = memory.load_thread("t").await.unwrap();
        assert_eq!(loaded.len(), 5);
        assert_eq!(loaded[2], thread[2]);
        assert_eq!(loaded[3].text(), "rain");

        let ids = memory
            .add_items(vec![
                MemoryItem::new("n", "fact", "one", 5).provenance(Provenance {
                    run_id: "run_1".into(),
                    thread_id: Some("t".into()),
                    message: Some(3),
                }),
                MemoryItem::new("m", "fact", "elsewhere", 6),
            ])
            .await
            .unwrap();
        memory.touch(&ids[..1], 50).await.unwrap();
        let items = memory.items("n").await.unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].id, ids[0]);
        assert_eq!(items[0].provenance.message, Some(3));
        assert_eq!(items[0].provenance.thread_id.as_deref(), Some("t"));
        assert_eq!((items[0].created_at, items[0].last_used_at), (5, 50));
        assert!(memory.remove_item(ids[0]).await.unwrap());
        assert!(memory.items("n").await.unwrap().is_empty());
        drop(memory);
        cleanup(&path);
    }

    #[tokio::test]
    async fn an_unreadable_message_is_a_typed_error() {
        let path = temp_path("corrupt");
        let memory = SqliteMemory::open(&path).unwrap();
        memory
            .run(|c| {
                c.execute(
                    "INSERT INTO thread_messages (thread, pos, message) VALUES ('t', 0, 'not json')",
                    [],
                )
                .map_err(store_err)
            })
            .await
            .unwrap();
        assert!(matches!(
            memory.load_thread("t").await,
            Err(MemoryError::Corrupt(_))
        ));
        drop(memory);
        cleanup(&path);
    }
}
