use super::*;
use crate::event::CollectingSink;
use crate::lifecycle::merge_verdicts;
use crate::service::ToolTraits;

fn call(name: &str, args: &str) -> ToolCall {
    ToolCall::new("c1", name, args)
}

async fn verdict(policy: &ToolPolicyMiddleware, ctx: &RunContext, call: &ToolCall) -> ToolVerdict {
    policy
        .before_tool(ctx, call, false)
        .run()
        .await
        .expect("the policy always answers")
        .unwrap()
}

fn bank() -> ToolPolicyMiddleware {
    ToolPolicyMiddleware::builder()
        .rule(
            Rule::deny("transfer")
                .when(ArgCondition::at("/amount").gt(1000.0))
                .named("large"),
        )
        .rule(Rule::ask("mcp__github__*").named("github"))
        .rule(Rule::allow("balance").named("balance"))
        .rule(Rule::allow("*").read_only(true).named("reads"))
        .build()
        .unwrap()
}

#[tokio::test]
async fn rules_then_the_mode_decide() {
    let policy = bank();
    let tools = RunTools::from_iter([(
        "fs_read".to_owned(),
        ToolTraits {
            read_only: true,
            ..ToolTraits::default()
        },
    )]);
    for (mode, open) in [
        (PermissionMode::Default, ToolDecision::Continue),
        (PermissionMode::Ask, ToolDecision::AskUnlessAllowed),
        (PermissionMode::Auto, ToolDecision::Allow),
        (PermissionMode::DontAsk, ToolDecision::Continue),
    ] {
        let ctx = RunContext::builder()
            .state(mode)
            .state(tools.clone())
            .build();
        let large = verdict(&policy, &ctx, &call("transfer", r#"{"amount": 5000}"#)).await;
        assert!(
            matches!(large.decision, ToolDecision::Deny { ref reason } if reason.contains("`large`"))
        );
        assert_eq!(large.decided_by.as_deref(), Some("tool-policy"));
        let small = verdict(&policy, &ctx, &call("transfer", r#"{"amount": 5}"#)).await;
        assert_eq!(small.decision, open, "{mode:?}");
        let github = verdict(&policy, &ctx, &call("mcp__github__push", "{}")).await;
        assert_eq!(github.decision, ToolDecision::Ask, "{mode:?}");
        let balance = verdict(&policy, &ctx, &call("balance", "{}")).await;
        assert_eq!(balance.decision, ToolDecision::Allow, "{mode:?}");
        let read = verdict(&policy, &ctx, &call("fs_read", "{}")).await;
        assert_eq!(read.decision, ToolDecision::Allow, "{mode:?}");
    }
}

#[tokio::test]
async fn a_hooks_allow_skips_only_what_the_mode_asks() {
    let policy = bank();
    let ctx = RunContext::builder().state(PermissionMode::Ask).build();
    let hook_allows = ToolVerdict::decision(ToolDecision::Allow);
    // The mode's ask: the hook's allow wins, before or after the policy.
    let open = verdict(&policy, &ctx, &call("search", "{}")).await;
    assert_eq!(
        merge_verdicts(open.clone(), hook_allows.clone()).decision,
        ToolDecision::Allow
    );
    assert_eq!(
        merge_verdicts(hook_allows.clone(), open).decision,
        ToolDecision::Allow
    );
    // An ask rule and a deny rule stand.
    let asked = verdict(&policy, &ctx, &call("mcp__github__push", "{}")).await;
    assert_eq!(
        merge_verdicts(hook_allows.clone(), asked).decision,
        ToolDecision::Ask
    );
    let denied = verdict(&policy, &ctx, &call("transfer", r#"{"amount": 1e6}"#)).await;
    assert!(matches!(
        merge_verdicts(hook_allows, denied).decision,
        ToolDecision::Deny { .. }
    ));
}

#[tokio::test]
async fn dont_ask_declines_what_would_ask() {
    let policy = ToolPolicyMiddleware::builder()
        .mode(PermissionMode::DontAsk)
        .build()
        .unwrap();
    let ctx = RunContext::new();
    let pay = call("pay", "{}");
    let decision = policy
        .decide_approval(&ctx, &pay)
        .run()
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!decision.approved);
    assert!(decision.reason.unwrap().contains("dont_ask"));
    // Another mode leaves the approval to the others.
    let ctx = RunContext::builder().state(PermissionMode::Default).build();
    assert!(policy.decide_approval(&ctx, &pay).run().await.is_none());
}

#[tokio::test]
async fn each_decision_is_an_event_naming_the_rule() {
    let policy = bank();
    let sink = CollectingSink::new();
    let ctx = RunContext::builder()
        .events(sink.clone())
        .state(PermissionMode::Auto)
        .build();
    verdict(&policy, &ctx, &call("transfer", r#"{"amount": 2000}"#)).await;
    verdict(&policy, &ctx, &call("search", "{}")).await;
    let decisions: Vec<_> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::PermissionDecision {
                decision,
                rule,
                mode,
                policy,
                tool,
                ..
            } => Some((tool, decision, rule, mode, policy)),
            _ => None,
        })
        .collect();
    assert_eq!(
        decisions,
        [
            (
                "transfer".to_owned(),
                "deny",
                Some("large".to_owned()),
                "auto",
                "tool-policy".to_owned()
            ),
            (
                "search".to_owned(),
                "allow",
                None,
                "auto",
                "tool-policy".to_owned()
            ),
        ]
    );
}

#[tokio::test]
async fn threads_keep_their_standing_approvals() {
    let policy = ToolPolicyMiddleware::builder().build().unwrap();
    let first = RunContext::builder().thread_id("t").build();
    let start = RunStart {
        resumed: false,
        has_history: false,
    };
    policy.before_agent(&first, start).run().await;
    let pay = call("pay", "{}");
    StickyApprovals::of(&first).remember(crate::types::StickyApproval {
        tool: "pay".into(),
        arguments_hash: None,
    });
    assert!(policy.thread_approvals("t").unwrap().covers(&pay));

    let next = RunContext::builder().thread_id("t").build();
    policy.before_agent(&next, start).run().await;
    assert!(StickyApprovals::find(&next).unwrap().covers(&pay));
    let other = RunContext::builder().thread_id("u").build();
    policy.before_agent(&other, start).run().await;
    assert!(!StickyApprovals::find(&other).unwrap().covers(&pay));

    // A run that came with its own set: what it gained reaches the thread
    // when it ends.
    let own = StickyApprovals::new();
    let third = RunContext::builder()
        .thread_id("v")
        .state(own.clone())
        .build();
    policy.before_agent(&third, start).run().await;
    own.remember(crate::types::StickyApproval {
        tool: "refund".into(),
        arguments_hash: None,
    });
    let run = crate::types::AgentRun {
        run_id: third.run_id().clone(),
        agent: "a".into(),
        messages: crate::types::History::new(),
        output: String::new(),
        structured: None,
        usage: Default::default(),
        usage_total: Default::default(),
        cost: None,
        counters: Default::default(),
        status: crate::types::RunStatus::Completed,
    };
    policy
        .after_agent(&third, RunOutcome::Finished(&run))
        .run()
        .await;
    assert!(policy
        .thread_approvals("v")
        .unwrap()
        .covers(&call("refund", "{}")));

    let forgetful = ToolPolicyMiddleware::builder()
        .remember_threads(0)
        .build()
        .unwrap();
    assert!(forgetful.before_agent(&first, start).is_skip());
}
