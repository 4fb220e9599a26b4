//! The text parts of one message are masked as one text: a value split
//! across parts is found, and the masked parts join up to the masked whole.

use proptest::prelude::*;
use serde::Deserialize;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent::layers::pii::{MaskPiiLayer, PiiEngine};
use tower_agent::types::{ContentPart, Message, MessageContent, ModelRequest, Role};
use tower_agent::{ModelCall, RunContext, ScriptedModel, ScriptedTurn};

#[derive(Debug, Deserialize)]
struct Case {
    text: String,
    value: Option<String>,
}

fn positives() -> Vec<Case> {
    include_str!("data/pii_corpus.jsonl")
        .lines()
        .chain(include_str!("data/pii_formats.jsonl").lines())
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<Case>(l).expect("valid corpus line"))
        .filter(|c| c.value.is_some())
        .collect()
}

/// Cuts `text` at the given fractions of its length (moved to `char`
/// boundaries), giving parts that may be empty.
fn split<'a>(text: &'a str, cuts: &[f64]) -> Vec<&'a str> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|f| {
            let mut i = ((text.len() as f64) * f) as usize;
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            i
        })
        .collect();
    at.sort_unstable();
    let mut parts = Vec::new();
    let mut last = 0;
    for i in at {
        parts.push(&text[last..i]);
        last = i;
    }
    parts.push(&text[last..]);
    parts
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn split_parts_mask_like_the_whole(
        index in any::<prop::sample::Index>(),
        cuts in prop::collection::vec(0.0f64..1.0, 1..4),
    ) {
        let cases = positives();
        let case = &cases[index.index(cases.len())];
        let engine = PiiEngine::default();
        let whole = engine.session().mask(&case.text).unwrap().into_owned();
        let parts = split(&case.text, &cuts);
        let masked = engine.session().mask_parts(&parts).unwrap();
        let joined = masked.map(|m| {
            prop_assert_eq!(m.len(), parts.len());
            Ok(m.concat())
        }).transpose()?.unwrap_or_else(|| case.text.clone());
        prop_assert_eq!(&joined, &whole, "parts {:?}", parts);
        let value = case.value.as_deref().unwrap();
        if whole != case.text {
            prop_assert!(!joined.contains(value), "{value} leaked from {parts:?}");
        }
    }
}

/// Every value of both corpora, cut at one or two random points inside the
/// value itself (seeded, so the cuts are the same on every run): the parts
/// mask like the whole text, and no part keeps the value.
#[test]
fn every_corpus_value_split_inside_is_masked() {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let engine = PiiEngine::default();
    let mut split_values = 0;
    for case in positives() {
        let value = case.value.as_deref().unwrap();
        let at = case.text.find(value).unwrap();
        let inner: Vec<usize> = (at + 1..at + value.len())
            .filter(|&i| case.text.is_char_boundary(i))
            .collect();
        if inner.is_empty() {
            continue;
        }
        let mut cuts = vec![inner[next(inner.len())], inner[next(inner.len())]];
        cuts.sort_unstable();
        cuts.dedup();
        let mut parts = Vec::new();
        let mut last = 0;
        for &cut in &cuts {
            parts.push(&case.text[last..cut]);
            last = cut;
        }
        parts.push(&case.text[last..]);
        let whole = engine.session().mask(&case.text).unwrap().into_owned();
        let Some(masked) = engine.session().mask_parts(&parts).unwrap() else {
            // Not found as a whole either (the corpus test counts it).
            assert_eq!(whole, case.text);
            continue;
        };
        assert_eq!(masked.concat(), whole, "parts {parts:?}");
        for part in &masked {
            assert!(!part.contains(value), "{value} leaked from {parts:?}");
        }
        split_values += 1;
    }
    assert!(split_values > 900, "{split_values}");
}

#[test]
fn a_value_split_across_parts_is_found() {
    let parts = ["Mail ann@exa", "mple.com", " or call +44 20 ", "7946 0958."];
    let masked = PiiEngine::default()
        .session()
        .mask_parts(&parts)
        .unwrap()
        .unwrap();
    assert_eq!(masked, ["Mail <EMAIL_1>", "", " or call <PHONE_1>", "."]);
    assert!(PiiEngine::default()
        .session()
        .mask_parts(&["no", "thing"])
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn the_layer_masks_a_message_s_parts_as_one_text() {
    let model = ScriptedModel::new([ScriptedTurn::text("ok")]);
    let mut svc = ServiceBuilder::new()
        .layer(MaskPiiLayer::new())
        .service(model.clone());
    let mut message = Message::user("");
    message.content = Some(MessageContent::Parts(vec![
        ContentPart::Text {
            text: "write to bob@ex".into(),
        },
        ContentPart::Text {
            text: "ample.org today".into(),
        },
    ]));
    let call = ModelCall::new(ModelRequest::new("m", vec![message]), RunContext::new());
    svc.ready().await.unwrap().call(call).await.unwrap();
    let sent = &model.requests()[0].messages[0];
    assert_eq!(sent.role, Role::User);
    let Some(MessageContent::Parts(parts)) = &sent.content else {
        panic!("{sent:?}")
    };
    let texts: Vec<_> = parts
        .iter()
        .filter_map(|p| match p {
            ContentPart::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, ["write to <EMAIL_1>", " today"]);
}
