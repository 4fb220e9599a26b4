//! The PII layer: masking what the model reads, restoring what it writes,
//! in isolation and in full runs, streamed and not.

use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use schemars::JsonSchema;
use serde::Deserialize;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent::event::{AgentEvent, CollectingSink};
use tower_agent::layers::pii::{CustomDetector, MaskPiiLayer, PiiConfig, PiiKind, Strategy};
use tower_agent::types::{Message, ModelDelta, ModelRequest, ModelResponse, Role};
use tower_agent::{
    tool_sync, Agent, BoxError, DeltaSink, ModelCall, RunContext, RunRequest, ScriptedModel,
    ScriptedTurn, ToolRouter,
};
use tower_test::mock;

fn layer() -> MaskPiiLayer {
    MaskPiiLayer::new()
}

#[tokio::test]
async fn the_inner_service_reads_placeholders_and_the_caller_reads_values() {
    let (mut svc, mut handle) = mock::spawn_layer::<ModelCall, ModelResponse, _>(layer());
    let call = ModelCall::new(
        ModelRequest::new(
            "m",
            vec![Message::user(
                "Card 4111 1111 1111 1111, mail bob@example.org, again bob@example.org",
            )],
        ),
        RunContext::new(),
    );
    assert!(matches!(svc.poll_ready(), std::task::Poll::Ready(Ok(()))));
    let response = svc.call(call);
    let (seen, reply) = handle.next_request().await.unwrap();
    assert_eq!(
        seen.request.messages[0].text(),
        "Card <CREDIT_CARD_1>, mail <EMAIL_1>, again <EMAIL_1>"
    );
    reply.send_response(ModelResponse::new(
        "m",
        Message::assistant("Charged <CREDIT_CARD_1>; receipt to <EMAIL_1>."),
    ));
    let response = response.await.unwrap();
    assert_eq!(
        response.message.text(),
        "Charged 4111 1111 1111 1111; receipt to bob@example.org."
    );
}

#[derive(Deserialize, JsonSchema)]
struct Send {
    to: String,
}

#[tokio::test]
async fn tools_get_real_values_and_their_results_are_masked_for_the_model() {
    let sent_to = Arc::new(Mutex::new(Vec::new()));
    let record = sent_to.clone();
    let tools = ToolRouter::new().tool(tool_sync("send", "Sends a mail", move |s: Send| {
        record.lock().unwrap().push(s.to.clone());
        Ok::<_, BoxError>(format!("sent to {}; call back on +44 20 7946 0958", s.to))
    }));
    let model = ScriptedModel::new([
        ScriptedTurn::tool_call("send", r#"{"to": "<EMAIL_1>"}"#),
        ScriptedTurn::text("Done, and their number is <PHONE_1>."),
    ]);
    let sink = CollectingSink::new();
    let agent = Agent::builder("mailer")
        .model(ServiceBuilder::new().layer(layer()).service(model.clone()))
        .tools(tools)
        .build()
        .unwrap();
    let ctx = RunContext::builder().events(sink.clone()).build();
    let run = agent
        .oneshot(RunRequest::new("Mail ann@example.com please").context(ctx))
        .await
        .unwrap();
    assert_eq!(*sent_to.lock().unwrap(), ["ann@example.com"]);
    assert_eq!(run.output, "Done, and their number is +44 20 7946 0958.");
    // The transcript keeps the real values; the model never saw them.
    assert!(run
        .messages
        .iter()
        .any(|m| m.text().contains("ann@example.com")));
    for request in model.requests() {
        let wire = serde_json::to_string(&request.messages).unwrap();
        assert!(
            !wire.contains("ann@example.com") && !wire.contains("7946"),
            "{wire}"
        );
    }
    let second = &model.requests()[1];
    let tool_result = second
        .messages
        .iter()
        .find(|m| m.role == Role::Tool)
        .unwrap();
    assert_eq!(
        tool_result.text(),
        "sent to <EMAIL_1>; call back on <PHONE_1>"
    );
    // Each turn masked only what was new: the input, then the tool result
    // (the assistant's call carries <EMAIL_1> already).
    let counts: Vec<usize> = sink
        .events()
        .iter()
        .filter_map(|e| match e {
            AgentEvent::PiiMasked { count, .. } => Some(*count),
            _ => None,
        })
        .collect();
    assert_eq!(counts, [1, 2]);
}

#[tokio::test]
async fn a_blocked_kind_trips_the_run() {
    let model = ScriptedModel::new([ScriptedTurn::text("never")]);
    let agent = Agent::builder("a")
        .model(
            ServiceBuilder::new()
                .layer(MaskPiiLayer::new().block(PiiKind::ApiKey))
                .service(model.clone()),
        )
        .build()
        .unwrap();
    let err = agent
        .run("my key is sk-proj-abcdefghijklmnopqrstuvwxyz123456")
        .await
        .unwrap_err();
    assert_eq!(err.code(), "GUARDRAIL_TRIPPED");
    let tower_agent::AgentError::Tripwire {
        middleware, info, ..
    } = err
    else {
        panic!()
    };
    assert_eq!(middleware, "pii");
    assert_eq!(info.unwrap()["kind"], "API_KEY");
    assert_eq!(model.requests().len(), 0, "nothing reached the model");
}

#[tokio::test]
async fn an_edited_history_is_masked_again_with_the_same_placeholders() {
    let model = ScriptedModel::new([ScriptedTurn::text("a"), ScriptedTurn::text("b")]);
    let mut svc = ServiceBuilder::new().layer(layer()).service(model.clone());
    let ctx = RunContext::new();
    let mut history = tower_agent::types::History::from(vec![Message::user(
        "ann@example.com and bob@example.org",
    )]);
    let call = ModelCall::new(ModelRequest::new("m", history.clone()), ctx.clone());
    svc.ready().await.unwrap().call(call).await.unwrap();
    // A middleware rewrites the history: only bob is left.
    history.to_mut()[0] = Message::user("just bob@example.org");
    let call = ModelCall::new(ModelRequest::new("m", history.clone()), ctx);
    svc.ready().await.unwrap().call(call).await.unwrap();
    let seen = model.requests();
    assert_eq!(seen[0].messages[0].text(), "<EMAIL_1> and <EMAIL_2>");
    assert_eq!(seen[1].messages[0].text(), "just <EMAIL_2>");
}

/// Streams `answer` in pieces of `chunk` chars through the layer; returns
/// the concatenated deltas and the final output.
async fn streamed(answer: &str, chunk: usize) -> (String, String) {
    let model = ScriptedModel::new([ScriptedTurn::text(answer).chunk_chars(chunk)]);
    let agent = Agent::builder("a")
        .model(ServiceBuilder::new().layer(layer()).service(model))
        .build()
        .unwrap();
    let text = Arc::new(Mutex::new(String::new()));
    let collect = text.clone();
    let sink = DeltaSink::new(move |delta| {
        if let ModelDelta::Text { text } = delta {
            collect.lock().unwrap().push_str(text);
        }
    });
    let run = agent
        .oneshot(
            RunRequest::new("Contact ann@example.com or +1-202-555-0143, card 4111-1111-1111-1111")
                .stream(sink),
        )
        .await
        .unwrap();
    let streamed = text.lock().unwrap().clone();
    (streamed, run.output)
}

#[tokio::test]
async fn streamed_deltas_are_restored() {
    let (text, output) = streamed("Mailing <EMAIL_1>, texting <PHONE_1>, not <EMAIL_9>.", 3).await;
    assert_eq!(
        output,
        "Mailing ann@example.com, texting +1-202-555-0143, not <EMAIL_9>."
    );
    assert_eq!(text, output);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Restoring a stream equals restoring the full text, for any chunking.
    #[test]
    fn streamed_text_equals_the_restored_answer(
        chunk in 1usize..12,
        parts in proptest::collection::vec(
            prop_oneof![
                Just("<EMAIL_1>".to_owned()),
                Just("<PHONE_1>".to_owned()),
                Just("<CREDIT_CARD_1>".to_owned()),
                Just("<".to_owned()),
                Just("<EMAIL_".to_owned()),
                "[a-z <>_0-9]{0,8}",
            ],
            0..12,
        ),
    ) {
        let answer: String = parts.concat();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (text, output) = rt.block_on(streamed(&answer, chunk));
        prop_assert_eq!(text, output);
    }

    /// A detected value never reaches the model.
    #[test]
    fn no_detected_value_reaches_the_model(
        user in "[a-z]{1,8}",
        domain in "[a-z]{2,8}",
        area in 201u32..989,
        line in 1000u32..9999,
        filler in "[a-zA-Z ,.]{0,40}",
    ) {
        let email = format!("{user}@{domain}.com");
        let phone = format!("+1-{area}-555-{line}");
        let input = format!("{filler} reach {email} or {phone} {filler}");
        let model = ScriptedModel::new([ScriptedTurn::text("ok")]);
        let agent = Agent::builder("a")
            .model(ServiceBuilder::new().layer(layer()).service(model.clone()))
            .build()
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(agent.run(input)).unwrap();
        let wire = serde_json::to_string(&model.requests()[0].messages).unwrap();
        prop_assert!(!wire.contains(&email), "{}", wire);
        prop_assert!(!wire.contains(&phone), "{}", wire);
    }
}

#[tokio::test]
async fn the_layer_is_its_own_builder() {
    let layer = MaskPiiLayer::new()
        .kinds([PiiKind::Email, PiiKind::Phone])
        .strategy(PiiKind::Phone, Strategy::Redact)
        .custom_pattern("ticket", r"\bT-\d{4}\b")
        .custom(CustomDetector::from_fn("codename", |t: &str| {
            t.match_indices("Bluebird")
                .map(|(i, m)| i..i + m.len())
                .collect()
        }))
        .hash_salt("s");
    let engine = layer.engine().unwrap();
    assert!(!engine.config().is_enabled(&PiiKind::CreditCard));
    assert_eq!(engine.config().custom_detectors()[0].name(), "ticket");
    assert_eq!(engine.config().custom_detectors()[1].name(), "codename");

    let model = ScriptedModel::new([ScriptedTurn::text("ok")]);
    let mut svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(model.clone());
    let call = ModelCall::new(
        ModelRequest::new(
            "m",
            vec![Message::user(
                "T-1234 Bluebird ann@example.com, +44 20 7946 0958, 4111 1111 1111 1111",
            )],
        ),
        RunContext::new(),
    );
    svc.ready().await.unwrap().call(call).await.unwrap();
    assert_eq!(
        model.requests()[0].messages[0].text(),
        "<TICKET_1> <CODENAME_1> <EMAIL_1>, [REDACTED_PHONE], 4111 1111 1111 1111"
    );

    // A disabled custom kind is gone, whichever way it was registered.
    let engine = layer.disable(PiiKind::custom("ticket")).engine().unwrap();
    assert_eq!(engine.config().custom_detectors().len(), 1);

    // An engine given to the layer is used as is, and setters build anew.
    let shared = PiiConfig::empty().enable(PiiKind::Email).build();
    let layer = MaskPiiLayer::with_engine(shared.clone());
    assert!(!layer.engine().unwrap().config().is_enabled(&PiiKind::Phone));
    let grown = layer.enable(PiiKind::Phone).engine().unwrap();
    assert!(grown.config().is_enabled(&PiiKind::Phone));
    assert!(grown.config().is_enabled(&PiiKind::Email));
}

#[tokio::test]
async fn a_bad_custom_pattern_is_a_config_error_at_validate_and_on_every_call() {
    let layer = MaskPiiLayer::new().custom_pattern("order", "ORD-(\\d+");
    let err = layer.validate().unwrap_err();
    assert_eq!(err.code(), "INVALID_CONFIG");
    assert!(err.to_string().contains("`order`"), "{err}");

    let model = ScriptedModel::new([ScriptedTurn::text("never")]);
    let agent = Agent::builder("a")
        .model(ServiceBuilder::new().layer(layer).service(model.clone()))
        .build()
        .unwrap();
    let err = agent.run("hello").await.unwrap_err();
    assert_eq!(err.code(), "INVALID_CONFIG", "{err}");
    assert_eq!(model.requests().len(), 0, "nothing reached the model");
}
