//! [`Rule`]s: allow, ask or deny a tool call, matched by a glob on the tool
//! name, by what the tool declares (read-only) and by [`ArgCondition`]s on
//! its arguments; and how a set of them decides.

use std::fmt;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::load::PolicyError;
use crate::types::ToolCall;

/// What a rule does with a call it matches. Of the rules that match a call,
/// deny beats ask beats allow; of several of one kind, the first decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    /// Run it without asking (what the tool's own setting or the mode would
    /// ask is skipped).
    Allow,
    /// Ask for approval, even when a hook allows it.
    Ask,
    /// Refuse it; the model reads the rule's reason.
    Deny,
}

impl RuleAction {
    /// `allow`, `ask` or `deny`.
    pub fn as_str(&self) -> &'static str {
        match self {
            RuleAction::Allow => "allow",
            RuleAction::Ask => "ask",
            RuleAction::Deny => "deny",
        }
    }
}

/// A test on one argument of a call, found by a JSON Pointer (RFC 6901:
/// `/amount`, `/to/0/iban`). Every test it sets must hold; a missing value
/// fails them all.
///
/// - `equals`: the value equals this JSON value (numbers compare by value:
///   `1000` equals `1000.0`);
/// - `one_of`: it equals one of these;
/// - `matches`: it is a string that this regex matches (anywhere; anchor
///   with `^…$`);
/// - `gt` / `ge` / `lt` / `le`: it is a number above / at least / below /
///   at most this.
///
/// ```
/// use tower_agent::lifecycle::builtin::policy::ArgCondition;
///
/// let large = ArgCondition::at("/amount").gt(1000.0);
/// let internal = ArgCondition::at("/to").matches("^acct_internal_");
/// # let _ = (large, internal);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArgCondition {
    /// Where the argument is: a JSON Pointer, `""` for the whole arguments.
    pub pointer: String,
    /// It equals this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<Value>,
    /// It equals one of these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<Value>>,
    /// It is a string this regex matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<String>,
    /// It is a number above this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gt: Option<f64>,
    /// It is a number at least this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ge: Option<f64>,
    /// It is a number below this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lt: Option<f64>,
    /// It is a number at most this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub le: Option<f64>,
}

impl ArgCondition {
    /// A condition on the argument at `pointer`, with no test yet (a policy
    /// with a condition that tests nothing does not build).
    pub fn at(pointer: impl Into<String>) -> Self {
        Self {
            pointer: pointer.into(),
            equals: None,
            one_of: None,
            matches: None,
            gt: None,
            ge: None,
            lt: None,
            le: None,
        }
    }

    /// It equals `value`.
    pub fn equals(mut self, value: impl Into<Value>) -> Self {
        self.equals = Some(value.into());
        self
    }

    /// It equals one of `values`.
    pub fn one_of<V: Into<Value>>(mut self, values: impl IntoIterator<Item = V>) -> Self {
        self.one_of = Some(values.into_iter().map(Into::into).collect());
        self
    }

    /// It is a string `pattern` (a regex, checked when the policy builds)
    /// matches.
    pub fn matches(mut self, pattern: impl Into<String>) -> Self {
        self.matches = Some(pattern.into());
        self
    }

    /// It is a number above `bound`.
    pub fn gt(mut self, bound: f64) -> Self {
        self.gt = Some(bound);
        self
    }

    /// It is a number at least `bound`.
    pub fn ge(mut self, bound: f64) -> Self {
        self.ge = Some(bound);
        self
    }

    /// It is a number below `bound`.
    pub fn lt(mut self, bound: f64) -> Self {
        self.lt = Some(bound);
        self
    }

    /// It is a number at most `bound`.
    pub fn le(mut self, bound: f64) -> Self {
        self.le = Some(bound);
        self
    }

    fn tests_something(&self) -> bool {
        self.equals.is_some()
            || self.one_of.is_some()
            || self.matches.is_some()
            || self.gt.is_some()
            || self.ge.is_some()
            || self.lt.is_some()
            || self.le.is_some()
    }
}

fn any_tool() -> String {
    "*".to_owned()
}

/// A rule of a tool policy: what to do with the calls it matches.
///
/// A call matches when the tool's name matches the glob `tool` (`*` any
/// run of characters, `?` one; `fs_*`, `mcp__github__*`), the tool's
/// read-only declaration is `read_only` (when set), and every condition of
/// `when` holds on its arguments.
///
/// ```
/// use tower_agent::lifecycle::builtin::policy::{ArgCondition, Rule};
///
/// let rules = [
///     Rule::deny("transfer")
///         .when(ArgCondition::at("/amount").gt(1000.0))
///         .reason("transfers above 1000 go through a person")
///         .named("large-transfers"),
///     Rule::ask("mcp__github__*"),
///     Rule::allow("*").read_only(true),
/// ];
/// # let _ = rules;
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// A name for the log (default: its position and what it does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What it does.
    pub action: RuleAction,
    /// The glob the tool's name must match (default `*`).
    #[serde(default = "any_tool")]
    pub tool: String,
    /// When set, the tool must (`true`) or must not (`false`) declare
    /// itself read-only. A tool whose traits the run does not know counts
    /// as not read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Conditions on the arguments, all of which must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<ArgCondition>,
    /// What the model reads when the rule denies a call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Rule {
    /// A rule doing `action` for the tools whose name matches `tool`.
    pub fn new(action: RuleAction, tool: impl Into<String>) -> Self {
        Self {
            name: None,
            action,
            tool: tool.into(),
            read_only: None,
            when: Vec::new(),
            reason: None,
        }
    }

    /// Allows the calls of the tools matching `tool`.
    pub fn allow(tool: impl Into<String>) -> Self {
        Self::new(RuleAction::Allow, tool)
    }

    /// Asks for the calls of the tools matching `tool`.
    pub fn ask(tool: impl Into<String>) -> Self {
        Self::new(RuleAction::Ask, tool)
    }

    /// Denies the calls of the tools matching `tool`.
    pub fn deny(tool: impl Into<String>) -> Self {
        Self::new(RuleAction::Deny, tool)
    }

    /// Names the rule for the log.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Only for tools that declare themselves read-only (`true`) or that do
    /// not (`false`).
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = Some(read_only);
        self
    }

    /// Adds a condition on the arguments.
    pub fn when(mut self, condition: ArgCondition) -> Self {
        self.when.push(condition);
        self
    }

    /// What the model reads when it denies a call.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }
}

/// A glob on tool names, compiled.
#[derive(Debug)]
enum NameMatch {
    Any,
    Exact(String),
    Glob(Regex),
}

impl NameMatch {
    fn new(glob: &str) -> Result<Self, String> {
        if glob.is_empty() {
            return Err("the tool pattern is empty".into());
        }
        if glob.chars().all(|c| c == '*') {
            return Ok(NameMatch::Any);
        }
        if !glob.contains(['*', '?']) {
            return Ok(NameMatch::Exact(glob.to_owned()));
        }
        let mut pattern = String::with_capacity(glob.len() + 8);
        pattern.push('^');
        let mut literal = [0u8; 4];
        for c in glob.chars() {
            match c {
                '*' => pattern.push_str(".*"),
                '?' => pattern.push('.'),
                c => pattern.push_str(&regex::escape(c.encode_utf8(&mut literal))),
            }
        }
        pattern.push('$');
        Regex::new(&pattern)
            .map(NameMatch::Glob)
            .map_err(|e| e.to_string())
    }

    fn matches(&self, name: &str) -> bool {
        match self {
            NameMatch::Any => true,
            NameMatch::Exact(exact) => exact == name,
            NameMatch::Glob(glob) => glob.is_match(name),
        }
    }
}

#[derive(Debug)]
struct Condition {
    test: ArgCondition,
    regex: Option<Regex>,
}

/// JSON equality, with numbers compared by value.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => x == y,
        },
        _ => a == b,
    }
}

impl Condition {
    fn holds(&self, arguments: &Value) -> bool {
        let Some(value) = arguments.pointer(&self.test.pointer) else {
            return false;
        };
        let test = &self.test;
        if test.equals.as_ref().is_some_and(|e| !same(e, value)) {
            return false;
        }
        if test
            .one_of
            .as_ref()
            .is_some_and(|set| !set.iter().any(|e| same(e, value)))
        {
            return false;
        }
        if let Some(regex) = &self.regex {
            if !value.as_str().is_some_and(|s| regex.is_match(s)) {
                return false;
            }
        }
        let bounds = [test.gt, test.ge, test.lt, test.le];
        if bounds.iter().any(Option::is_some) {
            let Some(n) = value.as_f64() else {
                return false;
            };
            let within = test.gt.is_none_or(|b| n > b)
                && test.ge.is_none_or(|b| n >= b)
                && test.lt.is_none_or(|b| n < b)
                && test.le.is_none_or(|b| n <= b);
            if !within {
                return false;
            }
        }
        true
    }
}

/// A rule, compiled, with the label the log gives it.
pub(crate) struct CompiledRule {
    pub(crate) rule: Rule,
    pub(crate) label: String,
    name: NameMatch,
    conditions: Vec<Condition>,
}

impl fmt::Debug for CompiledRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label)
    }
}

impl CompiledRule {
    fn new(index: usize, rule: Rule) -> Result<Self, PolicyError> {
        let label = match &rule.name {
            Some(name) => name.clone(),
            None => format!("#{} {} {}", index + 1, rule.action.as_str(), rule.tool),
        };
        let invalid = |problem: String| PolicyError::InvalidRule {
            rule: label.clone(),
            problem,
        };
        let name = NameMatch::new(&rule.tool).map_err(&invalid)?;
        let mut conditions = Vec::with_capacity(rule.when.len());
        for test in &rule.when {
            if !(test.pointer.is_empty() || test.pointer.starts_with('/')) {
                return Err(invalid(format!(
                    "`{}` is not a JSON Pointer: it must be empty or start with `/`",
                    test.pointer
                )));
            }
            if !test.tests_something() {
                return Err(invalid(format!(
                    "the condition on `{}` tests nothing: give equals, one_of, matches, gt, ge, lt or le",
                    test.pointer
                )));
            }
            let bounds = [test.gt, test.ge, test.lt, test.le];
            if bounds.iter().flatten().any(|b| b.is_nan()) {
                return Err(invalid(format!(
                    "a bound on `{}` is not a number",
                    test.pointer
                )));
            }
            let regex = match &test.matches {
                Some(pattern) => Some(Regex::new(pattern).map_err(|e| {
                    invalid(format!("the regex `{pattern}` does not compile: {e}"))
                })?),
                None => None,
            };
            conditions.push(Condition {
                test: test.clone(),
                regex,
            });
        }
        Ok(Self {
            rule,
            label,
            name,
            conditions,
        })
    }

    fn action(&self) -> RuleAction {
        self.rule.action
    }

    /// Whether it matches `call`; `arguments` is parsed on first need.
    fn matches(
        &self,
        call: &ToolCall,
        read_only: bool,
        arguments: &mut Option<Option<Value>>,
    ) -> bool {
        if !self.name.matches(&call.name) {
            return false;
        }
        if self.rule.read_only.is_some_and(|want| want != read_only) {
            return false;
        }
        if self.conditions.is_empty() {
            return true;
        }
        let Some(arguments) =
            arguments.get_or_insert_with(|| serde_json::from_str(&call.arguments).ok())
        else {
            // Arguments that are not JSON satisfy no condition (and the
            // router refuses them).
            return false;
        };
        self.conditions.iter().all(|c| c.holds(arguments))
    }
}

/// Rules in the order given, compiled.
#[derive(Debug, Default)]
pub(crate) struct RuleSet {
    rules: Vec<CompiledRule>,
}

impl RuleSet {
    pub(crate) fn new(rules: Vec<Rule>) -> Result<Self, PolicyError> {
        let rules = rules
            .into_iter()
            .enumerate()
            .map(|(i, r)| CompiledRule::new(i, r))
            .collect::<Result<_, _>>()?;
        Ok(Self { rules })
    }

    pub(crate) fn len(&self) -> usize {
        self.rules.len()
    }

    /// The rule that decides `call`: the first deny that matches, else the
    /// first ask, else the first allow; `None` when none matches.
    pub(crate) fn decide(&self, call: &ToolCall, read_only: bool) -> Option<&CompiledRule> {
        let mut arguments = None;
        let (mut ask, mut allow) = (None, None);
        for rule in &self.rules {
            let wanted = match rule.action() {
                RuleAction::Deny => true,
                RuleAction::Ask => ask.is_none(),
                RuleAction::Allow => ask.is_none() && allow.is_none(),
            };
            if !wanted || !rule.matches(call, read_only, &mut arguments) {
                continue;
            }
            match rule.action() {
                RuleAction::Deny => return Some(rule),
                RuleAction::Ask => ask = Some(rule),
                RuleAction::Allow => allow = Some(rule),
            }
        }
        ask.or(allow)
    }
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
