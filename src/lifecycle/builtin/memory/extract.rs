//! Extraction: a model reads a finished run and writes memory items
//! ([`MemoryExtractor`], [`ModelExtractor`]).

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::Value;

use crate::context::RunContext;
use crate::error::BoxError;
use crate::lifecycle::builtin::side_call::call_recorded;
use crate::memory::MemoryItem;
use crate::request::{box_model, BoxModel, ModelCall};
use crate::types::{Message, ModelName, ModelRequest, ModelResponse, Role};

const INSTRUCTIONS: &str = "You keep an assistant's long-term memory. The user message holds the \
latest conversation, one message per line as [number] role: text, then the memories already kept. \
Write down what is worth remembering in later conversations: durable facts about the user or their \
world, their preferences, standing instructions, decisions and open commitments. Skip small talk, \
anything only true for this moment, and anything already kept. Each memory is one short sentence \
that makes sense on its own. Answer with one JSON object and nothing else: \
{\"memories\": [{\"kind\": \"fact|preference|instruction|event\", \"text\": \"...\", \"message\": <number of the message it comes from>}]} \
and {\"memories\": []} when there is nothing new.";

/// What an extraction reads: the messages of the run that are new to the
/// thread, and the items already kept.
#[derive(Debug, Clone, Copy)]
pub struct ExtractionRequest<'a> {
    /// The run's new messages.
    pub messages: &'a [Message],
    /// The position of `messages[0]` in the run's transcript: what an
    /// [`Extracted::message`] counts from.
    pub first_index: usize,
    /// The items already kept in the namespace, so as not to repeat them.
    pub known: &'a [MemoryItem],
}

/// One memory item an extraction found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted {
    /// `fact`, `preference`, `instruction`, `event`, ...
    pub kind: String,
    /// What to remember.
    pub text: String,
    /// The position in the run's transcript of the message it comes from.
    pub message: Option<usize>,
}

/// Reads a finished run and writes memory items.
///
/// An extractor that calls a model should send its call with the context it
/// is given (`ModelCall::new(request, ctx.clone())`): the middleware hands it
/// a child of the run's context named after the middleware, so the usage
/// lands in the run's ledger under that name.
pub trait MemoryExtractor: Send + Sync + 'static {
    /// The items worth keeping from `request`.
    fn extract<'a>(
        &'a self,
        ctx: &'a RunContext,
        request: ExtractionRequest<'a>,
    ) -> BoxFuture<'a, Result<Vec<Extracted>, BoxError>>;
}

/// The [`MemoryExtractor`] that asks a model: the run's new messages go to
/// `model` numbered, with the items already kept, and the model answers a
/// JSON object `{"memories": [{"kind", "text", "message"}]}` (a bare array
/// is read too, and so is JSON inside a code fence). An answer it cannot
/// read is an error, which the middleware logs.
///
/// ```
/// use tower_agent::lifecycle::builtin::ModelExtractor;
/// use tower_agent::{ScriptedModel, ScriptedTurn};
///
/// let extractor = ModelExtractor::new(ScriptedModel::new([ScriptedTurn::text(
///     r#"{"memories": [{"kind": "preference", "text": "Prefers metric units", "message": 1}]}"#,
/// )]))
/// .model_name("small-model");
/// # let _ = extractor;
/// ```
///
/// # Clone
///
/// Cheap: the model is a shared service.
#[derive(Clone)]
pub struct ModelExtractor {
    model: BoxModel,
    model_name: ModelName,
    instructions: Arc<str>,
    max_chars: usize,
}

impl fmt::Debug for ModelExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelExtractor")
            .field("model_name", &self.model_name)
            .finish_non_exhaustive()
    }
}

impl ModelExtractor {
    /// An extractor asking `model` (as model name `memory` unless
    /// [`model_name`](Self::model_name) says otherwise).
    pub fn new<S>(model: S) -> Self
    where
        S: tower::Service<ModelCall, Response = ModelResponse> + Clone + Send + Sync + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        Self {
            model: box_model(model),
            model_name: ModelName::from("memory"),
            instructions: Arc::from(INSTRUCTIONS),
            max_chars: 2_000,
        }
    }

    /// The model name the requests carry.
    pub fn model_name(mut self, name: impl Into<ModelName>) -> Self {
        self.model_name = name.into();
        self
    }

    /// Replaces the system prompt (it must still ask for the JSON shape
    /// above).
    pub fn instructions(mut self, instructions: impl Into<Arc<str>>) -> Self {
        self.instructions = instructions.into();
        self
    }

    /// Cuts each message to this many characters in the prompt (default
    /// 2,000).
    pub fn max_chars(mut self, max_chars: usize) -> Self {
        self.max_chars = max_chars.max(1);
        self
    }

    /// The user message: the numbered conversation, then the known items.
    fn prompt(&self, request: &ExtractionRequest<'_>) -> String {
        let mut prompt = String::from("Conversation:\n");
        for (i, message) in request.messages.iter().enumerate() {
            if message.role == Role::System {
                continue;
            }
            let mut text: String = message.text().chars().take(self.max_chars).collect();
            for call in &message.tool_calls {
                text.push_str(&format!(" [calls {}({})]", call.name, call.arguments));
            }
            prompt.push_str(&format!(
                "[{}] {}: {}\n",
                request.first_index + i,
                message.role.as_str(),
                text.replace('\n', " ")
            ));
        }
        prompt.push_str("\nAlready kept:\n");
        if request.known.is_empty() {
            prompt.push_str("(nothing)\n");
        }
        for item in request.known {
            prompt.push_str(&format!("- [{}] {}\n", item.kind, item.text));
        }
        prompt
    }
}

impl MemoryExtractor for ModelExtractor {
    fn extract<'a>(
        &'a self,
        ctx: &'a RunContext,
        request: ExtractionRequest<'a>,
    ) -> BoxFuture<'a, Result<Vec<Extracted>, BoxError>> {
        Box::pin(async move {
            let model_request = ModelRequest::new(
                self.model_name.clone(),
                vec![
                    Message::system(&*self.instructions),
                    Message::user(self.prompt(&request)),
                ],
            );
            let response = call_recorded(&self.model, ctx, model_request).await?;
            let range = request.first_index..request.first_index + request.messages.len();
            let mut items = parse_memories(&response.message.text())?;
            for item in &mut items {
                item.message = item.message.filter(|m| range.contains(m));
            }
            Ok(items)
        })
    }
}

#[derive(Deserialize)]
struct WireMemory {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    message: Option<Value>,
}

/// Reads a model's answer: `{"memories": [...]}` or a bare array, possibly
/// inside other text (a code fence). Items without text are dropped; a
/// missing kind is `fact`.
///
/// # Errors
///
/// When the answer holds no such JSON.
pub fn parse_memories(answer: &str) -> Result<Vec<Extracted>, BoxError> {
    let unreadable = || -> BoxError {
        format!(
            "the extraction model's answer is not a JSON list of memories: {}",
            answer.chars().take(200).collect::<String>()
        )
        .into()
    };
    let start = answer.find(['{', '[']).ok_or_else(unreadable)?;
    let end = answer.rfind(['}', ']']).ok_or_else(unreadable)?;
    if end < start {
        return Err(unreadable());
    }
    let value: Value = serde_json::from_str(&answer[start..=end]).map_err(|_| unreadable())?;
    let list = match value {
        Value::Array(list) => list,
        Value::Object(mut object) => match object.remove("memories") {
            Some(Value::Array(list)) => list,
            _ => return Err(unreadable()),
        },
        _ => return Err(unreadable()),
    };
    Ok(list
        .into_iter()
        .filter_map(|v| serde_json::from_value::<WireMemory>(v).ok())
        .filter_map(|m| {
            let text = m.text?.trim().to_owned();
            (!text.is_empty()).then(|| Extracted {
                kind: m
                    .kind
                    .map(|k| k.trim().to_lowercase())
                    .filter(|k| !k.is_empty())
                    .unwrap_or_else(|| "fact".to_owned()),
                text,
                message: m.message.and_then(|v| match v {
                    Value::Number(n) => n.as_u64().map(|n| n as usize),
                    Value::String(s) => s.trim().parse().ok(),
                    _ => None,
                }),
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::{ScriptedModel, ScriptedTurn};
    use crate::types::Usage;

    #[test]
    fn reads_an_object_an_array_and_a_fenced_answer() {
        let object = parse_memories(
            r#"{"memories": [{"kind": "Preference", "text": " metric ", "message": 3}, {"text": ""}]}"#,
        )
        .unwrap();
        assert_eq!(
            object,
            [Extracted {
                kind: "preference".into(),
                text: "metric".into(),
                message: Some(3)
            }]
        );
        let array = parse_memories(r#"[{"text": "lives in Lyon", "message": "2"}]"#).unwrap();
        assert_eq!(
            (array[0].kind.as_str(), array[0].message),
            ("fact", Some(2))
        );
        let fenced = parse_memories("Sure:\n```json\n{\"memories\": []}\n```").unwrap();
        assert!(fenced.is_empty());
        assert!(parse_memories("nothing to keep").is_err());
        assert!(parse_memories(r#"{"other": 1}"#).is_err());
        assert!(parse_memories("} {").is_err());
    }

    #[tokio::test]
    async fn asks_the_model_with_numbered_messages_and_records_usage_once() {
        let model = ScriptedModel::new([ScriptedTurn::text(
            r#"{"memories": [{"kind": "fact", "text": "Lives in Lyon", "message": 4}, {"text": "x", "message": 99}]}"#,
        )
        .usage(Usage::new(30, 8))]);
        let extractor = ModelExtractor::new(model.clone()).model_name("small");
        let ctx = RunContext::new();
        let messages = [
            Message::user("I live in Lyon"),
            Message::assistant("Noted."),
        ];
        let known = [MemoryItem::new("n", "preference", "Metric units", 0)];
        let items = extractor
            .extract(
                &ctx,
                ExtractionRequest {
                    messages: &messages,
                    first_index: 4,
                    known: &known,
                },
            )
            .await
            .unwrap();
        assert_eq!(items[0].message, Some(4));
        assert_eq!(items[1].message, None, "out of the run's range");
        assert_eq!(ctx.usage(), Usage::new(30, 8));
        let sent = model.requests();
        let prompt = sent[0].messages[1].text().into_owned();
        assert!(prompt.contains("[4] user: I live in Lyon"));
        assert!(prompt.contains("[5] assistant: Noted."));
        assert!(prompt.contains("- [preference] Metric units"));
        assert_eq!(&*sent[0].model, "small");
    }
}
