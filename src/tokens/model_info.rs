//! [`ModelInfoTable`]: each model's context window and output limit.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a model can take and give: its context window and the most tokens
/// it writes in one answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// The tokens of input and output together the model can attend to.
    pub context_window: u64,
    /// The most tokens it writes in one answer.
    pub max_output: u64,
}

impl ModelInfo {
    /// A model with this window and output limit.
    pub const fn new(context_window: u64, max_output: u64) -> Self {
        Self {
            context_window,
            max_output,
        }
    }

    /// The input tokens that leave room for a full answer.
    pub const fn max_input(&self) -> u64 {
        self.context_window.saturating_sub(self.max_output)
    }
}

/// Context windows and output limits by model name: a built-in table of the
/// common OpenAI, Anthropic and Google models, extended or overridden in
/// code or from JSON.
///
/// A pattern is a model name or a prefix ending in `*`. A provider prefix
/// (`openai/`) is ignored. An exact name beats every prefix, and the
/// longest matching prefix beats shorter ones, whatever the order they were
/// added in; adding a pattern again replaces it.
///
/// ```
/// use tower_agent::tokens::{ModelInfo, ModelInfoTable};
///
/// let table = ModelInfoTable::builtin()
///     .model("my-local-model", ModelInfo::new(32_768, 4_096))
///     .json(r#"[{"model": "acme-*", "context_window": 65536, "max_output": 8192}]"#)
///     .unwrap();
/// assert_eq!(table.get("gpt-4o-mini").unwrap().context_window, 128_000);
/// assert_eq!(table.get("openai/gpt-4o").unwrap().max_output, 16_384);
/// assert_eq!(table.get("acme-large").unwrap().context_window, 65_536);
/// assert_eq!(table.get("my-local-model").unwrap().max_input(), 28_672);
/// assert!(table.get("unknown").is_none());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelInfoTable {
    exact: BTreeMap<String, ModelInfo>,
    prefixes: BTreeMap<String, ModelInfo>,
}

/// One entry of the JSON form.
#[derive(Deserialize)]
struct Entry {
    model: String,
    context_window: u64,
    max_output: u64,
}

impl ModelInfoTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The built-in table (public figures of each family's models).
    pub fn builtin() -> Self {
        const K: u64 = 1_000;
        [
            ("gpt-5*", ModelInfo::new(400 * K, 128 * K)),
            ("gpt-4.1*", ModelInfo::new(1_047_576, 32_768)),
            ("gpt-4o*", ModelInfo::new(128 * K, 16_384)),
            ("gpt-4-turbo*", ModelInfo::new(128 * K, 4_096)),
            ("gpt-4", ModelInfo::new(8_192, 8_192)),
            ("gpt-3.5-turbo*", ModelInfo::new(16_385, 4_096)),
            ("o1*", ModelInfo::new(200 * K, 100 * K)),
            ("o3*", ModelInfo::new(200 * K, 100 * K)),
            ("o4*", ModelInfo::new(200 * K, 100 * K)),
            ("claude-opus-4*", ModelInfo::new(200 * K, 32 * K)),
            ("claude-sonnet-4*", ModelInfo::new(200 * K, 64 * K)),
            ("claude-3-7-sonnet*", ModelInfo::new(200 * K, 64 * K)),
            ("claude-3-5*", ModelInfo::new(200 * K, 8_192)),
            ("claude-haiku-4*", ModelInfo::new(200 * K, 64 * K)),
            ("gemini-2.5*", ModelInfo::new(1_048_576, 65_536)),
            ("gemini-2.0*", ModelInfo::new(1_048_576, 8_192)),
        ]
        .into_iter()
        .fold(Self::new(), |table, (pattern, info)| {
            table.model(pattern, info)
        })
    }

    /// Adds (or replaces) `pattern`.
    pub fn model(mut self, pattern: &str, info: ModelInfo) -> Self {
        match pattern.strip_suffix('*') {
            Some(prefix) => self.prefixes.insert(prefix.to_owned(), info),
            None => self.exact.insert(pattern.to_owned(), info),
        };
        self
    }

    /// Adds the entries of a JSON array of
    /// `{"model": pattern, "context_window": n, "max_output": n}`.
    ///
    /// # Errors
    ///
    /// The JSON's error, when it is not such an array.
    pub fn json(self, json: &str) -> Result<Self, serde_json::Error> {
        let entries: Vec<Entry> = serde_json::from_str(json)?;
        Ok(entries.into_iter().fold(self, |table, e| {
            table.model(&e.model, ModelInfo::new(e.context_window, e.max_output))
        }))
    }

    /// What the table knows of `model`.
    pub fn get(&self, model: &str) -> Option<ModelInfo> {
        let bare = model.rsplit_once('/').map_or(model, |(_, name)| name);
        if let Some(info) = self.exact.get(bare) {
            return Some(*info);
        }
        self.prefixes
            .iter()
            .filter(|(prefix, _)| bare.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, info)| *info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_prefix_wins_and_bad_json_is_an_error() {
        let table = ModelInfoTable::new()
            .model("m*", ModelInfo::new(1, 1))
            .model("m-long*", ModelInfo::new(2, 1))
            .model("m", ModelInfo::new(3, 1));
        assert_eq!(table.get("m-long-x").unwrap().context_window, 2);
        assert_eq!(table.get("m-x").unwrap().context_window, 1);
        assert_eq!(table.get("m").unwrap().context_window, 3);
        assert!(table.clone().json("{\"not\": \"a list\"}").is_err());
        assert_eq!(ModelInfo::new(10, 20).max_input(), 0);
        let builtin = ModelInfoTable::builtin();
        assert_eq!(builtin.get("gpt-4").unwrap().context_window, 8_192);
        assert_eq!(builtin.get("gpt-4-turbo-2024").unwrap().max_output, 4_096);
        assert_eq!(
            builtin.get("claude-sonnet-4-5").unwrap().context_window,
            200_000
        );
    }
}
