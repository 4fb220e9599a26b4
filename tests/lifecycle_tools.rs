//! Tool verdicts, argument rewrites, approvals, and tool calls outside a run.

mod lifecycle_support;

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use lifecycle_support::{lookup_tools, observed, run_with, HandOn, Lookup};
use serde_json::{json, Value};
use tower_agent::event::AgentEvent;
use tower_agent::hooks::{ToolDecision, ToolVerdict};
use tower_agent::lifecycle::{
    decision_rank, merge_verdicts, Hook, Middleware, MiddlewareStack, Runtime, ToolMiddleware,
    ToolNext,
};
use tower_agent::types::{ApprovalDecision, Role, ToolCall};
use tower_agent::{
    tool_sync, tripwire, Agent, AgentError, AgentRun, BoxError, RunContext, RunRequest,
    ScriptedModel, ScriptedTurn, ToolInvocation, ToolOutput, ToolRouter,
};

const DECISIONS: [&str; 6] = [
    "continue",
    "ask_unless_allowed",
    "allow",
    "ask",
    "defer",
    "deny",
];

fn decision(name: &str, reason: &str) -> ToolDecision {
    match name {
        "continue" => ToolDecision::Continue,
        "ask_unless_allowed" => ToolDecision::AskUnlessAllowed,
        "allow" => ToolDecision::Allow,
        "ask" => ToolDecision::Ask,
        "defer" => ToolDecision::Defer,
        _ => ToolDecision::Deny {
            reason: reason.to_owned(),
        },
    }
}

/// The merge table, pair by pair, with and without rewrites.
#[test]
fn the_merge_table_holds_for_every_pair() {
    for (i, a) in DECISIONS.iter().enumerate() {
        for (j, b) in DECISIONS.iter().enumerate() {
            for (a_args, b_args) in [
                (None, None),
                (Some(1), None),
                (None, Some(2)),
                (Some(1), Some(2)),
            ] {
                let earlier = ToolVerdict {
                    decision: decision(a, "first"),
                    updated_arguments: a_args.map(|n| json!({ "n": n })),
                    decided_by: Some("earlier".into()),
                };
                let later = ToolVerdict {
                    decision: decision(b, "second"),
                    updated_arguments: b_args.map(|n| json!({ "n": n })),
                    decided_by: Some("later".into()),
                };
                let merged = merge_verdicts(earlier.clone(), later.clone());
                // deny > defer > ask > allow > ask-unless-allowed > continue; a
                // tie keeps the earlier.
                let winner = if j > i { &later } else { &earlier };
                assert_eq!(merged.decision, winner.decision, "{a} then {b}");
                assert_eq!(merged.decided_by, winner.decided_by, "{a} then {b}");
                assert_eq!(
                    decision_rank(&merged.decision),
                    i.max(j) as u8,
                    "{a} then {b}"
                );
                // The last rewrite counts.
                let args = b_args.or(a_args).map(|n| json!({ "n": n }));
                assert_eq!(merged.updated_arguments, args, "{a} then {b}");
            }
        }
    }
}

/// Returns a fixed verdict from `before_tool`.
struct Decider {
    name: String,
    verdict: ToolVerdict,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Middleware for Decider {
    fn name(&self) -> &str {
        &self.name
    }

    fn before_tool<'a>(
        &'a self,
        _: &'a RunContext,
        call: &'a ToolCall,
        _: bool,
    ) -> Hook<'a, ToolVerdict> {
        self.seen
            .lock()
            .unwrap()
            .push(format!("{}:{}", self.name, call.arguments));
        Hook::ok(self.verdict.clone())
    }
}

fn decider(name: &str, verdict: ToolVerdict, seen: &Arc<Mutex<Vec<String>>>) -> Decider {
    Decider {
        name: name.to_owned(),
        verdict,
        seen: seen.clone(),
    }
}

/// An agent with `lookup` (requires approval when `approval`), whose
/// approver declines, and a model that calls it once.
fn agent(approval: bool) -> Agent {
    let lookup = tool_sync("lookup", "Looks an id up", |l: Lookup| {
        Ok::<_, BoxError>(format!("found {}", l.id))
    });
    let lookup = if approval {
        lookup.requires_approval()
    } else {
        lookup
    };
    Agent::builder("a")
        .model(ScriptedModel::from_fn(|request| {
            if request
                .messages
                .last()
                .is_some_and(|m| m.role == Role::Tool)
            {
                ScriptedTurn::text("done")
            } else {
                ScriptedTurn::tool_call("lookup", r#"{"id": "a"}"#)
            }
        }))
        .tools(ToolRouter::new().tool(lookup))
        .approver(
            |call, _| async move { Some(ApprovalDecision::decline(&call, "the person said no")) },
        )
        .build()
        .unwrap()
}

fn tool_result(run: &AgentRun) -> String {
    run.messages
        .iter()
        .find(|m| m.role == Role::Tool)
        .map(|m| m.text().into_owned())
        .unwrap_or_default()
}

fn decisions(events: &[AgentEvent]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ToolDecision {
                decision,
                decided_by,
                ..
            } => Some((decision.to_string(), decided_by.clone())),
            _ => None,
        })
        .collect()
}

/// Every ordered triple of decisions, in a full run: what the run does is
/// what the merged decision says, and the log names who decided.
#[tokio::test]
async fn every_triple_of_verdicts_decides_the_call_as_merged() {
    for a in DECISIONS {
        for b in DECISIONS {
            for c in DECISIONS {
                for approval in [false, true] {
                    let label = format!("{a}/{b}/{c} approval={approval}");
                    let seen = Arc::default();
                    let stack = MiddlewareStack::new()
                        .push(decider(
                            "m1",
                            ToolVerdict::decision(decision(a, "m1 says no")),
                            &seen,
                        ))
                        .push(decider(
                            "m2",
                            ToolVerdict::decision(decision(b, "m2 says no")),
                            &seen,
                        ))
                        .push(decider(
                            "m3",
                            ToolVerdict::decision(decision(c, "m3 says no")),
                            &seen,
                        ));
                    let (ctx, sink) = observed();
                    let run = run_with(agent(approval), stack, RunRequest::new("go").context(ctx))
                        .await
                        .unwrap();
                    let names = ["m1", "m2", "m3"];
                    let picked = [a, b, c];
                    let top = picked
                        .iter()
                        .map(|d| DECISIONS.iter().position(|x| x == d).unwrap())
                        .max()
                        .unwrap();
                    let winner = names[picked.iter().position(|d| *d == DECISIONS[top]).unwrap()];
                    let events = sink.events();
                    let logged = decisions(&events);
                    match DECISIONS[top] {
                        "deny" => {
                            assert_eq!(
                                tool_result(&run),
                                format!("The call was denied: {winner} says no"),
                                "{label}"
                            );
                            assert_eq!(run.counters.tool_calls, 0, "{label}");
                        }
                        "defer" => {
                            let checkpoint = run.checkpoint().expect("paused");
                            assert_eq!(checkpoint.pending.len(), 1, "{label}");
                        }
                        // Asked either way: nothing here allows it.
                        "ask" | "ask_unless_allowed" => {
                            assert_eq!(
                                tool_result(&run),
                                "The call was declined: the person said no",
                                "{label}"
                            );
                            assert!(
                                logged.contains(&("declined".into(), "approver".into())),
                                "{label}: {logged:?}"
                            );
                        }
                        "allow" => assert_eq!(tool_result(&run), "found a", "{label}"),
                        _ if approval => {
                            assert_eq!(
                                tool_result(&run),
                                "The call was declined: the person said no",
                                "{label}"
                            );
                        }
                        _ => assert_eq!(tool_result(&run), "found a", "{label}"),
                    }
                    if DECISIONS[top] != "continue" {
                        assert_eq!(
                            logged[0],
                            (DECISIONS[top].to_owned(), winner.to_owned()),
                            "{label}"
                        );
                    }
                }
            }
        }
    }
}

#[tokio::test]
async fn rewrites_chain_and_the_last_one_counts() {
    let seen = Arc::default();
    let stack = MiddlewareStack::new()
        .push(decider(
            "first",
            ToolVerdict::proceed().with_arguments(json!({"id": "b"})),
            &seen,
        ))
        .push(decider("observer", ToolVerdict::proceed(), &seen))
        .push(decider(
            "last",
            ToolVerdict::proceed().with_arguments(json!({"id": "c"})),
            &seen,
        ));
    let (ctx, sink) = observed();
    let run = run_with(agent(false), stack, RunRequest::new("go").context(ctx))
        .await
        .unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [
            r#"first:{"id": "a"}"#,
            r#"observer:{"id":"b"}"#,
            r#"last:{"id":"b"}"#
        ]
    );
    assert_eq!(tool_result(&run), "found c");
    // The transcript keeps the call as the model made it.
    let call = &run
        .messages
        .iter()
        .find(|m| !m.tool_calls.is_empty())
        .unwrap()
        .tool_calls[0];
    assert_eq!(call.arguments, r#"{"id": "a"}"#);
    assert_eq!(
        decisions(&sink.events()),
        [
            ("rewrite".into(), "first".into()),
            ("rewrite".into(), "last".into())
        ]
    );
}

#[tokio::test]
async fn rewritten_arguments_are_validated_again() {
    let seen = Arc::default();
    let stack = MiddlewareStack::new().push(decider(
        "breaker",
        ToolVerdict::proceed().with_arguments(json!({"id": 5})),
        &seen,
    ));
    let run = run_with(agent(false), stack, RunRequest::new("go"))
        .await
        .unwrap();
    let result = tool_result(&run);
    assert!(result.contains("do not match its schema"), "{result}");
    assert_eq!(
        run.counters.tool_calls, 1,
        "the router answered, the tool never ran"
    );
}

/// Decides approvals: approves, bound to the arguments it was asked about.
struct Approver {
    name: &'static str,
    verdict: Option<bool>,
    asked: Arc<Mutex<Vec<&'static str>>>,
    other_arguments: bool,
}

impl Middleware for Approver {
    fn name(&self) -> &str {
        self.name
    }

    fn decide_approval<'a>(
        &'a self,
        _: &'a RunContext,
        call: &'a ToolCall,
    ) -> Hook<'a, Option<ApprovalDecision>> {
        self.asked.lock().unwrap().push(self.name);
        let call = if self.other_arguments {
            ToolCall::new(call.id.clone(), call.name.clone(), r#"{"id": "zzz"}"#)
        } else {
            call.clone()
        };
        Hook::ok(self.verdict.map(|approved| {
            if approved {
                ApprovalDecision::approve(&call)
            } else {
                ApprovalDecision::decline(&call, format!("{} declined", self.name))
            }
        }))
    }
}

fn approver(
    name: &'static str,
    verdict: Option<bool>,
    asked: &Arc<Mutex<Vec<&'static str>>>,
) -> Approver {
    Approver {
        name,
        verdict,
        asked: asked.clone(),
        other_arguments: false,
    }
}

#[tokio::test]
async fn decide_approval_hooks_decide_before_the_approver() {
    let asked = Arc::default();
    let stack = MiddlewareStack::new()
        .push(approver("abstains", None, &asked))
        .push(approver("grants", Some(true), &asked))
        .push(approver("never-asked", Some(false), &asked));
    let (ctx, sink) = observed();
    let run = run_with(agent(true), stack, RunRequest::new("go").context(ctx))
        .await
        .unwrap();
    assert_eq!(tool_result(&run), "found a");
    assert_eq!(*asked.lock().unwrap(), ["abstains", "grants"]);
    assert_eq!(
        decisions(&sink.events()),
        [("approved".into(), "grants".into())]
    );
}

#[tokio::test]
async fn nobody_deciding_declines_the_call() {
    let asked = Arc::default();
    let stack = MiddlewareStack::new().push(approver("abstains", None, &asked));
    let agent = Agent::builder("a")
        .model(ScriptedModel::new([
            ScriptedTurn::tool_call("lookup", r#"{"id": "a"}"#),
            ScriptedTurn::text("done"),
        ]))
        .tools(ToolRouter::new().tool(
            tool_sync("lookup", "l", |l: Lookup| Ok::<_, BoxError>(l.id)).requires_approval(),
        ))
        .build()
        .unwrap();
    let (ctx, sink) = observed();
    let run = run_with(agent, stack, RunRequest::new("go").context(ctx))
        .await
        .unwrap();
    assert_eq!(
        tool_result(&run),
        "The call was declined: nobody approved it"
    );
    assert_eq!(
        decisions(&sink.events()),
        [("declined".into(), "nobody".into())]
    );
}

#[tokio::test]
async fn a_decision_for_other_arguments_is_refused() {
    let asked = Arc::default();
    let stack = MiddlewareStack::new().push(Approver {
        other_arguments: true,
        ..approver("sloppy", Some(true), &asked)
    });
    let err = run_with(agent(true), stack, RunRequest::new("go"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "APPROVAL_MISMATCH");
    assert!(err.to_string().contains("other arguments"), "{err}");
}

/// Rewrites the arguments as a wrap middleware.
struct Normalize;

impl ToolMiddleware for Normalize {
    fn name(&self) -> &str {
        "normalize"
    }

    fn wrap_tool<'a>(
        &'a self,
        mut invocation: ToolInvocation,
        next: ToolNext,
    ) -> BoxFuture<'a, Result<ToolOutput, BoxError>> {
        let id = invocation.args["id"]
            .as_str()
            .unwrap_or_default()
            .to_uppercase();
        invocation.args = json!({ "id": id });
        Box::pin(next.run(invocation))
    }
}

/// Records what the layers inside see.
#[derive(Clone, Default)]
struct Probe(Arc<Mutex<Vec<(bool, String, Value)>>>);

impl ToolMiddleware for Probe {
    fn name(&self) -> &str {
        "probe"
    }

    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> BoxFuture<'a, Result<ToolOutput, BoxError>> {
        self.0.lock().unwrap().push((
            invocation.approved,
            invocation.call.arguments.clone(),
            invocation.args.clone(),
        ));
        Box::pin(next.run(invocation))
    }
}

#[tokio::test]
async fn an_approval_never_carries_over_to_new_arguments() {
    let asked = Arc::default();
    let outer = Probe::default();
    let inner = Probe::default();
    let stack = MiddlewareStack::new()
        .push(approver("grants", Some(true), &asked))
        .push_tool(outer.clone())
        .push_tool(Normalize)
        .push_tool(inner.clone());
    let run = run_with(agent(true), stack, RunRequest::new("go"))
        .await
        .unwrap();
    assert_eq!(tool_result(&run), "found A");
    assert_eq!(
        *outer.0.lock().unwrap(),
        [(true, r#"{"id": "a"}"#.to_owned(), json!({"id": "a"}))]
    );
    // Inside the rewrite: not approved, and the text follows the value.
    assert_eq!(
        *inner.0.lock().unwrap(),
        [(false, r#"{"id":"A"}"#.to_owned(), json!({"id": "A"}))]
    );
}

/// A tool wrap middleware that trips on one id and fails on another.
struct Guard;

impl ToolMiddleware for Guard {
    fn name(&self) -> &str {
        "tool-guard"
    }

    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> BoxFuture<'a, Result<ToolOutput, BoxError>> {
        Box::pin(async move {
            match invocation.args["id"].as_str() {
                Some("secret") => Err(tripwire("no secrets").into()),
                Some("broken") => Err("the guard broke".into()),
                _ => next.run(invocation).await,
            }
        })
    }
}

#[tokio::test]
async fn invoke_tool_runs_the_runtime_tool_middleware() {
    let runtime = Runtime::new(MiddlewareStack::new().push_tool(Guard));
    let failing = ToolRouter::new().tool(tool_sync("lookup", "l", |l: Lookup| {
        if l.id == "bad" {
            Err::<String, BoxError>("no such id".into())
        } else {
            Ok(format!("found {}", l.id))
        }
    }));
    let call = |id: &str| {
        ToolInvocation::new(
            ToolCall::new("c1", "lookup", json!({ "id": id }).to_string()),
            RunContext::new(),
        )
    };
    let ok = runtime
        .invoke_tool(failing.clone(), call("7"))
        .await
        .unwrap();
    assert_eq!(ok, ToolOutput::text("found 7"));
    // A failing tool comes back as an error result.
    let failed = runtime
        .invoke_tool(failing.clone(), call("bad"))
        .await
        .unwrap();
    assert!(
        failed.is_error && failed.content.contains("no such id"),
        "{failed:?}"
    );
    // What a middleware raises is an error, a tripwire naming it.
    let err = runtime
        .invoke_tool(failing.clone(), call("secret"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::Tripwire { middleware, hook, .. }
        if middleware == "tool-guard" && hook == "wrap_tool"),
        "{err:?}"
    );
    let err = runtime
        .invoke_tool(lookup_tools(), call("broken"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::Middleware { middleware, .. } if middleware == "tool-guard"),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_wrap_tool_error_fails_the_run_but_a_tool_error_is_read_by_the_model() {
    let agent = |id: &'static str| {
        Agent::builder("a")
            .model(ScriptedModel::new([
                ScriptedTurn::tool_call("lookup", json!({ "id": id }).to_string()),
                ScriptedTurn::text("done"),
            ]))
            .tools(
                ToolRouter::new().tool(tool_sync("lookup", "l", |l: Lookup| {
                    if l.id == "bad" {
                        Err::<String, BoxError>("no such id".into())
                    } else {
                        Ok(l.id)
                    }
                })),
            )
            .build()
            .unwrap()
    };
    let stack = || MiddlewareStack::new().push_tool(Guard);
    let run = run_with(agent("bad"), stack(), RunRequest::new("go"))
        .await
        .unwrap();
    assert_eq!(tool_result(&run), "The tool `lookup` failed: no such id");
    let err = run_with(agent("broken"), stack(), RunRequest::new("go"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::Middleware { middleware, hook, .. }
        if middleware == "tool-guard" && hook == "wrap_tool"),
        "{err:?}"
    );
}

/// Calls the tool twice, through two clones of its `next`, and answers
/// with both results.
struct Twice;

impl ToolMiddleware for Twice {
    fn name(&self) -> &str {
        "twice"
    }

    fn wrap_tool<'a>(
        &'a self,
        invocation: ToolInvocation,
        next: ToolNext,
    ) -> BoxFuture<'a, Result<ToolOutput, BoxError>> {
        Box::pin(async move {
            let first = next.clone().run(invocation.clone()).await?;
            let second = next.run(invocation).await?;
            Ok(ToolOutput::text(format!(
                "{} / {}",
                first.content, second.content
            )))
        })
    }
}

#[tokio::test]
async fn every_clone_of_a_tool_next_calls_the_agents_tool_stack() {
    // The router alone (no tool layer) and behind a tool layer: the stack
    // a walk is lent is called once per run of a `next`, through the hooks
    // that hand the call on before and after the one that runs it twice.
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let router = {
        let calls = calls.clone();
        ToolRouter::new().tool(tool_sync("lookup", "l", move |l: Lookup| {
            let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            Ok::<_, BoxError>(format!("{} #{n}", l.id))
        }))
    };
    let model = || {
        ScriptedModel::new([
            ScriptedTurn::tool_call("lookup", r#"{"id": "a"}"#),
            ScriptedTurn::text("done"),
        ])
    };
    let bare = Agent::builder("a")
        .model(model())
        .tools(router.clone())
        .build()
        .unwrap();
    let layered = Agent::builder("a")
        .model(model())
        .tools(router)
        .tool_layer(tower::layer::util::Identity::new())
        .build()
        .unwrap();
    for (agent, want) in [(bare, "a #1 / a #2"), (layered, "a #3 / a #4")] {
        let stack = MiddlewareStack::new()
            .push(HandOn)
            .push_tool(Twice)
            .push(HandOn);
        let run = run_with(agent, stack, RunRequest::new("go")).await.unwrap();
        assert_eq!(tool_result(&run), want);
    }
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 4);
}
