use std::sync::{Arc, Mutex};

use tower::{Layer, Service, ServiceExt};

use super::MaskPii;
use crate::context::RunContext;
use crate::layers::pii::{CustomDetector, MaskPiiLayer};
use crate::request::{DeltaSink, ModelCall};
use crate::service::{ScriptedModel, ScriptedTurn};
use crate::types::{History, Message, ModelDelta, ModelRequest};

/// A layer whose custom detector records every text the engine scans (and
/// finds nothing), and a model answering `answer` to every call.
fn counting(
    answer: &str,
) -> (
    MaskPii<ScriptedModel>,
    ScriptedModel,
    Arc<Mutex<Vec<String>>>,
) {
    let scanned = Arc::new(Mutex::new(Vec::new()));
    let log = scanned.clone();
    let detector = CustomDetector::from_fn("count", move |text| {
        log.lock().unwrap().push(text.to_owned());
        Vec::new()
    });
    let answer = answer.to_owned();
    let model = ScriptedModel::from_fn(move |_| ScriptedTurn::text(answer.clone()));
    let svc = MaskPiiLayer::new().custom(detector).layer(model.clone());
    (svc, model, scanned)
}

async fn send(svc: &mut MaskPii<ScriptedModel>, ctx: &RunContext, history: &History) -> String {
    let call = ModelCall::new(ModelRequest::new("m", history.clone()), ctx.clone());
    let response = svc.ready().await.unwrap().call(call).await.unwrap();
    response.message.text().into_owned()
}

fn take(scanned: &Mutex<Vec<String>>) -> Vec<String> {
    std::mem::take(&mut *scanned.lock().unwrap())
}

#[tokio::test]
async fn each_message_is_scanned_once_per_run_through_appends_edits_and_copies() {
    let (mut svc, model, scanned) = counting("ok");
    let ctx = RunContext::new();
    let mut history = History::from(vec![Message::user("first")]);
    send(&mut svc, &ctx, &history).await;
    assert_eq!(take(&scanned), ["first"]);

    // The same history again: nothing is scanned.
    send(&mut svc, &ctx, &history).await;
    assert!(take(&scanned).is_empty());

    // Appends: only the new messages.
    history.push(Message::assistant("second"));
    history.push(Message::user("third"));
    send(&mut svc, &ctx, &history).await;
    assert_eq!(take(&scanned), ["second", "third"]);

    // An edit of the last message: the ones before it are not scanned again.
    history.to_mut()[2] = Message::user("third, edited");
    send(&mut svc, &ctx, &history).await;
    assert_eq!(take(&scanned), ["third, edited"]);

    // A copy with equal messages (a new lineage): nothing to scan.
    let copy = History::from(history.to_vec());
    assert_ne!(copy.lineage(), history.lineage());
    send(&mut svc, &ctx, &copy).await;
    assert!(take(&scanned).is_empty());

    // A shorter copy, then the history grown from it.
    let mut short = History::from(history.to_vec()[..1].to_vec());
    send(&mut svc, &ctx, &short).await;
    short.push(Message::assistant("another second"));
    send(&mut svc, &ctx, &short).await;
    assert_eq!(take(&scanned), ["another second"]);

    // Another run through a clone of the service, continuing the clean
    // history: it scans only what it adds.
    let mut other = svc.clone();
    let next = RunContext::new();
    send(&mut other, &next, &short).await;
    assert!(take(&scanned).is_empty());
    short.push(Message::user("a new run's question"));
    send(&mut other, &next, &short).await;
    assert_eq!(take(&scanned), ["a new run's question"]);

    let seen = model.requests();
    assert_eq!(seen.len(), 9);
    assert_eq!(seen[3].messages[2].text(), "third, edited");
    assert_eq!(seen[6].messages.len(), 2);
    assert_eq!(seen[6].messages[1].text(), "another second");
}

#[tokio::test]
async fn an_edit_after_a_masked_message_keeps_its_placeholders() {
    let model = ScriptedModel::from_fn(|_| ScriptedTurn::text("to <EMAIL_1>"));
    let mut svc = MaskPiiLayer::new().layer(model.clone());
    let ctx = RunContext::new();
    let mut history = History::from(vec![
        Message::user("clean"),
        Message::user("mail ann@example.com"),
        Message::user("and then"),
    ]);
    let call = ModelCall::new(ModelRequest::new("m", history.clone()), ctx.clone());
    let answer = svc.ready().await.unwrap().call(call).await.unwrap();
    assert_eq!(answer.message.text(), "to ann@example.com");

    history.to_mut()[2] = Message::user("and bob@example.org");
    let call = ModelCall::new(ModelRequest::new("m", history.clone()), ctx.clone());
    svc.ready().await.unwrap().call(call).await.unwrap();

    // The masked message goes away: the clean prefix is sent as it is, and
    // the answer to it is the model's own text (it read no placeholder).
    history.to_mut().truncate(1);
    let call = ModelCall::new(ModelRequest::new("m", history.clone()), ctx.clone());
    let answer = svc.ready().await.unwrap().call(call).await.unwrap();
    assert_eq!(answer.message.text(), "to <EMAIL_1>");

    let seen = model.requests();
    let texts = |i: usize| -> Vec<String> {
        seen[i]
            .messages
            .iter()
            .map(|m| m.text().into_owned())
            .collect()
    };
    assert_eq!(texts(0), ["clean", "mail <EMAIL_1>", "and then"]);
    assert_eq!(texts(1), ["clean", "mail <EMAIL_1>", "and <EMAIL_2>"]);
    assert_eq!(texts(2), ["clean"]);
}

#[tokio::test]
async fn a_run_that_masks_something_skips_the_messages_seen_clean() {
    let (mut svc, model, scanned) = counting("ok");
    let ctx = RunContext::new();
    let mut history = History::from(vec![Message::user("mail ann@example.com")]);
    send(&mut svc, &ctx, &history).await;
    take(&scanned);
    history.push(Message::assistant("noted"));
    send(&mut svc, &ctx, &history).await;
    assert_eq!(take(&scanned), ["noted"]);

    // Another run, another address, the same reply: only the address is read.
    let other = History::from(vec![
        Message::user("mail bob@example.org"),
        Message::assistant("noted"),
    ]);
    send(&mut svc, &RunContext::new(), &other).await;
    assert!(take(&scanned).iter().all(|text| text != "noted"));
    let seen = model.requests();
    let texts: Vec<String> = seen[2]
        .messages
        .iter()
        .map(|m| m.text().into_owned())
        .collect();
    assert_eq!(texts, ["mail <EMAIL_1>", "noted"]);

    // An edit after the masked message: it keeps its masked form, unread.
    let ctx = RunContext::new();
    send(&mut svc, &ctx, &other).await;
    take(&scanned);
    let mut edited = other.clone();
    edited.to_mut()[1] = Message::assistant("noted, twice");
    send(&mut svc, &ctx, &edited).await;
    assert_eq!(take(&scanned), ["noted, twice"]);
    let last = model.requests().pop().unwrap();
    assert_eq!(last.messages[0].text(), "mail <EMAIL_1>");
    assert_eq!(last.messages[1].text(), "noted, twice");
}

#[tokio::test]
async fn a_call_that_masked_nothing_returns_the_answer_untouched() {
    // The session handed out no placeholder: `<EMAIL_1>` is the model's own text.
    let (mut svc, _, _) = counting("write to <EMAIL_1>");
    let ctx = RunContext::new();
    let history = History::from(vec![Message::user("hello")]);
    assert_eq!(send(&mut svc, &ctx, &history).await, "write to <EMAIL_1>");

    // Streamed: the caller's sink gets the deltas as they are.
    let model = ScriptedModel::new([ScriptedTurn::text("a <EMAIL_1> b").chunk_chars(3)]);
    let mut svc = MaskPiiLayer::new().layer(model);
    let got = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let got = got.clone();
        DeltaSink::new(move |delta| {
            if let ModelDelta::Text { text } = delta {
                got.lock().unwrap().push(text.clone());
            }
        })
    };
    let mut call = ModelCall::new(ModelRequest::new("m", history), RunContext::new());
    call.stream = Some(sink);
    let answer = svc.ready().await.unwrap().call(call).await.unwrap();
    assert_eq!(answer.message.text(), "a <EMAIL_1> b");
    assert_eq!(got.lock().unwrap().concat(), "a <EMAIL_1> b");
    assert!(got.lock().unwrap().len() > 1, "streamed in deltas");
}

#[test]
fn the_future_is_the_inner_future_and_a_few_words() {
    type Inner = std::future::Ready<Result<crate::types::ModelResponse, crate::BoxError>>;
    let inner = std::mem::size_of::<Inner>();
    let outer = std::mem::size_of::<super::future::ResponseFuture<Inner>>();
    assert!(
        outer <= inner + 3 * std::mem::size_of::<usize>(),
        "{outer} vs {inner}"
    );
}
