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
