//! Restoring placeholders inside JSON (tool-call arguments): a value restored
//! inside a JSON string is escaped for it, so the arguments still parse and
//! decode to the original value.

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::Value;
use tower_agent::layers::pii::{CustomDetector, PiiConfig, PiiEngine};

const PEM: &str = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgHcTz6sE2I2yPB\naFDrBz9vFqU4yVpzt5Jgh0Q=\n-----END RSA PRIVATE KEY-----";

#[test]
fn a_multi_line_pem_key_restored_into_arguments_parses_and_equals_the_original() {
    let session = PiiEngine::default().session();
    let prompt = format!("Deploy with this key:\n{PEM}\nthanks");
    let masked = session.mask(&prompt).unwrap();
    assert!(masked.contains("<PRIVATE_KEY_1>"), "{masked}");
    let args = r#"{"key": "<PRIVATE_KEY_1>", "note": "<PRIVATE_KEY_1> again"}"#;
    let restored = session.restore_json(args);
    let parsed: Value = serde_json::from_str(&restored).expect("the arguments still parse");
    assert_eq!(parsed["key"], PEM);
    assert_eq!(parsed["note"], format!("{PEM} again"));
    // Outside a string, or in plain text, the value goes in as it is.
    assert_eq!(session.restore("<PRIVATE_KEY_1>"), PEM);
}

#[test]
fn a_key_masked_from_json_arrives_unchanged() {
    let session = PiiEngine::default().session();
    let args = serde_json::json!({ "key": PEM, "mail": "ann@example.com" }).to_string();
    let masked = session.mask_json(&args).unwrap().into_owned();
    assert!(!masked.contains("ann@example.com"), "{masked}");
    assert_eq!(session.restore_json(&masked), args);
}

#[test]
fn a_streamed_json_restore_matches_the_whole() {
    let session = Arc::new(PiiEngine::default().session());
    session
        .mask(&format!("key {PEM} and \"ann@example.com\""))
        .unwrap();
    let args = r#"{"key":"<PRIVATE_KEY_1>","to":"<EMAIL_1>"} <EMAIL_1>"#;
    let whole = session.restore_json(args).into_owned();
    for size in 1..12 {
        let mut restorer = session.json_stream_restorer();
        let mut out = String::new();
        let chars: Vec<char> = args.chars().collect();
        for chunk in chars.chunks(size) {
            out += &restorer.push(&chunk.iter().collect::<String>());
        }
        out += &restorer.finish();
        assert_eq!(out, whole, "chunk size {size}");
    }
}

/// A detector for whatever stands between `«` and `»`.
fn marked() -> PiiEngine {
    PiiConfig::empty()
        .custom(CustomDetector::from_fn("secret", |text: &str| {
            let mut found = Vec::new();
            let mut from = 0;
            while let Some(open) = text[from..].find('«').map(|i| from + i + '«'.len_utf8()) {
                let Some(close) = text[open..].find('»').map(|i| open + i) else {
                    break;
                };
                found.push(open..close);
                from = close;
            }
            found
        }))
        .build()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn restore_into_json_decodes_to_the_value(
        value in "[a-zA-Zäöü€中\"\\\\\n\r\t\u{1}/ {}:,]{1,40}",
        cut in 0usize..64,
    ) {
        let session = Arc::new(marked().session());
        let masked = session.mask(&format!("x «{value}» y")).unwrap().into_owned();
        prop_assert_eq!(&masked, "x «<SECRET_1>» y");
        // Keys with digits, which no value has: a value `a` would collide with a key `a`.
        let args = r#"{"k1": "<SECRET_1>", "k2": ["pre <SECRET_1> post"], "<SECRET_1>": 1}"#;
        let restored = session.restore_json(args).into_owned();
        let parsed: Value = serde_json::from_str(&restored).map_err(|e| TestCaseError::fail(format!("{e}: {restored}")))?;
        prop_assert_eq!(parsed["k1"].as_str(), Some(value.as_str()));
        let inner = format!("pre {value} post");
        prop_assert_eq!(parsed["k2"][0].as_str(), Some(inner.as_str()));
        prop_assert_eq!(&parsed[value.as_str()], &Value::from(1));

        // Streamed in two pieces, the same.
        let cut = (0..=cut.min(args.len())).rev().find(|&i| args.is_char_boundary(i)).unwrap();
        let mut restorer = session.json_stream_restorer();
        let mut out = restorer.push(&args[..cut]);
        out += &restorer.push(&args[cut..]);
        out += &restorer.finish();
        prop_assert_eq!(out, restored);

        // Masked from JSON, a value comes back exactly as it stood.
        let json = serde_json::json!({ "v": format!("«{value}»") }).to_string();
        let fresh = marked().session();
        let masked = fresh.mask_json(&json).unwrap().into_owned();
        prop_assert_eq!(fresh.restore_json(&masked), json);
    }
}

#[tokio::test]
async fn the_layer_restores_a_pem_key_into_tool_arguments_as_json() {
    use tower::{Layer, Service, ServiceExt};
    use tower_agent::layers::pii::MaskPiiLayer;
    use tower_agent::types::{Message, ModelRequest, ModelResponse, ToolCall};
    use tower_agent::{ModelCall, RunContext};
    use tower_test::mock;

    let (mock, mut handle) = mock::pair::<ModelCall, ModelResponse>();
    let mut svc = MaskPiiLayer::new().layer(mock);
    handle.allow(1);
    let prompt = format!("Install this key:\n{PEM}");
    let call = ModelCall::new(
        ModelRequest::new("m", vec![Message::user(prompt)]),
        RunContext::new(),
    );
    let response = svc.ready().await.unwrap().call(call);
    let (seen, reply) = handle.next_request().await.unwrap();
    assert_eq!(
        seen.request.messages[0].text(),
        "Install this key:\n<PRIVATE_KEY_1>"
    );
    reply.send_response(ModelResponse::new(
        "m",
        Message::assistant_tool_calls(vec![ToolCall::new(
            "c1",
            "install",
            r#"{"key":"<PRIVATE_KEY_1>"}"#,
        )]),
    ));
    let response = response.await.unwrap();
    let args: Value = serde_json::from_str(&response.message.tool_calls[0].arguments).unwrap();
    assert_eq!(args["key"], PEM);
}
