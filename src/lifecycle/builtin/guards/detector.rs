//! The [`InjectionDetector`] trait and what a detector answers: a
//! [`Detection`] with a score, the [`Family`]s that matched and the
//! [`Evidence`] of where.

use std::fmt;
use std::ops::Range;

use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::{json, Value};

use crate::context::RunContext;
use crate::error::BoxError;

/// A family of prompt-injection techniques a detector scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// "Ignore / disregard / forget the previous instructions", new rules.
    InstructionOverride,
    /// Asks for the system prompt or the hidden instructions.
    PromptExtraction,
    /// Role-play, "developer mode", DAN-style personas without rules.
    Jailbreak,
    /// Chat-template and delimiter markup (`<|im_start|>`, `[INST]`,
    /// `</system>`, `### System:`) outside of a model's own template.
    TemplateMarkup,
    /// Text hidden from a human reader: HTML comments, `display:none`,
    /// zero-size or white text, image alt text, markdown comments.
    HiddenMarkup,
    /// Forged tool calls or tool results, forged `"role": "system"` turns.
    ForgedTool,
    /// Send the conversation, a key or a secret to a URL or an address.
    Exfiltration,
    /// Text that addresses the model itself ("note to the AI", "if you are
    /// an assistant reading this").
    AddressesModel,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 8] = [
        Family::InstructionOverride,
        Family::PromptExtraction,
        Family::Jailbreak,
        Family::TemplateMarkup,
        Family::HiddenMarkup,
        Family::ForgedTool,
        Family::Exfiltration,
        Family::AddressesModel,
    ];

    /// The family's name in events and tripwire details.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::InstructionOverride => "instruction_override",
            Family::PromptExtraction => "prompt_extraction",
            Family::Jailbreak => "jailbreak",
            Family::TemplateMarkup => "template_markup",
            Family::HiddenMarkup => "hidden_markup",
            Family::ForgedTool => "forged_tool",
            Family::Exfiltration => "exfiltration",
            Family::AddressesModel => "addresses_model",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which view of the text a match was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum View {
    /// The text after NFKC, with invisible characters removed and
    /// confusable letters folded.
    Normalized,
    /// The normalized text with leetspeak and spacing tricks undone
    /// (letters only, lower case).
    Folded,
    /// A base64 payload, decoded.
    Base64,
    /// A hex payload, decoded.
    Hex,
    /// URL-encoded text, decoded.
    Url,
    /// The text read as ROT13.
    Rot13,
    /// JSON `\uXXXX` escapes, decoded.
    Escaped,
}

/// One match: the family, the view, and where in that view.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evidence {
    /// What matched.
    pub family: Family,
    /// In which view of the text.
    pub view: View,
    /// The byte range of the match in that view (for
    /// [`View::Normalized`], the normalized text; for a decoded payload,
    /// the decoded text).
    pub span: Range<usize>,
    /// The matched text, cut to 80 characters.
    pub excerpt: String,
}

/// A detector's answer: a score in `0.0..=1.0` and the evidence.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Detection {
    /// How likely the text is an injection, `0.0..=1.0`.
    pub score: f32,
    /// The families that matched, each once, in [`Family`] order.
    pub families: Vec<Family>,
    /// Every match, in the order found.
    pub evidence: Vec<Evidence>,
}

impl Detection {
    /// A clean answer: score 0, no evidence.
    pub fn clean() -> Self {
        Self::default()
    }

    /// Whether the score reaches `threshold`.
    pub fn is_injection(&self, threshold: f32) -> bool {
        self.score >= threshold
    }

    /// The details a tripwire or an event carries: the score, the families
    /// and the evidence.
    pub fn info(&self) -> Value {
        json!({
            "score": self.score,
            "families": self.families,
            "evidence": self.evidence,
        })
    }
}

/// Scores a text for prompt injection.
///
/// Two ship: the [`HeuristicDetector`](super::HeuristicDetector) (fast,
/// synchronous, for every input and tool result) and the
/// [`ModelDetector`](super::ModelDetector) (asks a model). See the
/// [module docs](super).
pub trait InjectionDetector: Send + Sync + 'static {
    /// Scores `text`. A detector that cannot answer (its model is down)
    /// returns `Err`; the guard's fail policy decides what that does.
    fn detect<'a>(
        &'a self,
        ctx: &'a RunContext,
        text: &'a str,
    ) -> BoxFuture<'a, Result<Detection, BoxError>>;
}

impl<D: InjectionDetector + ?Sized> InjectionDetector for std::sync::Arc<D> {
    fn detect<'a>(
        &'a self,
        ctx: &'a RunContext,
        text: &'a str,
    ) -> BoxFuture<'a, Result<Detection, BoxError>> {
        (**self).detect(ctx, text)
    }
}

/// Cuts `s` to at most `max` characters.
pub(crate) fn excerpt(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// One pattern: its family, its weight, the literals every match contains
/// when its own first or last words do not anchor it well (empty: found
/// from the regex), the regex.
pub(crate) type Pattern = (Family, f32, &'static [&'static str], &'static str);
