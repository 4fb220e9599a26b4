//! The tool policy in full runs: rules and permission modes over the tools'
//! own settings, a hook's allow against the rules, standing approvals across
//! pause, resume in another process, and the next run of the thread.

use std::sync::{Arc, Mutex};

use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::hooks::{ToolDecision, ToolVerdict};
use tower_agent::lifecycle::builtin::policy::{
    ArgCondition, PermissionMode, Rule, ToolPolicyMiddleware,
};
use tower_agent::lifecycle::{Hook, Middleware, MiddlewareStack};
use tower_agent::types::{ApprovalDecision, Checkpoint, Role, ToolCall};
use tower_agent::{
    tool_sync, Agent, AgentRun, BoxError, RunContext, RunRequest, ScriptedModel, ScriptedTurn,
    ToolRouter,
};

/// The tools: `pay` requires approval, `read` is read-only, `search` is
/// plain.
fn tools() -> ToolRouter {
    let ok = |name: &'static str| {
        tool_sync(name, "A tool", move |_: serde_json::Value| {
            Ok::<_, BoxError>(format!("{name} done"))
        })
    };
    ToolRouter::new()
        .tool(ok("pay").requires_approval())
        .tool(ok("read").read_only())
        .tool(ok("search"))
}

/// A model that calls each of `calls` in turn, one per turn, then answers.
fn model(calls: &[(&str, &str)]) -> ScriptedModel {
    let calls: Vec<(String, String)> = calls
        .iter()
        .map(|(n, a)| ((*n).to_owned(), (*a).to_owned()))
        .collect();
    ScriptedModel::from_fn(move |request| {
        let done = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .count();
        match calls.get(done) {
            Some((name, args)) => ScriptedTurn::tool_calls([ToolCall::new(
                format!("call_{}", done + 1),
                name.as_str(),
                args.as_str(),
            )]),
            None => ScriptedTurn::text("done"),
        }
    })
}

/// An approver that approves and records what it was asked.
#[derive(Clone, Default)]
struct Person(Arc<Mutex<Vec<String>>>);

impl Person {
    fn asked(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

fn agent(
    calls: &[(&str, &str)],
    middleware: MiddlewareStack,
    person: &Person,
) -> (Agent, ScriptedModel) {
    let model = model(calls);
    let person = person.clone();
    let agent = Agent::builder("shop")
        .model(model.clone())
        .tools(tools())
        .middleware(middleware)
        .approver(move |call, _| {
            person.0.lock().unwrap().push(call.name.clone());
            async move { Some(ApprovalDecision::approve(&call)) }
        })
        .build()
        .unwrap();
    (agent, model)
}

fn policy() -> ToolPolicyMiddleware {
    ToolPolicyMiddleware::builder()
        .rule(
            Rule::deny("pay")
                .when(ArgCondition::at("/amount").gt(100.0))
                .reason("payments above 100 need the finance team"),
        )
        .rule(Rule::allow("*").read_only(true).named("reads"))
        .build()
        .unwrap()
}

/// The tool results the model read, in order.
fn results(run: &AgentRun) -> Vec<String> {
    run.messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.text().into_owned())
        .collect()
}

async fn run_in(mode: PermissionMode, stack: MiddlewareStack) -> (AgentRun, Vec<String>) {
    let person = Person::default();
    let calls = [
        ("pay", r#"{"amount": 5}"#),
        ("search", "{}"),
        ("read", "{}"),
        ("pay", r#"{"amount": 500}"#),
    ];
    let (agent, _) = agent(&calls, stack, &person);
    let ctx = RunContext::builder().state(mode).build();
    let run = agent
        .run_with(RunRequest::new("shop").context(ctx))
        .await
        .unwrap();
    (run, person.asked())
}

#[tokio::test]
async fn each_mode_over_the_rules_and_the_tools_own_settings() {
    let stack = || MiddlewareStack::new().push(policy());
    let denied = "The call was denied: payments above 100 need the finance team";

    // default: the tool's own setting asks for `pay`; nothing else asks.
    let (run, asked) = run_in(PermissionMode::Default, stack()).await;
    assert_eq!(asked, ["pay"]);
    assert_eq!(
        results(&run),
        ["pay done", "search done", "read done", denied]
    );

    // ask: everything no rule allows asks (`read` is allowed by a rule).
    let (run, asked) = run_in(PermissionMode::Ask, stack()).await;
    assert_eq!(asked, ["pay", "search"]);
    assert_eq!(run.counters.tool_calls, 3);

    // auto: nothing asks, the deny rule still denies.
    let (run, asked) = run_in(PermissionMode::Auto, stack()).await;
    assert!(asked.is_empty());
    assert_eq!(
        results(&run),
        ["pay done", "search done", "read done", denied]
    );

    // dont_ask: what would ask is declined, without asking anyone.
    let (run, asked) = run_in(PermissionMode::DontAsk, stack()).await;
    assert!(asked.is_empty());
    let results = results(&run);
    assert!(
        results[0].starts_with("The call was declined: the permission mode is dont_ask"),
        "{results:?}"
    );
    assert_eq!(results[1..], ["search done", "read done", denied]);
    assert_eq!(run.counters.tool_calls, 2);
}

/// Allows every call, as a hook would.
struct AllowAll;

impl Middleware for AllowAll {
    fn name(&self) -> &str {
        "allow-all"
    }

    fn before_tool<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a ToolCall,
        _: bool,
    ) -> Hook<'a, ToolVerdict> {
        Hook::ok(ToolVerdict::decision(ToolDecision::Allow))
    }
}

#[tokio::test]
async fn a_hooks_allow_skips_the_mode_and_the_tools_setting_never_a_rule() {
    let with_ask_rule = || {
        MiddlewareStack::new().push(AllowAll).push(
            ToolPolicyMiddleware::builder()
                .rule(Rule::ask("search").named("ask-search"))
                .rule(Rule::deny("pay").when(ArgCondition::at("/amount").gt(100.0)))
                .build()
                .unwrap(),
        )
    };
    let (run, asked) = run_in(PermissionMode::Ask, with_ask_rule()).await;
    // `pay` (the tool's setting and the mode) and `read` (the mode) are not
    // asked; the ask rule on `search` is, and the deny rule denies.
    assert_eq!(asked, ["search"]);
    assert_eq!(run.counters.tool_calls, 3);
    assert!(results(&run)[3].starts_with("The call was denied"));
}

#[tokio::test]
async fn decisions_are_logged_with_their_rule() {
    let sink = CollectingSink::new();
    let person = Person::default();
    let (agent, _) = agent(
        &[("pay", r#"{"amount": 500}"#), ("read", "{}")],
        MiddlewareStack::new().push(policy()),
        &person,
    );
    let ctx = RunContext::builder().events(sink.clone()).build();
    agent
        .run_with(RunRequest::new("shop").context(ctx))
        .await
        .unwrap();
    let logged: Vec<(String, &str, Option<String>)> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::PermissionDecision {
                tool,
                decision,
                rule,
                ..
            } => Some((tool, decision, rule)),
            _ => None,
        })
        .collect();
    assert_eq!(
        logged,
        [
            ("pay".to_owned(), "deny", Some("#1 deny pay".to_owned())),
            ("read".to_owned(), "allow", Some("reads".to_owned())),
        ]
    );
    assert!(sink.events().iter().any(|e| matches!(e,
        AgentEvent::ToolDecision { decision: "deny", decided_by, .. } if decided_by == "tool-policy")));
}

/// Defers every call of `pay`: a person decides when the run resumes.
struct DeferPay;

impl Middleware for DeferPay {
    fn name(&self) -> &str {
        "defer-pay"
    }

    fn before_tool<'a>(
        &'a self,
        _: &'a RunContext,
        call: &'a ToolCall,
        _: bool,
    ) -> Hook<'a, ToolVerdict> {
        if call.name == "pay" {
            Hook::ok(ToolVerdict::decision(ToolDecision::Defer))
        } else {
            Hook::skip()
        }
    }
}

/// A fresh agent, as another process would build it: the policy is given.
fn deferring(calls: &[(&str, &str)], policy: &ToolPolicyMiddleware) -> Agent {
    Agent::builder("shop")
        .model(model(calls))
        .tools(tools())
        .middleware(MiddlewareStack::new().push(policy.clone()).push(DeferPay))
        .build()
        .unwrap()
}

fn roundtrip(run: &AgentRun) -> Checkpoint {
    let json = serde_json::to_string(run.checkpoint().expect("paused")).unwrap();
    serde_json::from_str(&json).unwrap()
}

#[tokio::test]
async fn always_allow_survives_pause_resume_and_holds_for_the_thread() {
    let calls = [("pay", r#"{"amount": 1}"#), ("pay", r#"{"amount": 2}"#)];
    let first_process = ToolPolicyMiddleware::builder().build().unwrap();
    let ctx = RunContext::builder().thread_id("t-1").build();
    let paused = deferring(&calls, &first_process)
        .run_with(RunRequest::new("pay twice").context(ctx))
        .await
        .unwrap();
    let checkpoint = roundtrip(&paused);
    assert!(checkpoint.approvals.is_empty());
    let pending = checkpoint.pending[0].call.clone();

    // Another process: "always allow these arguments" for the first payment.
    let second_process = ToolPolicyMiddleware::builder().build().unwrap();
    let decision = ApprovalDecision::approve(&pending).always_for_arguments();
    let again = deferring(&calls, &second_process)
        .run_with(RunRequest::resume(checkpoint, vec![decision]))
        .await
        .unwrap();
    // The second payment has other arguments: it waits, and the checkpoint
    // carries the standing approval.
    let checkpoint = roundtrip(&again);
    assert_eq!(checkpoint.approvals.len(), 1);
    assert_eq!(checkpoint.approvals[0].tool, "pay");
    assert!(checkpoint.approvals[0].arguments_hash.is_some());
    let pending = checkpoint.pending[0].call.clone();
    assert_eq!(pending.arguments, r#"{"amount": 2}"#);

    // A third process: "always allow this tool".
    let third_process = ToolPolicyMiddleware::builder().build().unwrap();
    let sink = CollectingSink::new();
    let decision = ApprovalDecision::approve(&pending).always();
    let resumed = deferring(&calls, &third_process)
        .run_with(
            RunRequest::resume(checkpoint, vec![decision]).context(
                RunContext::builder()
                    .run_id(paused.run_id.clone())
                    .thread_id("t-1")
                    .events(sink.clone())
                    .build(),
            ),
        )
        .await
        .unwrap();
    assert!(resumed.is_completed());
    assert_eq!(resumed.counters.tool_calls, 2);

    // The next run of the thread, in that process: both payments run
    // without pausing, approved by the standing approval.
    let sink = CollectingSink::new();
    let next = deferring(&calls, &third_process)
        .run_with(
            RunRequest::new("pay twice again").context(
                RunContext::builder()
                    .thread_id("t-1")
                    .events(sink.clone())
                    .build(),
            ),
        )
        .await
        .unwrap();
    assert!(next.is_completed());
    assert_eq!(next.counters.tool_calls, 2);
    let sticky = sink
        .events()
        .iter()
        .filter(|e| matches!(e, AgentEvent::ToolDecision { decision: "approved", decided_by, .. } if decided_by == "sticky"))
        .count();
    assert_eq!(sticky, 2);

    // Another thread is asked again.
    let other = deferring(&calls, &third_process)
        .run_with(RunRequest::new("pay").context(RunContext::builder().thread_id("t-2").build()))
        .await
        .unwrap();
    assert_eq!(other.status.as_str(), "paused");
}

#[tokio::test]
async fn a_standing_approval_answers_an_ask_but_never_a_deny() {
    let person = Person::default();
    let stack = MiddlewareStack::new().push(policy());
    let model = model(&[
        ("pay", r#"{"amount": 5}"#),
        ("pay", r#"{"amount": 6}"#),
        ("pay", r#"{"amount": 500}"#),
    ]);
    let asked = person.clone();
    let agent = Agent::builder("shop")
        .model(model)
        .tools(tools())
        .middleware(stack)
        .approver(move |call, _| {
            asked.0.lock().unwrap().push(call.name.clone());
            async move { Some(ApprovalDecision::approve(&call).always()) }
        })
        .build()
        .unwrap();
    let run = agent.run("pay three times").await.unwrap();
    assert_eq!(person.asked(), ["pay"], "asked once, then always allowed");
    let results = results(&run);
    assert_eq!(results[..2], ["pay done", "pay done"]);
    assert!(results[2].starts_with("The call was denied"), "{results:?}");
}
