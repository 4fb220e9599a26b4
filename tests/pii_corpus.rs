//! Recall and precision of the default PII engine over two labelled corpora.
//!
//! * `tests/data/pii_corpus.jsonl` (from `tests/data/gen_pii_corpus.py`):
//!   every kind in everyday surroundings, and near-misses.
//! * `tests/data/pii_formats.jsonl` (from `tests/data/gen_pii_formats.py`):
//!   the formats people really write (phone numbers of every supported
//!   country, MAC notations, secrets inside URLs, JWTs by their header,
//!   numbers of one kind laid out like another), each with its near-misses.
//!
//! One case a line: `{"text", "kind", "value"}`; positives contain exactly
//! one PII value (`kind` is its label, `value` the exact substring),
//! negatives (`kind: null`) contain none. A positive counts as recalled when
//! a detection has exactly its value and kind; a detection counts as true
//! when it is that labelled value, and as false otherwise (so a value of
//! one kind reported as another is both a miss and a false detection).

use std::collections::BTreeMap;

use serde::Deserialize;
use tower_agent::layers::pii::PiiEngine;

#[derive(Debug, Deserialize)]
struct Case {
    text: String,
    kind: Option<String>,
    value: Option<String>,
}

fn cases(data: &str) -> Vec<Case> {
    data.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("valid corpus line"))
        .collect()
}

/// Counts of one kind: labelled positives, those recalled, and the
/// detections reported as this kind, right and wrong.
#[derive(Debug, Default)]
struct Counts {
    positives: usize,
    recalled: usize,
    true_det: usize,
    false_det: usize,
}

/// Scores the default engine on `cases`, prints the figures per kind and the
/// misses, and returns the overall recall and precision.
fn score(name: &str, cases: &[Case]) -> (f64, f64) {
    let engine = PiiEngine::default();
    let mut per_kind: BTreeMap<String, Counts> = BTreeMap::new();
    let mut misses = Vec::new();
    let mut false_alarms = Vec::new();
    for case in cases {
        let mut hit = false;
        for d in engine.detect(&case.text) {
            let value = d.value(&case.text);
            let label = d.kind.label().into_owned();
            let right =
                case.kind.as_deref() == Some(&*label) && case.value.as_deref() == Some(value);
            let counts = per_kind.entry(label.clone()).or_default();
            if right {
                hit = true;
                counts.true_det += 1;
            } else {
                counts.false_det += 1;
                false_alarms.push(format!("{label} {value:?} in {:?}", case.text));
            }
        }
        if let Some(kind) = &case.kind {
            let counts = per_kind.entry(kind.clone()).or_default();
            counts.positives += 1;
            if hit {
                counts.recalled += 1;
            } else {
                misses.push(format!(
                    "{kind} {:?} in {:?}",
                    case.value.as_deref().unwrap_or_default(),
                    case.text
                ));
            }
        }
    }
    let positives: usize = per_kind.values().map(|c| c.positives).sum();
    let recalled: usize = per_kind.values().map(|c| c.recalled).sum();
    let true_det: usize = per_kind.values().map(|c| c.true_det).sum();
    let false_det: usize = per_kind.values().map(|c| c.false_det).sum();
    let recall = recalled as f64 / positives.max(1) as f64;
    let precision = true_det as f64 / (true_det + false_det).max(1) as f64;
    println!(
        "{name}: {positives} positives, {} negatives; recall {recall:.4} ({recalled}/{positives}), \
         precision {precision:.4} ({true_det}/{})",
        cases.len() - positives,
        true_det + false_det
    );
    println!(
        "  {:<13} {:>9} {:>6} {:>9} {:>6}",
        "kind", "positives", "recall", "reported", "prec."
    );
    for (kind, c) in &per_kind {
        let reported = c.true_det + c.false_det;
        println!(
            "  {kind:<13} {:>9} {:>6.3} {:>9} {:>6.3}",
            c.positives,
            c.recalled as f64 / c.positives.max(1) as f64,
            reported,
            c.true_det as f64 / reported.max(1) as f64,
        );
    }
    for m in &misses {
        println!("  missed: {m}");
    }
    for f in &false_alarms {
        println!("  false:  {f}");
    }
    (recall, precision)
}

#[test]
fn corpus_recall_and_precision() {
    let cases = cases(include_str!("data/pii_corpus.jsonl"));
    let positives = cases.iter().filter(|c| c.kind.is_some()).count();
    let negatives = cases.len() - positives;
    assert!(
        positives >= 300 && negatives >= 300,
        "{positives} / {negatives}"
    );
    let (recall, precision) = score("PII corpus", &cases);
    assert!(recall >= 0.99, "recall {recall:.4} < 0.99");
    assert!(precision >= 0.95, "precision {precision:.4} < 0.95");
}

#[test]
fn formats_recall_and_precision() {
    let cases = cases(include_str!("data/pii_formats.jsonl"));
    let kinds = |label: &str| {
        cases
            .iter()
            .filter(|c| c.kind.as_deref() == Some(label))
            .count()
    };
    let negatives = cases.iter().filter(|c| c.kind.is_none()).count();
    assert!(
        kinds("PHONE") >= 300 && kinds("MAC") >= 40 && kinds("JWT") >= 20 && negatives >= 90,
        "the formats corpus is smaller than it was generated"
    );
    let (recall, precision) = score("PII formats", &cases);
    assert!(recall >= 0.99, "recall {recall:.4} < 0.99");
    assert!(precision >= 0.95, "precision {precision:.4} < 0.95");
}
