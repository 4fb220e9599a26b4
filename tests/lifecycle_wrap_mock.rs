//! Wrap layers in isolation, on `tower-test`'s mock: readiness is forwarded
//! and every call is made ready first.

use std::task::Poll;

use tower::Layer;
use tower_agent::lifecycle::{from_fn, ModelNext};
use tower_agent::types::{Message, ModelRequest, ModelResponse};
use tower_agent::{BoxError, ModelCall, RunContext};
use tower_test::mock;

fn call(text: &str) -> ModelCall {
    ModelCall::new(
        ModelRequest::new("m", vec![Message::user(text)]),
        RunContext::new(),
    )
}

fn answer(text: &str) -> ModelResponse {
    ModelResponse::new("m", Message::assistant(text))
}

#[tokio::test]
async fn from_fn_forwards_readiness_and_makes_each_run_ready() {
    let (inner, mut handle) = mock::pair::<ModelCall, ModelResponse>();
    // Calls the rest twice and joins the answers.
    let layer = from_fn(|call: ModelCall, next: ModelNext| async move {
        let first = next.clone().run(call.clone()).await?;
        let second = next.run(call).await?;
        let text = format!("{}+{}", first.message.text(), second.message.text());
        Ok::<_, BoxError>(answer(&text))
    });
    let mut service = mock::Spawn::new(layer.layer(inner));

    handle.allow(0);
    assert!(
        matches!(service.poll_ready(), Poll::Pending),
        "readiness is forwarded"
    );
    handle.allow(1);
    assert!(matches!(service.poll_ready(), Poll::Ready(Ok(()))));
    let response = tokio::spawn(service.call(call("hi")));

    // The first run uses the service made ready above.
    let (request, reply) = handle.next_request().await.unwrap();
    assert_eq!(request.request.messages[0].text(), "hi");
    reply.send_response(answer("a"));
    // The second run needs readiness of its own: it waits for it.
    tokio::task::yield_now().await;
    handle.allow(1);
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_response(answer("b"));

    let response = response.await.unwrap().unwrap();
    assert_eq!(response.message.text(), "a+b");
}

#[tokio::test]
async fn an_inner_error_passes_through_from_fn() {
    let (inner, mut handle) = mock::pair::<ModelCall, ModelResponse>();
    let layer = from_fn(|call: ModelCall, next: ModelNext| next.run(call));
    let mut service = mock::Spawn::new(layer.layer(inner));
    handle.allow(1);
    assert!(matches!(service.poll_ready(), Poll::Ready(Ok(()))));
    let response = tokio::spawn(service.call(call("hi")));
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_error(tower_agent::ProviderError::unavailable("down"));
    let err = response.await.unwrap().unwrap_err();
    assert_eq!(
        tower_agent::error::kind_of(err.as_ref()),
        tower_agent::ErrorKind::Unavailable
    );
}
