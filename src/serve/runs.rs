//! Runs in flight and finished: starting one on its own task, its frames
//! (events, text deltas, the outcome), and the table `GET /v1/runs/{id}`
//! reads.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::error::ApiError;
use super::ServedAgent;
use crate::context::RunContext;
use crate::event::AgentEvent;
use crate::request::{DeltaSink, RunRequest};
use crate::stores::{report_failure, CheckpointStore};
use crate::types::{AgentRun, ModelDelta, PendingCall, RunStatus};

/// How many finished runs `GET /v1/runs/{id}` still knows.
const FINISHED_KEPT: usize = 1024;

/// What a run sends while it goes, and last its outcome.
#[derive(Debug)]
pub(crate) enum Frame {
    Event(AgentEvent),
    Delta(ModelDelta),
    Done(Result<Finished, ApiError>),
}

/// A run that ended without an error, with the version its checkpoint was
/// stored at when it paused.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) run: AgentRun,
    pub(crate) version: Option<u64>,
}

/// Cancels the run when dropped: the client went away (or the run is done,
/// where it changes nothing).
#[derive(Debug)]
pub(crate) struct CancelOnDrop(CancellationToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// A started run: its id, its frames, and the guard that cancels it.
#[derive(Debug)]
pub(crate) struct Started {
    pub(crate) run_id: Arc<str>,
    pub(crate) frames: mpsc::UnboundedReceiver<Frame>,
    pub(crate) _guard: CancelOnDrop,
}

impl Started {
    /// Waits for the outcome, dropping the events on the way.
    pub(crate) async fn outcome(mut self) -> Result<Finished, ApiError> {
        while let Some(frame) = self.frames.recv().await {
            if let Frame::Done(outcome) = frame {
                return outcome;
            }
        }
        Err(ApiError::new(
            "INTERNAL",
            "the run ended without an outcome",
        ))
    }
}

/// Where a run stands, as `GET /v1/runs/{id}` tells it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunRecord {
    pub(crate) run_id: Arc<str>,
    pub(crate) agent: String,
    /// `running`, `completed`, `stopped`, `paused` or `failed`.
    pub(crate) status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) output: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pending: Option<Vec<PendingCall>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) version: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<ApiError>,
    #[serde(skip)]
    cancel: Option<CancellationToken>,
}

#[derive(Default)]
struct Table {
    runs: HashMap<Arc<str>, RunRecord>,
    finished: VecDeque<Arc<str>>,
}

/// The runs the server started.
#[derive(Clone, Default)]
pub(crate) struct Runs {
    table: Arc<Mutex<Table>>,
}

impl Runs {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn get(&self, run_id: &str) -> Option<RunRecord> {
        self.lock().runs.get(run_id).cloned()
    }

    fn running(&self, run_id: &Arc<str>, agent: &str, cancel: CancellationToken) {
        let record = RunRecord {
            run_id: run_id.clone(),
            agent: agent.to_owned(),
            status: "running",
            output: None,
            pending: None,
            version: None,
            error: None,
            cancel: Some(cancel),
        };
        self.lock().runs.insert(run_id.clone(), record);
    }

    fn finish(&self, run_id: &Arc<str>, agent: &str, outcome: &Result<Finished, ApiError>) {
        let mut record = RunRecord {
            run_id: run_id.clone(),
            agent: agent.to_owned(),
            status: "failed",
            output: None,
            pending: None,
            version: None,
            error: None,
            cancel: None,
        };
        match outcome {
            Ok(finished) => {
                record.status = finished.run.status.as_str();
                match &finished.run.status {
                    RunStatus::Completed => record.output = Some(finished.run.output.clone()),
                    RunStatus::Paused(checkpoint) => {
                        record.pending = Some(checkpoint.pending.clone());
                        record.version = finished.version;
                    }
                    _ => {}
                }
            }
            Err(error) => record.error = Some(error.clone()),
        }
        let mut table = self.lock();
        table.runs.insert(run_id.clone(), record);
        table.finished.push_back(run_id.clone());
        while table.finished.len() > FINISHED_KEPT {
            if let Some(old) = table.finished.pop_front() {
                // A run resumed since is running again under the same id: keep it.
                if table.runs.get(&old).is_some_and(|r| r.cancel.is_none()) {
                    table.runs.remove(&old);
                }
            }
        }
    }

    /// Cancels every run still going.
    pub(crate) fn cancel_all(&self) {
        for record in self.lock().runs.values() {
            if let Some(cancel) = &record.cancel {
                cancel.cancel();
            }
        }
    }

    /// How many runs are going.
    pub(crate) fn in_flight(&self) -> usize {
        self.lock()
            .runs
            .values()
            .filter(|r| r.cancel.is_some())
            .count()
    }
}

/// Starts `request` on `agent` on its own task, in a fresh context keeping
/// the request's run and thread ids, with events (when `events`) and text
/// deltas sent as frames. A paused run's checkpoint goes into `store`.
pub(crate) fn start(
    runs: &Runs,
    store: Arc<dyn CheckpointStore>,
    agent_name: &str,
    agent: ServedAgent,
    mut request: RunRequest,
    events: bool,
) -> Started {
    let cancel = CancellationToken::new();
    let (tx, frames) = mpsc::unbounded_channel();
    let run_id = request.context.run_id().clone();
    let mut context = RunContext::builder()
        .run_id(run_id.clone())
        .cancellation(cancel.clone());
    if let Some(thread) = request.context.thread_id() {
        context = context.thread_id(thread);
    }
    if events {
        let tx = tx.clone();
        context = context.events(move |event: AgentEvent| {
            let _ = tx.send(Frame::Event(event));
        });
    }
    request.context = context.build();
    let deltas = tx.clone();
    request.stream = Some(DeltaSink::new(move |delta: &ModelDelta| {
        let _ = deltas.send(Frame::Delta(delta.clone()));
    }));
    runs.running(&run_id, agent_name, cancel.clone());
    let runs = runs.clone();
    let name = agent_name.to_owned();
    let id = run_id.clone();
    tokio::spawn(async move {
        let ctx = request.context.clone();
        let outcome = match agent.oneshot(request).await {
            Ok(run) => match &run.status {
                RunStatus::Paused(checkpoint) => match store.put((**checkpoint).clone()).await {
                    Ok(version) => Ok(Finished {
                        run,
                        version: Some(version),
                    }),
                    Err(e) => {
                        report_failure(&ctx, "checkpoint", "save", &e, false);
                        Err(ApiError::from(e))
                    }
                },
                _ => Ok(Finished { run, version: None }),
            },
            Err(err) => Err(ApiError::from(&err)),
        };
        runs.finish(&id, &name, &outcome);
        let _ = tx.send(Frame::Done(outcome));
    });
    Started {
        run_id,
        frames,
        _guard: CancelOnDrop(cancel),
    }
}

/// The JSON of a finished run.
pub(crate) fn run_body(finished: &Finished) -> Value {
    let run = &finished.run;
    let mut body = serde_json::json!({
        "run_id": run.run_id,
        "agent": run.agent,
        "status": run.status.as_str(),
        "output": run.output,
        "structured": run.structured,
        "usage": run.usage,
        "usage_total": run.usage_total,
        "counters": run.counters,
        "messages": run.messages,
    });
    match &run.status {
        RunStatus::Paused(checkpoint) => {
            body["checkpoint"] = serde_json::json!({
                "id": run.run_id,
                "version": finished.version,
                "pending": checkpoint.pending,
            });
        }
        RunStatus::Stopped(reason) => body["stop"] = serde_json::json!(reason),
        RunStatus::Completed => {}
    }
    body
}
