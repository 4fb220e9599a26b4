//! The data model speaks the OpenAI chat-completions wire shape, and shares
//! its history instead of copying it.

use serde_json::json;
use tower_agent::types::{History, Message, ModelRequest, Role};
use tower_agent::{ModelCall, RunContext};

#[test]
fn a_transcript_round_trips_through_the_openai_wire_shape() {
    let wire = json!([
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": [
            {"type": "text", "text": "What's in this image?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "low"}}
        ]},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
            {"id": "call_def", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "18°C"},
        {"role": "tool", "tool_call_id": "call_def", "content": "noon"},
        {"role": "assistant", "content": "It is noon and 18°C in Paris.", "name": "weather-bot"}
    ]);
    let messages: Vec<Message> = serde_json::from_value(wire.clone()).unwrap();
    assert_eq!(messages[2].tool_calls[1].name, "get_time");
    assert_eq!(messages[3].role, Role::Tool);
    assert_eq!(messages[1].text(), "What's in this image?");
    let back = serde_json::to_value(&messages).unwrap();
    // `content: null` is written as an absent field; everything else is identical.
    let mut expected = wire;
    expected[2].as_object_mut().unwrap().remove("content");
    assert_eq!(back, expected);
    let again: Vec<Message> = serde_json::from_value(back).unwrap();
    assert_eq!(again, messages);
    assert_eq!(History::from(messages).check_integrity(), Ok(()));
}

#[test]
fn cloning_a_model_call_shares_a_long_history() {
    let history: History = (0..10_000)
        .map(|i| Message::user(format!("message {i}")))
        .collect();
    let call = ModelCall::new(ModelRequest::new("m", history.clone()), RunContext::new());
    let clone = call.clone();
    assert!(History::ptr_eq(
        &call.request.messages,
        &clone.request.messages
    ));
    assert!(History::ptr_eq(&clone.request.messages, &history));
    assert_eq!(clone.request.messages.len(), 10_000);
}

#[test]
fn the_history_digest_is_stable_across_copies() {
    let a: History = (0..100).map(|i| Message::user(format!("m{i}"))).collect();
    let b: History = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
    assert!(!History::ptr_eq(&a, &b));
    assert_eq!(a.digest(), b.digest());
}

#[test]
fn a_model_name_is_written_as_a_plain_string() {
    use std::sync::Arc;
    use tower_agent::event::AgentEvent;
    use tower_agent::types::ModelResponse;

    let response = ModelResponse::new("gpt-x", Message::assistant("hi"));
    let wire = serde_json::to_value(&response).unwrap();
    assert_eq!(wire["model"], json!("gpt-x"));
    let back: ModelResponse = serde_json::from_value(wire).unwrap();
    assert_eq!(back.model, "gpt-x");

    let event = AgentEvent::FallbackUsed {
        run_id: Arc::from("r"),
        from: "a".into(),
        to: "b".into(),
        code: "PROVIDER_UNAVAILABLE",
    };
    let wire = serde_json::to_value(&event).unwrap();
    assert_eq!(wire["from"], json!("a"));
    assert_eq!(wire["to"], json!("b"));
}
