//! What crosses between MCP and the crate: tool names (prefixed per server,
//! filtered), input schemas (to [`ToolSpec`]) and call results (to
//! [`ToolOutput`]).

use rmcp::model::{CallToolResult, ContentBlock, ResourceContents, Tool};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::request::ToolOutput;
use crate::types::ToolSpec;

/// The longest tool name the model providers accept.
pub(crate) const MAX_NAME_LEN: usize = 64;

/// Which of a server's tools are exposed: a tool is kept when the allow list
/// is empty or names it, and the deny list does not; a deny always wins.
/// A pattern is an exact name, or a prefix ending in `*`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolFilter {
    allow: Vec<String>,
    deny: Vec<String>,
}

impl ToolFilter {
    /// A filter keeping every tool.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps only the tools matching one of `patterns` (added to earlier ones).
    pub fn allow<I, S>(mut self, patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.allow.extend(patterns.into_iter().map(Into::into));
        self
    }

    /// Drops the tools matching one of `patterns` (added to earlier ones).
    pub fn deny<I, S>(mut self, patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.deny.extend(patterns.into_iter().map(Into::into));
        self
    }

    /// Whether the server's tool `name` is exposed.
    pub fn keeps(&self, name: &str) -> bool {
        let matches = |p: &String| match p.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => p == name,
        };
        (self.allow.is_empty() || self.allow.iter().any(matches)) && !self.deny.iter().any(matches)
    }
}

/// The name the model calls a server's tool by: `prefix` + `separator` +
/// the tool's name, with every character a provider refuses replaced by `_`,
/// and at most 64 characters (a longer name keeps its start and ends with a
/// hash of the whole, so two long names still differ).
pub(crate) fn prefixed_name(prefix: &str, separator: &str, name: &str) -> String {
    let joined = if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}{separator}{name}")
    };
    let clean: String = joined
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.len() <= MAX_NAME_LEN {
        return clean;
    }
    let digest = Sha256::digest(joined.as_bytes());
    let hash: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}_{hash}", &clean[..MAX_NAME_LEN - 9])
}

/// The spec the model sees for a server's tool, under `name`.
///
/// The input schema is kept as the server wrote it, made an object schema
/// with `properties` where it lacked them (some providers refuse a bare
/// `{"type": "object"}`). The description falls back to the title.
pub(crate) fn tool_spec(name: String, tool: &Tool) -> ToolSpec {
    let mut schema: Map<String, Value> = (*tool.input_schema).clone();
    schema
        .entry("type")
        .or_insert_with(|| Value::String("object".into()));
    if schema.get("type") == Some(&Value::String("object".into())) {
        schema
            .entry("properties")
            .or_insert_with(|| Value::Object(Map::new()));
    }
    let description = tool
        .description
        .as_deref()
        .map(str::to_owned)
        .or_else(|| tool.title.clone())
        .or_else(|| tool.annotations.as_ref().and_then(|a| a.title.clone()))
        .unwrap_or_default();
    ToolSpec::new(name, description, Value::Object(schema))
}

/// The text a content block becomes. Binary content is described, not
/// inlined: the model reads a placeholder with its type and size.
fn content_text(block: &ContentBlock) -> String {
    match block {
        ContentBlock::Text(text) => text.text.clone(),
        ContentBlock::Image(image) => format!(
            "[image: {}, {} bytes]",
            image.mime_type,
            base64_len(&image.data)
        ),
        ContentBlock::Audio(audio) => format!(
            "[audio: {}, {} bytes]",
            audio.mime_type,
            base64_len(&audio.data)
        ),
        ContentBlock::Resource(embedded) => match &embedded.resource {
            ResourceContents::TextResourceContents { uri, text, .. } => {
                format!("[resource {uri}]\n{text}")
            }
            ResourceContents::BlobResourceContents {
                uri,
                mime_type,
                blob,
                ..
            } => format!(
                "[resource {uri}: {}, {} bytes]",
                mime_type.as_deref().unwrap_or("application/octet-stream"),
                base64_len(blob)
            ),
            other => serde_json::to_string(other).unwrap_or_default(),
        },
        ContentBlock::ResourceLink(link) => match &link.description {
            Some(description) => format!("[resource link {}: {description}]", link.uri),
            None => format!("[resource link {}]", link.uri),
        },
        // Content kinds newer than this crate: their JSON, so nothing is lost.
        #[allow(unreachable_patterns)]
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

/// How many bytes a base64 text decodes to.
fn base64_len(data: &str) -> usize {
    let data = data.trim_end_matches('=');
    data.len() * 3 / 4
}

/// The result of a `tools/call` as the model reads it: the content blocks'
/// texts, one per line; the structured content as JSON when there is no
/// text (a server also sending text has serialized it there already). An
/// `isError` result is an error result.
pub(crate) fn tool_output(result: CallToolResult) -> ToolOutput {
    let mut parts: Vec<String> = result.content.iter().map(content_text).collect();
    if parts.iter().all(|p| p.is_empty()) {
        parts.clear();
        if let Some(structured) = &result.structured_content {
            parts.push(structured.to_string());
        }
    }
    let content = parts.join("\n");
    if result.is_error.unwrap_or(false) {
        ToolOutput::error(if content.is_empty() {
            "the tool reported an error without a message".to_owned()
        } else {
            content
        })
    } else {
        ToolOutput::text(content)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rmcp::model::ImageContent;
    use serde_json::json;

    use super::*;

    fn tool(schema: Value) -> Tool {
        let Value::Object(map) = schema else {
            panic!("schema")
        };
        Tool::new("echo", "Echoes", Arc::new(map))
    }

    #[test]
    fn the_filter_keeps_allowed_names_and_a_deny_always_wins() {
        let all = ToolFilter::new();
        assert!(all.keeps("anything"));
        let f = ToolFilter::new()
            .allow(["read_*", "echo"])
            .deny(["read_secret"]);
        assert!(f.keeps("echo"));
        assert!(f.keeps("read_file"));
        assert!(!f.keeps("read_secret"));
        assert!(!f.keeps("write_file"));
        let deny_only = ToolFilter::new().deny(["*"]);
        assert!(!deny_only.keeps("echo"));
    }

    #[test]
    fn names_are_prefixed_cleaned_and_bounded() {
        assert_eq!(
            prefixed_name("github", "__", "create_issue"),
            "github__create_issue"
        );
        assert_eq!(prefixed_name("", "__", "echo"), "echo");
        assert_eq!(
            prefixed_name("fs", "__", "read.file v2"),
            "fs__read_file_v2"
        );
        let long_a = prefixed_name("server", "__", &"a".repeat(80));
        let long_b = prefixed_name("server", "__", &format!("{}b", "a".repeat(79)));
        assert_eq!(long_a.len(), MAX_NAME_LEN);
        assert_eq!(long_b.len(), MAX_NAME_LEN);
        assert_ne!(long_a, long_b, "two long names keep apart");
        assert!(long_a.starts_with("server__aaa"));
    }

    #[test]
    fn an_input_schema_becomes_an_object_spec() {
        let spec = tool_spec(
            "s__echo".into(),
            &tool(
                json!({"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}),
            ),
        );
        assert_eq!(spec.name, "s__echo");
        assert_eq!(spec.description, "Echoes");
        assert_eq!(spec.parameters["required"], json!(["message"]));
        assert_eq!(spec.parameters["properties"]["message"]["type"], "string");

        let bare = tool_spec("s__noop".into(), &tool(json!({})));
        assert_eq!(bare.parameters, json!({"type": "object", "properties": {}}));
        jsonschema::validator_for(&bare.parameters).expect("a valid schema");
    }

    #[test]
    fn text_image_structured_and_error_results_map_to_tool_outputs() {
        let text =
            CallToolResult::success(vec![ContentBlock::text("one"), ContentBlock::text("two")]);
        assert_eq!(tool_output(text), ToolOutput::text("one\ntwo"));

        let image = CallToolResult::success(vec![ContentBlock::Image(ImageContent::new(
            "AAAA",
            "image/png",
        ))]);
        assert_eq!(
            tool_output(image),
            ToolOutput::text("[image: image/png, 3 bytes]")
        );

        let structured = CallToolResult::structured(json!({"sum": 5}));
        let out = tool_output(structured);
        assert!(!out.is_error);
        assert!(out.content.contains("\"sum\":5"), "{}", out.content);

        let failed = CallToolResult::error(vec![ContentBlock::text("no such file")]);
        assert_eq!(tool_output(failed), ToolOutput::error("no such file"));
        let silent = CallToolResult::error(vec![]);
        assert!(tool_output(silent).is_error);
    }
}
