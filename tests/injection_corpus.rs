//! The heuristic prompt-injection detector against the labelled corpus in
//! `tests/data/injection_corpus.jsonl` (made by `gen_injection_corpus.py`).
//!
//! Asserts recall >= 0.90 on direct and indirect attacks and a
//! false-positive rate <= 2 % on hard negatives; prints precision, recall
//! and F1 per kind (`cargo test --test injection_corpus -- --nocapture`).
#![cfg(feature = "guards")]

use std::collections::BTreeMap;

use serde::Deserialize;
use tower_agent::lifecycle::builtin::guards::HeuristicDetector;

#[derive(Deserialize)]
struct Row {
    text: String,
    label: String,
    kind: String,
    lang: String,
    technique: String,
}

const THRESHOLD: f32 = 0.5;

#[derive(Default)]
struct Tally {
    flagged: usize,
    total: usize,
}

impl Tally {
    fn rate(&self) -> f64 {
        self.flagged as f64 / self.total.max(1) as f64
    }
}

#[test]
fn the_heuristic_detector_meets_its_targets_on_the_corpus() {
    let rows: Vec<Row> = include_str!("data/injection_corpus.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a corpus line"))
        .collect();
    assert!(rows.iter().filter(|r| r.label == "attack").count() >= 400);
    assert!(rows.iter().filter(|r| r.label == "benign").count() >= 400);
    assert!(rows.iter().filter(|r| r.kind == "hard_negative").count() >= 150);

    let detector = HeuristicDetector::new();
    let mut by_kind: BTreeMap<String, Tally> = BTreeMap::new();
    let mut by_detail: BTreeMap<String, Tally> = BTreeMap::new();
    let mut misses = Vec::new();
    for row in &rows {
        let flagged = detector.scan(&row.text).score >= THRESHOLD;
        for (map, key) in [
            (&mut by_kind, row.kind.clone()),
            (
                &mut by_detail,
                format!("{}/{}/{}", row.label, row.lang, row.technique),
            ),
        ] {
            let t = map.entry(key).or_default();
            t.total += 1;
            t.flagged += usize::from(flagged);
        }
        if flagged != (row.label == "attack") {
            misses.push(format!("[{}] {}", row.kind, row.text.replace('\n', "\\n")));
        }
    }

    let false_positives: usize = ["benign", "hard_negative"]
        .iter()
        .map(|k| by_kind.get(*k).map_or(0, |t| t.flagged))
        .sum();
    println!("kind           n   recall precision    F1   (benign kinds: false-positive rate)");
    for (kind, t) in &by_kind {
        if kind == "benign" || kind == "hard_negative" {
            println!("{kind:<13} {:>3}   FPR {:.3}", t.total, t.rate());
        } else {
            let recall = t.rate();
            let precision = t.flagged as f64 / (t.flagged + false_positives).max(1) as f64;
            let f1 = 2.0 * precision * recall / (precision + recall).max(f64::EPSILON);
            println!(
                "{kind:<13} {:>3}   {recall:.3}    {precision:.3}    {f1:.3}",
                t.total
            );
        }
    }
    let attacks: Vec<&Tally> = by_kind
        .iter()
        .filter(|(k, _)| *k != "benign" && *k != "hard_negative")
        .map(|(_, t)| t)
        .collect();
    let (tp, n) = attacks
        .iter()
        .fold((0, 0), |(a, b), t| (a + t.flagged, b + t.total));
    let recall = tp as f64 / n as f64;
    let precision = tp as f64 / (tp + false_positives) as f64;
    println!(
        "all attacks   {n:>3}   {recall:.3}    {precision:.3}    {:.3}",
        2.0 * precision * recall / (precision + recall)
    );
    println!("\nby label/lang/technique (rate flagged):");
    for (key, t) in &by_detail {
        println!("  {key:<40} {:>3}  {:.3}", t.total, t.rate());
    }
    println!("\nmisclassified:");
    for m in &misses {
        println!("  {m}");
    }

    for kind in ["direct", "indirect"] {
        let recall = by_kind[kind].rate();
        assert!(recall >= 0.90, "recall on {kind} is {recall:.3}");
    }
    let fpr = by_kind["hard_negative"].rate();
    assert!(
        fpr <= 0.02,
        "false-positive rate on hard negatives is {fpr:.3}"
    );
}
