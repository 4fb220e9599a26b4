//! [`PolicyConfig`]: a tool policy as data, and [`PolicyError`].

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{PermissionMode, Rule, ToolPolicyMiddleware};

/// Why a tool policy could not be read or built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A rule that cannot work: an empty tool pattern, a JSON Pointer that
    /// is not one, a condition that tests nothing, a regex that does not
    /// compile.
    #[error("tool policy rule `{rule}`: {problem}")]
    InvalidRule {
        /// The rule's name, or its position and what it does.
        rule: String,
        /// What is wrong.
        problem: String,
    },
    /// The text is not a policy in this format (an unknown field among
    /// others: a typo is an error, not a rule that never matches).
    #[error("tool policy: the {format} does not parse: {message}")]
    Parse {
        /// `JSON` or `TOML`.
        format: &'static str,
        /// The parser's message.
        message: String,
    },
    /// The file could not be read, or its extension names no format.
    #[error("tool policy file {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// A tool policy as data: its permission mode and its rules, in order, read
/// from JSON or TOML (feature `toml`). Unknown fields are refused.
///
///
/// ```
/// use tower_agent::lifecycle::builtin::policy::{PermissionMode, PolicyConfig};
///
/// let config = PolicyConfig::from_json(r#"{
///     "mode": "default",
///     "rules": [
///         {"name": "large-transfers", "action": "deny", "tool": "transfer",
///          "when": [{"pointer": "/amount", "gt": 1000}],
///          "reason": "transfers above 1000 go through a person"},
///         {"action": "ask", "tool": "mcp__github__*"},
///         {"action": "allow", "read_only": true}
///     ]
/// }"#).unwrap();
/// assert_eq!(config.mode, PermissionMode::Default);
/// assert_eq!(config.rules.len(), 3);
/// let policy = config.build().unwrap();
/// # let _ = policy;
/// ```
///
/// The same in TOML:
///
/// ```toml
/// mode = "default"
///
/// [[rules]]
/// name = "large-transfers"
/// action = "deny"
/// tool = "transfer"
/// when = [{ pointer = "/amount", gt = 1000 }]
/// reason = "transfers above 1000 go through a person"
///
/// [[rules]]
/// action = "ask"
/// tool = "mcp__github__*"
///
/// [[rules]]
/// action = "allow"
/// read_only = true
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// The mode of runs that set none.
    #[serde(default)]
    pub mode: PermissionMode,
    /// The rules.
    #[serde(default)]
    pub rules: Vec<Rule>,
}

impl PolicyConfig {
    /// Reads a policy from JSON.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Parse`].
    pub fn from_json(text: &str) -> Result<Self, PolicyError> {
        serde_json::from_str(text).map_err(|e| PolicyError::Parse {
            format: "JSON",
            message: e.to_string(),
        })
    }

    /// Reads a policy from TOML.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Parse`].
    #[cfg(feature = "toml")]
    pub fn from_toml(text: &str) -> Result<Self, PolicyError> {
        toml::from_str(text).map_err(|e| PolicyError::Parse {
            format: "TOML",
            message: e.to_string(),
        })
    }

    /// Reads a policy from a file: `.json`, or `.toml` with the feature
    /// `toml`.
    ///
    /// # Errors
    ///
    /// [`PolicyError::File`] when it cannot be read or its extension names
    /// no format it reads, [`PolicyError::Parse`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self, PolicyError> {
        let path = path.as_ref();
        let file = |message: String| PolicyError::File {
            path: path.to_owned(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file(e.to_string()))?;
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => Self::from_json(&text),
            #[cfg(feature = "toml")]
            Some("toml") => Self::from_toml(&text),
            _ => Err(file(if cfg!(feature = "toml") {
                "the extension must be .json or .toml".into()
            } else {
                "the extension must be .json (.toml needs the feature `toml`)".into()
            })),
        }
    }

    /// The middleware enforcing this policy.
    ///
    /// # Errors
    ///
    /// [`PolicyError::InvalidRule`].
    pub fn build(self) -> Result<ToolPolicyMiddleware, PolicyError> {
        ToolPolicyMiddleware::builder()
            .mode(self.mode)
            .rules(self.rules)
            .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::builtin::policy::{ArgCondition, RuleAction};

    #[test]
    fn json_reads_rules_and_refuses_typos() {
        let config = PolicyConfig::from_json(
            r#"{"mode": "auto", "rules": [{"action": "deny", "tool": "transfer",
                "when": [{"pointer": "/amount", "gt": 1000}]}]}"#,
        )
        .unwrap();
        assert_eq!(config.mode, PermissionMode::Auto);
        assert_eq!(
            config.rules,
            [Rule::deny("transfer").when(ArgCondition::at("/amount").gt(1000.0))]
        );
        let typo = PolicyConfig::from_json(r#"{"rules": [{"action": "deny", "tol": "x"}]}"#);
        assert!(
            matches!(&typo, Err(PolicyError::Parse { format: "JSON", message }) if message.contains("tol")),
            "{typo:?}"
        );
        let bad_action = PolicyConfig::from_json(r#"{"rules": [{"action": "maybe"}]}"#);
        assert!(matches!(bad_action, Err(PolicyError::Parse { .. })));
        // The default tool is every tool.
        let all = PolicyConfig::from_json(r#"{"rules": [{"action": "ask"}]}"#).unwrap();
        assert_eq!(all.rules[0].tool, "*");
        assert_eq!(all.rules[0].action, RuleAction::Ask);
    }

    #[cfg(feature = "toml")]
    #[test]
    fn toml_reads_the_same_policy_as_json() {
        let toml = PolicyConfig::from_toml(
            r#"
            mode = "dont_ask"
            [[rules]]
            name = "large"
            action = "deny"
            tool = "transfer"
            when = [{ pointer = "/amount", gt = 1000 }, { pointer = "/currency", one_of = ["EUR", "USD"] }]
            reason = "too much"
            [[rules]]
            action = "allow"
            read_only = true
            "#,
        )
        .unwrap();
        let json = PolicyConfig::from_json(
            r#"{"mode": "dont_ask", "rules": [
                {"name": "large", "action": "deny", "tool": "transfer", "reason": "too much",
                 "when": [{"pointer": "/amount", "gt": 1000.0},
                          {"pointer": "/currency", "one_of": ["EUR", "USD"]}]},
                {"action": "allow", "read_only": true}]}"#,
        )
        .unwrap();
        assert_eq!(toml, json);
        assert!(matches!(
            PolicyConfig::from_toml("mode = \"sometimes\""),
            Err(PolicyError::Parse { format: "TOML", .. })
        ));
    }

    #[test]
    fn files_by_extension() {
        let dir = std::env::temp_dir().join(format!("tower-agent-policy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json = dir.join("policy.json");
        std::fs::write(&json, r#"{"rules": [{"action": "deny", "tool": "rm_*"}]}"#).unwrap();
        assert_eq!(
            PolicyConfig::load(&json).unwrap().rules,
            [Rule::deny("rm_*")]
        );
        let yaml = dir.join("policy.yaml");
        std::fs::write(&yaml, "rules: []").unwrap();
        assert!(matches!(
            PolicyConfig::load(&yaml),
            Err(PolicyError::File { .. })
        ));
        assert!(matches!(
            PolicyConfig::load(dir.join("missing.json")),
            Err(PolicyError::File { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_invalid_rule_does_not_build() {
        let config = PolicyConfig::from_json(
            r#"{"rules": [{"action": "deny", "when": [{"pointer": "/a"}]}]}"#,
        )
        .unwrap();
        let err = config.build().unwrap_err();
        assert!(err.to_string().contains("tests nothing"), "{err}");
    }
}
