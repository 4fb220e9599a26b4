use super::*;
use serde_json::json;

fn decide<'a>(set: &'a RuleSet, name: &str, args: &str) -> Option<&'a str> {
    set.decide(&ToolCall::new("c", name, args), false)
        .map(|r| r.label.as_str())
}

#[test]
fn globs_match_whole_names() {
    let any = NameMatch::new("*").unwrap();
    let fs = NameMatch::new("fs_*").unwrap();
    let gh = NameMatch::new("mcp__github__*").unwrap();
    let one = NameMatch::new("get_?").unwrap();
    let dotted = NameMatch::new("a.b*").unwrap();
    assert!(any.matches("anything"));
    assert!(fs.matches("fs_read") && fs.matches("fs_") && !fs.matches("xfs_read"));
    assert!(gh.matches("mcp__github__create_issue") && !gh.matches("mcp__gitlab__x"));
    assert!(one.matches("get_a") && !one.matches("get_ab"));
    assert!(
        dotted.matches("a.bc") && !dotted.matches("axbc"),
        "literal dots"
    );
    assert!(NameMatch::new("").is_err());
}

#[test]
fn deny_beats_ask_beats_allow_and_the_first_of_a_kind_decides() {
    let set = RuleSet::new(vec![
        Rule::allow("*").named("allow-all"),
        Rule::ask("transfer").named("ask-transfers"),
        Rule::ask("*").named("ask-all"),
        Rule::deny("transfer")
            .when(ArgCondition::at("/amount").gt(1000.0))
            .named("large"),
        Rule::deny("transfer")
            .when(ArgCondition::at("/amount").gt(10.0))
            .named("later-deny"),
    ])
    .unwrap();
    assert_eq!(
        decide(&set, "transfer", r#"{"amount": 5000}"#),
        Some("large")
    );
    assert_eq!(
        decide(&set, "transfer", r#"{"amount": 50}"#),
        Some("later-deny")
    );
    assert_eq!(
        decide(&set, "transfer", r#"{"amount": 5}"#),
        Some("ask-transfers")
    );
    assert_eq!(decide(&set, "search", "{}"), Some("ask-all"));
    let allow_only = RuleSet::new(vec![Rule::allow("fs_*")]).unwrap();
    assert_eq!(decide(&allow_only, "fs_read", "{}"), Some("#1 allow fs_*"));
    assert_eq!(decide(&allow_only, "shell", "{}"), None);
}

#[test]
fn conditions_on_arguments() {
    let holds = |condition: ArgCondition, args: Value| {
        let set = RuleSet::new(vec![Rule::deny("t").when(condition)]).unwrap();
        set.decide(&ToolCall::new("c", "t", args.to_string()), false)
            .is_some()
    };
    let args = json!({"amount": 1000, "to": "acct_internal_7", "tags": ["x"], "cur": "EUR"});
    assert!(holds(
        ArgCondition::at("/amount").equals(1000.0),
        args.clone()
    ));
    assert!(holds(
        ArgCondition::at("/amount").ge(1000.0).le(1000.0),
        args.clone()
    ));
    assert!(!holds(ArgCondition::at("/amount").gt(1000.0), args.clone()));
    assert!(!holds(ArgCondition::at("/amount").lt(1000.0), args.clone()));
    assert!(holds(
        ArgCondition::at("/cur").one_of(["USD", "EUR"]),
        args.clone()
    ));
    assert!(!holds(
        ArgCondition::at("/cur").one_of(["USD"]),
        args.clone()
    ));
    assert!(holds(
        ArgCondition::at("/to").matches("^acct_internal_"),
        args.clone()
    ));
    assert!(!holds(
        ArgCondition::at("/to").matches("^ext_"),
        args.clone()
    ));
    assert!(holds(ArgCondition::at("/tags/0").equals("x"), args.clone()));
    // A missing value, a string where a number is wanted, arguments that
    // are not JSON: the condition does not hold.
    assert!(!holds(ArgCondition::at("/missing").equals(1), args.clone()));
    assert!(!holds(ArgCondition::at("/cur").gt(0.0), args.clone()));
    assert!(!holds(ArgCondition::at("/amount").matches("1"), args));
    let set = RuleSet::new(vec![Rule::deny("t").when(ArgCondition::at("/a").gt(0.0))]).unwrap();
    assert!(set
        .decide(&ToolCall::new("c", "t", "not json"), false)
        .is_none());
}

#[test]
fn read_only_declarations() {
    let set = RuleSet::new(vec![
        Rule::allow("*").read_only(true).named("reads"),
        Rule::ask("*").read_only(false).named("writes"),
    ])
    .unwrap();
    let call = ToolCall::new("c", "fs_read", "{}");
    assert_eq!(
        set.decide(&call, true).map(|r| r.label.as_str()),
        Some("reads")
    );
    assert_eq!(
        set.decide(&call, false).map(|r| r.label.as_str()),
        Some("writes")
    );
}

#[test]
fn bad_rules_are_typed_errors() {
    let problem = |rule: Rule| match RuleSet::new(vec![rule]) {
        Err(PolicyError::InvalidRule { rule, problem }) => format!("{rule}: {problem}"),
        other => panic!("expected an invalid rule, got {other:?}"),
    };
    assert_eq!(
        problem(Rule::deny("t").when(ArgCondition::at("amount").gt(1.0))),
        "#1 deny t: `amount` is not a JSON Pointer: it must be empty or start with `/`"
    );
    assert!(problem(Rule::deny("t").when(ArgCondition::at("/a"))).contains("tests nothing"));
    assert!(
        problem(Rule::deny("t").when(ArgCondition::at("/a").matches("(")))
            .contains("does not compile")
    );
    assert!(problem(Rule::deny("").named("empty")).starts_with("empty: "));
    assert!(
        problem(Rule::deny("t").when(ArgCondition::at("/a").gt(f64::NAN))).contains("not a number")
    );
}
