//! Structured output: the response schema, and checking a final answer.

use std::sync::Arc;

use serde_json::Value;

use crate::error::AgentError;
use crate::types::ResponseFormat;

/// A compiled response schema.
pub(crate) struct OutputSchema {
    name: String,
    schema: Value,
    validator: Arc<jsonschema::Validator>,
    pub(crate) retries: u32,
}

impl OutputSchema {
    pub(crate) fn new(agent: &str, schema: Value, retries: u32) -> Result<Self, AgentError> {
        let validator = jsonschema::validator_for(&schema).map_err(|e| {
            AgentError::Config(format!("the response schema does not compile: {e}"))
        })?;
        let name: String = agent
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        Ok(Self {
            name: format!("{name}_output"),
            schema,
            validator: Arc::new(validator),
            retries,
        })
    }

    /// The schema as given.
    pub(crate) fn schema(&self) -> &Value {
        &self.schema
    }

    pub(crate) fn response_format(&self) -> ResponseFormat {
        ResponseFormat::json_schema(self.name.clone(), self.schema.clone())
    }

    /// Parses and validates a final answer. Tolerates a Markdown code fence
    /// around the JSON, as models often add one.
    ///
    /// # Errors
    ///
    /// What is wrong, worded for the model to fix.
    pub(crate) fn check(&self, text: &str) -> Result<Value, String> {
        let json = strip_fence(text.trim());
        let value: Value = serde_json::from_str(json)
            .map_err(|e| format!("Your answer is not valid JSON ({e})."))?;
        let errors: Vec<String> = self
            .validator
            .iter_errors(&value)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() {
                    e.to_string()
                } else {
                    format!("at {path}: {e}")
                }
            })
            .collect();
        if errors.is_empty() {
            Ok(value)
        } else {
            Err(format!(
                "Your answer does not match the required JSON schema: {}.",
                errors.join("; ")
            ))
        }
    }
}

fn strip_fence(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else {
        return text;
    };
    let rest = rest.split_once('\n').map_or(rest, |(_lang, body)| body);
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn checks_and_explains() {
        let schema = OutputSchema::new(
            "a b",
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
            1,
        )
        .unwrap();
        assert_eq!(
            schema.check("```json\n{\"n\": 3}\n```"),
            Ok(json!({"n": 3}))
        );
        assert!(schema.check("nope").unwrap_err().contains("not valid JSON"));
        let err = schema.check(r#"{"n": "x"}"#).unwrap_err();
        assert!(err.contains("/n") && err.contains("integer"), "{err}");
        assert!(matches!(
            schema.response_format(),
            ResponseFormat::JsonSchema { json_schema } if json_schema.name == "a_b_output"
        ));
    }
}
