//! [`ModelToolSelector`]: a cheap model picks the relevant tools from a
//! large set, its usage recorded under the selector's name.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{json, Value};

use super::ToolSelector;
use crate::context::RunContext;
use crate::error::BoxError;
use crate::lifecycle::builtin::side_call::call_as;
use crate::service::BoxModel;
use crate::types::{History, Message, ModelName, ModelRequest, ResponseFormat, Role, ToolSpec};

const INSTRUCTIONS: &str = "You select tools for an assistant. Given the user's request and the \
list of tools, pick the tools that are relevant to answering it, most relevant first. Answer \
with one JSON object and nothing else: {\"tools\": [\"name\", ...]}, using only names from the \
list.";

/// A selector that asks a model (a cheap one) which tools fit the user's
/// latest message: LangChain's `LLMToolSelectorMiddleware`.
///
/// The model gets the tools' names and descriptions and the latest user
/// message, and answers `{"tools": [...]}` (asked with a JSON schema whose
/// items are the tool names). Names it makes up are dropped; past
/// [`max_tools`](Self::max_tools) the rest are. The call runs in a child
/// context named after the selector (`tool-selector` unless
/// [`named`](Self::named)), so its usage lands in the run's
/// `usage_total` and in the ledger's entries under that name, exactly once.
/// An answer it cannot read is an error: the middleware then offers every
/// tool, or fails the run when
/// [`fail_closed`](super::ToolSelectionMiddleware::fail_closed).
///
/// ```
/// use tower_agent::lifecycle::builtin::tool_selection::{ModelToolSelector, ToolSelectionMiddleware};
/// use tower_agent::service::box_model;
/// use tower_agent::{ScriptedModel, ScriptedTurn};
///
/// let cheap = ScriptedModel::new([ScriptedTurn::text(r#"{"tools": ["search"]}"#)]);
/// let selection = ToolSelectionMiddleware::new(
///     ModelToolSelector::new(box_model(cheap)).model_name("small").max_tools(5),
/// )
/// .always_include(["handoff"]);
/// # let _ = selection;
/// ```
///
/// # Clone
///
/// Cheap: the model is a shared service.
#[derive(Clone)]
pub struct ModelToolSelector {
    model: BoxModel,
    model_name: ModelName,
    name: Arc<str>,
    max_tools: Option<usize>,
    instructions: Arc<str>,
}

impl fmt::Debug for ModelToolSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelToolSelector")
            .field("model_name", &self.model_name)
            .field("name", &self.name)
            .field("max_tools", &self.max_tools)
            .finish_non_exhaustive()
    }
}

impl ModelToolSelector {
    /// A selector asking `model` (with an empty model name, which the
    /// service fills in, unless [`model_name`](Self::model_name)).
    pub fn new(model: BoxModel) -> Self {
        Self {
            model,
            model_name: ModelName::default(),
            name: Arc::from("tool-selector"),
            max_tools: None,
            instructions: Arc::from(INSTRUCTIONS),
        }
    }

    /// The model name the request carries.
    pub fn model_name(mut self, name: impl Into<ModelName>) -> Self {
        self.model_name = name.into();
        self
    }

    /// The name its usage is recorded under (default `tool-selector`).
    pub fn named(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = name.into();
        self
    }

    /// At most `max` tools per call (default: as many as the model picks).
    pub fn max_tools(mut self, max: usize) -> Self {
        self.max_tools = Some(max);
        self
    }

    /// Replaces the instructions (the system message before the list).
    pub fn instructions(mut self, instructions: impl Into<Arc<str>>) -> Self {
        self.instructions = instructions.into();
        self
    }

    fn request(&self, query: &str, tools: &[ToolSpec]) -> ModelRequest {
        let mut listing = String::with_capacity(tools.len() * 48);
        for tool in tools {
            listing.push_str("- ");
            listing.push_str(&tool.name);
            if !tool.description.is_empty() {
                listing.push_str(": ");
                listing.push_str(&tool.description);
            }
            listing.push('\n');
        }
        let system = format!("{}\n\nThe tools:\n{listing}", self.instructions);
        let mut request = ModelRequest::new(
            self.model_name.clone(),
            vec![Message::system(system), Message::user(query)],
        );
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        let mut array = json!({"type": "array", "items": {"type": "string", "enum": names}});
        if let Some(max) = self.max_tools {
            array["maxItems"] = json!(max);
        }
        request.settings_mut().response_format = Some(ResponseFormat::json_schema(
            "tool_selection",
            json!({
                "type": "object",
                "properties": {"tools": array},
                "required": ["tools"],
                "additionalProperties": false
            }),
        ));
        request
    }

    /// Reads the answer: the known names, in its order, without repeats, at
    /// most `max_tools`.
    fn parse(&self, answer: &str, tools: &[ToolSpec]) -> Result<Vec<String>, BoxError> {
        let trimmed = answer.trim();
        let object = trimmed
            .find('{')
            .zip(trimmed.rfind('}'))
            .and_then(|(a, b)| serde_json::from_str::<Value>(&trimmed[a..=b]).ok());
        let list = match object {
            Some(Value::Object(mut map)) => map.remove("tools"),
            _ => serde_json::from_str::<Value>(trimmed).ok(),
        };
        let Some(Value::Array(items)) = list else {
            return Err(format!(
                "the tool selector `{}` answered no list of tools: {trimmed:.120}",
                self.name
            )
            .into());
        };
        let mut picked: Vec<String> = Vec::new();
        for item in items {
            let Some(name) = item.as_str() else { continue };
            if tools.iter().any(|t| t.name == name) && !picked.iter().any(|p| p == name) {
                picked.push(name.to_owned());
            }
        }
        if let Some(max) = self.max_tools {
            picked.truncate(max);
        }
        Ok(picked)
    }
}

impl ToolSelector for ModelToolSelector {
    fn select<'a>(
        &'a self,
        ctx: &'a RunContext,
        messages: &'a History,
        tools: &'a [ToolSpec],
    ) -> BoxFuture<'a, Result<Vec<String>, BoxError>> {
        Box::pin(async move {
            let query = messages
                .iter()
                .rev()
                .find(|m| m.role == Role::User)
                .map(|m| m.text().into_owned());
            let Some(query) = query else {
                // Nothing to select for: every tool.
                return Ok(tools.iter().map(|t| t.name.clone()).collect());
            };
            let request = self.request(&query, tools);
            let response = call_as(&self.model, ctx, &self.name, request).await?;
            self.parse(&response.message.text(), tools)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::box_model;
    use crate::{ScriptedModel, ScriptedTurn};

    fn tools(n: usize) -> Vec<ToolSpec> {
        (0..n)
            .map(|i| ToolSpec::new(format!("tool_{i}"), format!("does {i}"), json!({})))
            .collect()
    }

    #[test]
    fn reads_known_names_in_order_at_most_max() {
        let selector = ModelToolSelector::new(box_model(ScriptedModel::new([]))).max_tools(2);
        let tools = tools(5);
        let picked = selector
            .parse(
                r#"Sure: {"tools": ["tool_3", "made_up", "tool_3", "tool_1", "tool_0"]}"#,
                &tools,
            )
            .unwrap();
        assert_eq!(picked, ["tool_3", "tool_1"]);
        assert_eq!(selector.parse(r#"["tool_4"]"#, &tools).unwrap(), ["tool_4"]);
        assert!(selector.parse("I cannot say", &tools).is_err());
    }

    #[tokio::test]
    async fn asks_with_the_listing_and_records_usage_under_its_name() {
        let cheap = ScriptedModel::new([
            ScriptedTurn::text(r#"{"tools": ["tool_1"]}"#).usage(crate::Usage::new(30, 4))
        ]);
        let selector = ModelToolSelector::new(box_model(cheap.clone())).model_name("small");
        let ctx = RunContext::new();
        let history = History::from(vec![Message::user("do one")]);
        let picked = selector.select(&ctx, &history, &tools(3)).await.unwrap();
        assert_eq!(picked, ["tool_1"]);
        let asked = &cheap.requests()[0];
        assert_eq!(asked.model.as_str(), "small");
        assert!(asked
            .messages
            .first()
            .unwrap()
            .text()
            .contains("- tool_2: does 2"));
        assert_eq!(asked.messages.last().unwrap().text(), "do one");
        assert_eq!(
            ctx.usage(),
            crate::Usage::default(),
            "not the run's own call"
        );
        assert_eq!(ctx.total_usage(), crate::Usage::new(30, 4));
        let entries = ctx.usage_entries();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].agent.as_deref(), Some("tool-selector"));
        // No user message: every tool, and no model call.
        let none = selector
            .select(&ctx, &History::new(), &tools(2))
            .await
            .unwrap();
        assert_eq!(none, ["tool_0", "tool_1"]);
        assert_eq!(cheap.requests().len(), 1);
    }
}
