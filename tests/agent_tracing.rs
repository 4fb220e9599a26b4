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
