//! The streaming output guard's guarantee, for any chunking: what was
//! released equals the guarded full text, and after a block nothing past
//! the last released point was released.
#![cfg(feature = "guards")]

use proptest::prelude::*;
use tower_agent::lifecycle::builtin::guards::{guard_text, GuardVerdict, StreamGuard};

fn check(seg: &str) -> GuardVerdict {
    if seg.contains("BAD") {
        GuardVerdict::Block {
            reason: "bad".into(),
            info: None,
        }
    } else if seg.contains("key") {
        GuardVerdict::Rewrite(seg.replace("key", "***"))
    } else {
        GuardVerdict::Pass
    }
}

fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just("a".to_owned()),
            Just("key".to_owned()),
            Just("BAD".to_owned()),
            Just(" ".to_owned()),
            Just(". ".to_owned()),
            Just("!".to_owned()),
            Just("\n".to_owned()),
            Just("é".to_owned()),
            Just("。".to_owned()),
            Just("word".to_owned()),
            Just("?x".to_owned()),
        ],
        0..60,
    )
    .prop_map(|parts| parts.concat())
}

/// `text` cut at the given fractions, on char boundaries.
fn chunks(text: &str, cuts: &[usize]) -> Vec<String> {
    let bounds: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain([text.len()])
        .collect();
    let mut at: Vec<usize> = cuts.iter().map(|c| bounds[c % bounds.len()]).collect();
    at.push(0);
    at.push(text.len());
    at.sort_unstable();
    at.dedup();
    at.windows(2).map(|w| text[w[0]..w[1]].to_owned()).collect()
}

proptest! {
    #[test]
    fn released_text_equals_the_guarded_full_text(
        text in text(),
        cuts in proptest::collection::vec(any::<usize>(), 0..20),
        hold in 1usize..40,
    ) {
        let expected = guard_text(&text, hold, check);
        let mut guard = StreamGuard::new(check).max_hold(hold);
        let mut sink = String::new();
        let mut outcome = Ok(());
        for chunk in chunks(&text, &cuts) {
            let step = guard.push(&chunk);
            sink.push_str(&step.text);
            if let Some(b) = step.blocked {
                outcome = Err(b);
                break;
            }
        }
        if outcome.is_ok() {
            let step = guard.finish();
            sink.push_str(&step.text);
            if let Some(b) = step.blocked {
                outcome = Err(b);
            }
        }
        match (expected, outcome) {
            (Ok(full), Ok(())) => prop_assert_eq!(sink, full),
            (Err((released, blocked)), Err(b)) => {
                prop_assert_eq!(&sink, &released, "nothing past the last released point");
                prop_assert_eq!(b.at, blocked.at);
            }
            (e, o) => prop_assert!(false, "full text {:?}, stream {:?}", e, o),
        }
    }
}

mod full_run {
    use std::sync::{Arc, Mutex};

    use proptest::prelude::*;
    use tower::{Layer, ServiceExt};
    use tower_agent::lifecycle::builtin::guards::{guard_text, StreamingOutputGuard};
    use tower_agent::lifecycle::{LifecycleLayer, MiddlewareStack};
    use tower_agent::types::ModelDelta;
    use tower_agent::{Agent, AgentError, DeltaSink, RunRequest, ScriptedModel, ScriptedTurn};

    fn streamed_run(text: &str, chunk: usize, hold: usize) -> (Result<String, AgentError>, String) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let seen = Arc::new(Mutex::new(String::new()));
            let sink_seen = seen.clone();
            let sink = DeltaSink::new(move |d| {
                if let ModelDelta::Text { text } = d {
                    sink_seen.lock().unwrap().push_str(text);
                }
            });
            let model = ScriptedModel::new([ScriptedTurn::text(text).chunk_chars(chunk)]);
            let agent = Agent::builder("a").model(model).build().unwrap();
            let guard = StreamingOutputGuard::new("output-guard", super::check).max_hold(hold);
            let run = LifecycleLayer::new(MiddlewareStack::new().push_model(guard))
                .layer(agent)
                .oneshot(RunRequest::new("q").stream(sink))
                .await;
            let seen = seen.lock().unwrap().clone();
            (run.map(|r| r.output), seen)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn a_streamed_run_sends_exactly_the_guarded_text(
            text in super::text().prop_filter("an answer", |t| !t.is_empty()),
            chunk in 1usize..12,
            hold in 1usize..40,
        ) {
            let (run, seen) = streamed_run(&text, chunk, hold);
            match (guard_text(&text, hold, super::check), run) {
                (Ok(full), Ok(output)) => {
                    prop_assert_eq!(&seen, &full);
                    prop_assert_eq!(output, full);
                }
                (Err((released, _)), Err(err)) => {
                    prop_assert_eq!(seen, released);
                    let tripped = matches!(&err, AgentError::Tripwire { middleware, .. } if middleware == "output-guard");
                    prop_assert!(tripped, "{:?}", err);
                }
                (e, r) => prop_assert!(false, "guarded {:?}, run {:?}", e, r),
            }
        }
    }
}

/// The same guarantee through `GuardrailsMiddleware`, whose output guards
/// are async and checked while the model streams on.
mod guardrails_run {
    use std::sync::{Arc, Mutex};

    use proptest::prelude::*;
    use tower_agent::lifecycle::builtin::guards::{
        guard_fn, guard_text, GuardrailsMiddleware, OutputWindow,
    };
    use tower_agent::types::ModelDelta;
    use tower_agent::{Agent, AgentError, DeltaSink, RunRequest, ScriptedModel, ScriptedTurn};

    fn streamed_run(text: &str, chunk: usize, hold: usize) -> (Result<String, AgentError>, String) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let seen = Arc::new(Mutex::new(String::new()));
            let sink_seen = seen.clone();
            let sink = DeltaSink::new(move |d| {
                if let ModelDelta::Text { text } = d {
                    sink_seen.lock().unwrap().push_str(text);
                }
            });
            let model = ScriptedModel::new([ScriptedTurn::text(text).chunk_chars(chunk)]);
            let guards = GuardrailsMiddleware::new()
                .output(guard_fn("g", |_, _, seg| super::check(seg)))
                .output_window(OutputWindow::Segments { max_hold: hold });
            let agent = Agent::builder("a")
                .model(model)
                .middleware(guards)
                .build()
                .unwrap();
            let run = agent.run_with(RunRequest::new("q").stream(sink)).await;
            let seen = seen.lock().unwrap().clone();
            (run.map(|r| r.output), seen)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn a_guarded_run_sends_exactly_the_guarded_text(
            text in super::text().prop_filter("an answer", |t| !t.is_empty()),
            chunk in 1usize..12,
            hold in 1usize..40,
        ) {
            let (run, seen) = streamed_run(&text, chunk, hold);
            match (guard_text(&text, hold, super::check), run) {
                (Ok(full), Ok(output)) => {
                    prop_assert_eq!(&seen, &full);
                    prop_assert_eq!(output, full);
                }
                (Err((released, blocked)), Err(err)) => {
                    prop_assert_eq!(seen, released);
                    let tripped = matches!(&err, AgentError::Tripwire { middleware, info: Some(info), .. }
                        if middleware == "guardrails" && info["guard"] == "g" && info["released_bytes"] == blocked.at);
                    prop_assert!(tripped, "{:?}", err);
                }
                (e, r) => prop_assert!(false, "guarded {:?}, run {:?}", e, r),
            }
        }
    }
}
