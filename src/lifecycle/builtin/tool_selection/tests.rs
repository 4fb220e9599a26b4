use serde_json::json;

use super::*;
use crate::types::{Message, ModelRequest, ToolChoice};

fn call(ctx: &RunContext, n: usize) -> ModelCall {
    let mut request = ModelRequest::new("m", vec![Message::user("hi")]);
    request.tools = (0..n)
        .map(|i| ToolSpec::new(format!("t{i}"), "", json!({})))
        .collect();
    ModelCall::new(request, ctx.clone())
}

fn names(call: &ModelCall) -> Vec<&str> {
    call.request.tools.iter().map(|t| t.name.as_str()).collect()
}

struct Failing;

impl ToolSelector for Failing {
    fn select<'a>(
        &'a self,
        _: &'a RunContext,
        _: &'a History,
        _: &'a [ToolSpec],
    ) -> BoxFuture<'a, Result<Vec<String>, BoxError>> {
        Box::pin(async { Err::<Vec<String>, BoxError>("selector down".into()) })
    }
}

async fn refusal(mw: &ToolSelectionMiddleware, ctx: &RunContext, tool: &str) -> Option<String> {
    let verdict = mw
        .before_tool(ctx, &ToolCall::new("c", tool, "{}"), false)
        .run()
        .await?
        .unwrap();
    match verdict.decision {
        crate::hooks::ToolDecision::Deny { reason } => Some(reason),
        other => panic!("expected a deny, got {other:?}"),
    }
}

#[tokio::test]
async fn offers_the_selection_in_the_agents_order_plus_what_must_be_offered() {
    let mw =
        ToolSelectionMiddleware::from_fn(|_, _, _| vec!["t5".into(), "t1".into(), "nope".into()])
            .always_include(["t7"]);
    let ctx = RunContext::new();
    let mut forced = call(&ctx, 10);
    forced.request.settings_mut().tool_choice = Some(ToolChoice::tool("t3"));
    let narrowed = mw.narrow(forced).await.unwrap();
    assert_eq!(names(&narrowed), ["t1", "t3", "t5", "t7"]);
    assert_eq!(refusal(&mw, &ctx, "t5").await, None);
    let refused = refusal(&mw, &ctx, "t2").await.unwrap();
    assert_eq!(
        refused,
        "the tool `t2` was not offered in this turn; the tools offered were: t1, t3, t5, t7. \
         Call one of those, or answer without a tool."
    );
}

#[tokio::test]
async fn from_state_reads_the_active_tools() {
    let mw = ToolSelectionMiddleware::from_state();
    let ctx = RunContext::new();
    assert_eq!(
        mw.narrow(call(&ctx, 3)).await.unwrap().request.tools.len(),
        3
    );
    ctx.insert_state(ActiveTools::new(["t2"]));
    assert_eq!(names(&mw.narrow(call(&ctx, 3)).await.unwrap()), ["t2"]);
    ctx.insert_state(ActiveTools::new(Vec::<String>::new()));
    let mut required = call(&ctx, 3);
    required.request.settings_mut().tool_choice = Some(ToolChoice::Required);
    let none = mw.narrow(required).await.unwrap();
    assert!(none.request.tools.is_empty());
    assert_eq!(
        none.request.settings.tool_choice, None,
        "no tools, no choice"
    );
    assert!(refusal(&mw, &ctx, "t0")
        .await
        .unwrap()
        .contains("no tools were offered"));
}

#[tokio::test]
async fn a_failing_selector_offers_everything_unless_fail_closed() {
    let ctx = RunContext::new();
    let open = ToolSelectionMiddleware::new(Failing);
    assert_eq!(
        open.narrow(call(&ctx, 4))
            .await
            .unwrap()
            .request
            .tools
            .len(),
        4
    );
    let closed = ToolSelectionMiddleware::new(Failing).fail_closed();
    let err = closed.narrow(call(&ctx, 4)).await.unwrap_err();
    assert_eq!(err.to_string(), "selector down");
}

#[tokio::test]
async fn another_selections_record_is_not_this_ones() {
    let first = ToolSelectionMiddleware::from_fn(|_, _, _| vec!["t0".into()]).named("first");
    let second = ToolSelectionMiddleware::from_fn(|_, _, _| vec![]).named("second");
    let ctx = RunContext::new();
    first.narrow(call(&ctx, 2)).await.unwrap();
    assert_eq!(refusal(&second, &ctx, "t1").await, None);
    assert!(refusal(&first, &ctx, "t1").await.is_some());
}
