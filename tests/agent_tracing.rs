//! Spans for the run, each model call and each tool call carry the
//! OpenTelemetry GenAI attribute names.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tower_agent::{tool_sync, Agent, BoxError, ScriptedModel, ScriptedTurn, ToolRouter};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

type Spans = Arc<Mutex<Vec<(String, BTreeMap<String, String>)>>>;

struct Capture(Spans);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
}

impl<S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>> Layer<S>
    for Capture
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        fields.insert("#id".into(), id.into_u64().to_string());
        self.0
            .lock()
            .unwrap()
            .push((attrs.metadata().name().to_owned(), fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut spans = self.0.lock().unwrap();
        let key = id.into_u64().to_string();
        if let Some((_, fields)) = spans
            .iter_mut()
            .rev()
            .find(|(_, f)| f.get("#id") == Some(&key))
        {
            values.record(&mut Fields(fields));
        }
    }
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Nothing {}

#[tokio::test]
async fn spans_carry_gen_ai_attributes() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(Capture(spans.clone()));
    let _guard = tracing::subscriber::set_default(subscriber);

    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("ping", "{}").usage(tower_agent::Usage::new(12, 3)),
        ScriptedTurn::text("pong"),
    ]);
    let tools = ToolRouter::new().tool(tool_sync("ping", "Pings", |_: Nothing| {
        Ok::<_, BoxError>("pong")
    }));
    let agent = Agent::builder("tracer")
        .model(model)
        .model_name("small-model")
        .tools(tools)
        .build()
        .unwrap();
    agent.run("hi").await.unwrap();

    let spans = spans.lock().unwrap();
    let find = |name: &str| {
        spans
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, f)| f.clone())
            .unwrap()
    };
    let agent_span = find("invoke_agent");
    assert_eq!(agent_span["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(agent_span["gen_ai.agent.name"], "tracer");
    let chat = find("chat");
    assert_eq!(chat["gen_ai.operation.name"], "chat");
    assert_eq!(chat["gen_ai.request.model"], "small-model");
    assert_eq!(chat["gen_ai.response.model"], "small-model");
    assert_eq!(chat["gen_ai.usage.input_tokens"], "12");
    assert_eq!(chat["gen_ai.usage.output_tokens"], "3");
    let tool = find("execute_tool");
    assert_eq!(tool["gen_ai.operation.name"], "execute_tool");
    assert_eq!(tool["gen_ai.tool.name"], "ping");
    assert_eq!(tool["gen_ai.tool.call.id"], "call_1");
    assert_eq!(spans.iter().filter(|(n, _)| n == "chat").count(), 2);
}

/// A `fmt` subscriber's output, kept in memory.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buffer {
    fn lines(&self) -> Vec<String> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// What `tracing_subscriber::fmt().init()` prints (its default level is
/// `INFO`), into a buffer.
fn fmt_subscriber(buffer: &Buffer) -> impl tracing::Subscriber + Send + Sync {
    let buffer = buffer.clone();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .without_time()
        .with_writer(move || buffer.clone())
        .finish()
}

fn line<'a>(lines: &'a [String], needle: &str) -> &'a str {
    lines
        .iter()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in {lines:#?}"))
}

#[tokio::test(start_paused = true)]
async fn a_fmt_subscriber_shows_the_runs_progress() {
    let buffer = Buffer::default();
    let _guard = tracing::subscriber::set_default(fmt_subscriber(&buffer));

    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("ping", "{}").usage(tower_agent::Usage::new(12, 3)),
        ScriptedTurn::text("pong").usage(tower_agent::Usage::new(20, 5)),
    ])
    .latency(std::time::Duration::from_millis(40));
    let tools = ToolRouter::new().tool(tool_sync("ping", "Pings", |_: Nothing| {
        Ok::<_, BoxError>("pong")
    }));
    let agent = Agent::builder("tracer")
        .model(model)
        .model_name("small-model")
        .tools(tools)
        .build()
        .unwrap();
    let run = agent.run("hi").await.unwrap();

    let lines = buffer.lines();
    // In order: the run starts, two model calls and a tool call between
    // them, the run ends; no DEBUG lines at the default level.
    let progress: Vec<&str> = lines
        .iter()
        .filter_map(|l| {
            [
                "run started",
                "model call completed",
                "tool call completed",
                "run completed",
            ]
            .into_iter()
            .find(|m| l.contains(m))
        })
        .collect();
    assert_eq!(
        progress,
        [
            "run started",
            "model call completed",
            "tool call completed",
            "model call completed",
            "run completed"
        ],
        "{lines:#?}"
    );
    assert!(lines.iter().all(|l| l.starts_with(" INFO ")), "{lines:#?}");

    let started = line(&lines, "run started");
    assert!(started.contains("gen_ai.agent.name=tracer"), "{started}");
    assert!(
        started.contains(&format!("run_id={}", run.run_id)),
        "{started}"
    );

    let chat = line(&lines, "model call completed");
    for field in [
        "gen_ai.request.model=small-model",
        "gen_ai.response.model=small-model",
        "gen_ai.usage.input_tokens=12",
        "gen_ai.usage.output_tokens=3",
        "gen_ai.response.finish_reasons=ToolCalls",
        "turn=1",
        "duration_ms=40.0",
    ] {
        assert!(chat.contains(field), "{field} missing: {chat}");
    }
    // The event sits in its spans: the run's, then the call's.
    assert!(
        chat.contains("invoke_agent{") && chat.contains("}:chat{"),
        "{chat}"
    );

    let tool = line(&lines, "tool call completed");
    for field in [
        "gen_ai.tool.name=ping",
        "gen_ai.tool.call.id=call_1",
        "is_error=false",
        "duration_ms=0.0",
    ] {
        assert!(tool.contains(field), "{field} missing: {tool}");
    }

    let ended = line(&lines, "run completed");
    for field in [
        "status=\"completed\"",
        "turns=2",
        "tool_calls=1",
        "gen_ai.usage.input_tokens=32",
        "gen_ai.usage.output_tokens=8",
        "duration_ms=80.0",
    ] {
        assert!(ended.contains(field), "{field} missing: {ended}");
    }
}

#[tokio::test(start_paused = true)]
async fn failures_are_warnings_with_their_error_type() {
    let buffer = Buffer::default();
    let _guard = tracing::subscriber::set_default(fmt_subscriber(&buffer));

    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("explode", "{}"),
        ScriptedTurn::error(tower_agent::ErrorKind::Unavailable, "the provider is down"),
    ]);
    let tools = ToolRouter::new().tool(tool_sync(
        "explode",
        "Panics",
        |_: Nothing| -> Result<String, BoxError> { panic!("kaboom") },
    ));
    let agent = Agent::builder("tracer")
        .model(model)
        .tools(tools)
        .build()
        .unwrap();
    agent.run("hi").await.unwrap_err();

    let lines = buffer.lines();
    let panicked = line(&lines, "tool call panicked");
    assert!(panicked.starts_with(" WARN "), "{panicked}");
    assert!(panicked.contains("panic=kaboom"), "{panicked}");
    let failed = line(&lines, "model call failed");
    assert!(failed.starts_with(" WARN "), "{failed}");
    assert!(
        failed.contains("error.type=\"PROVIDER_UNAVAILABLE\"")
            && failed.contains("the provider is down"),
        "{failed}"
    );
    let ended = line(&lines, "run failed");
    assert!(ended.starts_with(" WARN "), "{ended}");
    assert!(
        ended.contains("error.type=\"PROVIDER_UNAVAILABLE\""),
        "{ended}"
    );
}

#[tokio::test]
async fn debug_shows_each_call_as_it_starts() {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("ping", "{}"),
        ScriptedTurn::text("pong"),
    ]);
    let tools = ToolRouter::new().tool(tool_sync("ping", "Pings", |_: Nothing| {
        Ok::<_, BoxError>("pong")
    }));
    let agent = Agent::builder("tracer")
        .model(model)
        .tools(tools)
        .build()
        .unwrap();
    agent.run("hi").await.unwrap();

    let lines = buffer.lines();
    let started = lines
        .iter()
        .filter(|l| l.contains("model call started"))
        .count();
    assert_eq!(started, 2, "{lines:#?}");
    assert!(line(&lines, "tool call started").contains("gen_ai.tool.name=ping"));
}
