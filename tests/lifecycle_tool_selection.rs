//! Per-turn tool selection in full runs: 200 tools narrowed by a cheap
//! model (its usage exact and attributed), by the run's state, and calls to
//! tools a turn did not offer refused.

use tower_agent::lifecycle::builtin::tool_selection::{
    ActiveTools, ModelToolSelector, ToolSelectionMiddleware,
};
use tower_agent::lifecycle::MiddlewareStack;
use tower_agent::service::box_model;
use tower_agent::types::{Role, ToolCall, ToolChoice, ToolSpec};
use tower_agent::{
    tool_sync, Agent, BoxError, RunContext, RunRequest, ScriptedModel, ScriptedTurn, ToolRouter,
    Usage,
};

fn two_hundred_tools() -> ToolRouter {
    (0..200).fold(ToolRouter::new(), |router, i| {
        let name = format!("tool_{i:03}");
        let answer = format!("{name} ran");
        router.tool(tool_sync(
            name,
            format!("Tool number {i}"),
            move |_: serde_json::Value| Ok::<_, BoxError>(answer.clone()),
        ))
    })
}

fn offered(tools: &[ToolSpec]) -> Vec<&str> {
    tools.iter().map(|t| t.name.as_str()).collect()
}

#[tokio::test]
async fn a_cheap_model_picks_from_200_tools_and_its_usage_is_exact() {
    let cheap = ScriptedModel::new([
        ScriptedTurn::text(r#"{"tools": ["tool_123", "tool_007", "not_a_tool"]}"#)
            .usage(Usage::new(900, 12)),
        ScriptedTurn::text(r#"{"tools": ["tool_123"]}"#).usage(Usage::new(905, 6)),
        ScriptedTurn::text(r#"{"tools": []}"#).usage(Usage::new(910, 4)),
    ]);
    let main = ScriptedModel::new([
        ScriptedTurn::tool_calls([
            ToolCall::new("c1", "tool_007", "{}"),
            // Not offered this turn: refused, not run.
            ToolCall::new("c2", "tool_050", "{}"),
        ])
        .usage(Usage::new(100, 10)),
        ScriptedTurn::tool_call("tool_123", "{}").usage(Usage::new(120, 8)),
        ScriptedTurn::text("all done").usage(Usage::new(140, 5)),
    ]);
    let selection = ToolSelectionMiddleware::new(
        ModelToolSelector::new(box_model(cheap.clone()))
            .model_name("small")
            .max_tools(5),
    )
    .always_include(["tool_199"]);
    let agent = Agent::builder("big")
        .model(main.clone())
        .tools(two_hundred_tools())
        .middleware(MiddlewareStack::new().push(selection))
        .build()
        .unwrap();
    assert_eq!(agent.tool_specs().len(), 200);

    let ctx = RunContext::new();
    let run = agent
        .run_with(RunRequest::new("do the thing with 7 and 123").context(ctx.clone()))
        .await
        .unwrap();
    assert_eq!(run.output, "all done");

    // The model saw only what was selected (plus what is always offered),
    // in the agent's order.
    let requests = main.requests();
    assert_eq!(
        offered(&requests[0].tools),
        ["tool_007", "tool_123", "tool_199"]
    );
    assert_eq!(offered(&requests[1].tools), ["tool_123", "tool_199"]);
    assert_eq!(offered(&requests[2].tools), ["tool_199"]);

    // The cheap model was asked with all 200 tools and the user's message.
    let asked = cheap.requests();
    assert_eq!(asked.len(), 3);
    let listing = asked[0].messages.first().unwrap().text().into_owned();
    assert!(listing.contains("- tool_000: Tool number 0"));
    assert!(listing.contains("- tool_199: Tool number 199"));
    assert_eq!(
        asked[0].messages.last().unwrap().text(),
        "do the thing with 7 and 123"
    );

    // tool_050 was refused with a clear tool message; the others ran.
    let results: Vec<String> = run
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.text().into_owned())
        .collect();
    assert_eq!(results[0], "tool_007 ran");
    assert_eq!(
        results[1],
        "The call was denied: the tool `tool_050` was not offered in this turn; the tools \
         offered were: tool_007, tool_123, tool_199. Call one of those, or answer without a tool."
    );
    assert_eq!(results[2], "tool_123 ran");
    assert_eq!(run.counters.tool_calls, 2);

    // Usage: the run's own calls in `usage`, the selector's beside them in
    // `usage_total` and in the ledger under its name, each exactly once.
    assert_eq!(run.usage, Usage::new(360, 23));
    assert_eq!(run.usage_total, Usage::new(360 + 2715, 23 + 22));
    let entries = ctx.usage_entries();
    let selector: Vec<_> = entries
        .iter()
        .filter(|e| e.agent.as_deref() == Some("tool-selector"))
        .collect();
    assert_eq!(selector.len(), 3);
    assert!(selector.iter().all(|e| e.model == "small"));
    let own = entries
        .iter()
        .filter(|e| e.agent.as_deref() == Some("big"))
        .count();
    assert_eq!(own, 3);
}

#[tokio::test]
async fn the_runs_state_selects_and_a_hook_can_change_it_between_turns() {
    let main = ScriptedModel::new([
        ScriptedTurn::tool_call("tool_001", "{}"),
        ScriptedTurn::tool_call("tool_002", "{}"),
        ScriptedTurn::text("done"),
    ]);
    let stack = MiddlewareStack::new()
        // After the first tool ran, the second one is unlocked.
        .before_model("unlock", |ctx, messages| {
            if messages.iter().any(|m| m.role == Role::Tool) {
                ctx.insert_state(ActiveTools::new(["tool_002"]));
            }
            Ok(())
        })
        .push(ToolSelectionMiddleware::from_state());
    let agent = Agent::builder("staged")
        .model(main.clone())
        .tools(two_hundred_tools())
        .middleware(stack)
        .build()
        .unwrap();
    let ctx = RunContext::builder()
        .state(ActiveTools::new(["tool_001", "tool_003"]))
        .build();
    let run = agent
        .run_with(RunRequest::new("stage by stage").context(ctx))
        .await
        .unwrap();
    assert_eq!(run.counters.tool_calls, 2);
    let requests = main.requests();
    assert_eq!(offered(&requests[0].tools), ["tool_001", "tool_003"]);
    assert_eq!(offered(&requests[1].tools), ["tool_002"]);
}

#[tokio::test]
async fn a_forced_tool_is_offered_and_the_choice_reaches_the_model() {
    let main = ScriptedModel::new([
        ScriptedTurn::tool_call("tool_010", "{}"),
        ScriptedTurn::text("done"),
    ]);
    let agent = Agent::builder("forced")
        .model(main.clone())
        .tools(two_hundred_tools())
        .settings(tower_agent::types::ModelSettings {
            tool_choice: Some(ToolChoice::tool("tool_010")),
            ..Default::default()
        })
        .middleware(
            MiddlewareStack::new().push(ToolSelectionMiddleware::from_fn(|_, _, _| {
                vec!["tool_020".into()]
            })),
        )
        .build()
        .unwrap();
    let run = agent.run("go").await.unwrap();
    assert_eq!(run.counters.tool_calls, 1);
    let first = &main.requests()[0];
    assert_eq!(offered(&first.tools), ["tool_010", "tool_020"]);
    assert_eq!(
        first.settings.tool_choice,
        Some(ToolChoice::tool("tool_010"))
    );
}
