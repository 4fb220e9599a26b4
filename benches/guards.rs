//! Throughput of the heuristic prompt-injection detector on benign text.
//!
//! * `injection_benign/heuristic`: [`HeuristicDetector::scan`] on every
//!   benign text of the labelled corpus (ordinary texts and hard
//!   negatives), one text at a time, as a guard sees inputs and tool
//!   results. Target ≥ 100 MB/s.
//! * `injection_benign/regex_set`: the baseline, a plain `regex::RegexSet`
//!   of twelve common injection phrasings over the same texts, with no
//!   normalisation, decoding or scoring.
//! * `injection_prose/…`: the same two over 64 KiB of ordinary English
//!   prose in one piece (a long retrieved document).
//!
//! For instruction counts, which hold still on a busy machine:
//! `BENCH_CASE=benign BENCH_RUNS=100 valgrind --tool=callgrind
//! target/release/deps/guards-…` scans the benign texts (`prose`: the
//! 64 KiB document; `benign_regex_set`: the baseline over the benign texts)
//! that many times without criterion; the difference
//! between two run counts, divided by the difference in runs and by the
//! bytes of one run, is the instructions per byte.

use std::hint::black_box;

use criterion::{criterion_group, Criterion, Throughput};
use regex::RegexSet;
use tower_agent::lifecycle::builtin::guards::HeuristicDetector;

#[path = "common/mod.rs"]
mod common;

fn benign_texts() -> Vec<String> {
    include_str!("../tests/data/injection_corpus.jsonl")
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            (v["label"] == "benign").then(|| v["text"].as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

fn prose(bytes: usize) -> String {
    const SENTENCES: &[&str] = &[
        "The committee met on Tuesday to review the budget for the coming year.",
        "Most of the discussion was about the new warehouse and its opening date.",
        "Sam asked whether the delivery schedule could move to the second week of March.",
        "The report notes that revenue grew by twelve percent in the northern region.",
        "Please send the final figures to the finance team before the end of the month.",
        "Weather permitting, the summer party will take place in the park near the office.",
        "Our support staff answered most tickets within four hours of their arrival.",
        "The system was upgraded overnight and the previous version was archived.",
    ];
    let mut out = String::with_capacity(bytes + 128);
    let mut i = 0;
    while out.len() < bytes {
        out.push_str(SENTENCES[i % SENTENCES.len()]);
        out.push(' ');
        i = (i * 7 + 3) % SENTENCES.len();
    }
    out
}

fn baseline() -> RegexSet {
    RegexSet::new([
        r"(?i)ignore\s+(all\s+)?(previous|prior|above)\s+instructions",
        r"(?i)disregard\s+(all\s+)?(previous|prior|above)\s+instructions",
        r"(?i)forget\s+(all\s+)?(your|previous)\s+(instructions|rules)",
        r"(?i)(reveal|show|print)\s+(me\s+)?your\s+system\s+prompt",
        r"(?i)developer\s+mode",
        r"(?i)do\s+anything\s+now",
        r"(?i)you\s+are\s+now\s+(DAN|unrestricted|jailbroken)",
        r"<\|im_start\|>|\[INST\]|<<SYS>>",
        r"(?i)</?system>",
        r"(?i)<!--.*?-->",
        r"(?i)send\s+(the\s+)?(conversation|chat history)\s+to\s+https?://",
        r#"(?i)"role"\s*:\s*"system""#,
    ])
    .expect("the baseline compiles")
}

fn bench(c: &mut Criterion) {
    let detector = HeuristicDetector::new();
    let set = baseline();

    let texts = benign_texts();
    let bytes: usize = texts.iter().map(String::len).sum();
    let mut group = c.benchmark_group("injection_benign");
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function("heuristic", |b| {
        b.iter(|| {
            for t in &texts {
                black_box(detector.scan(black_box(t)));
            }
        })
    });
    group.bench_function("regex_set", |b| {
        b.iter(|| {
            for t in &texts {
                black_box(set.is_match(black_box(t)));
            }
        })
    });
    group.finish();

    let doc = prose(64 * 1024);
    let mut group = c.benchmark_group("injection_prose");
    group.throughput(Throughput::Bytes(doc.len() as u64));
    group.bench_function("heuristic/64KiB", |b| {
        b.iter(|| black_box(detector.scan(black_box(&doc))))
    });
    group.bench_function("regex_set/64KiB", |b| {
        b.iter(|| black_box(set.is_match(black_box(&doc))))
    });
    group.finish();
}

/// `BENCH_CASE` scanned `BENCH_RUNS` times, without criterion: for callgrind.
fn counted_runs(case: &str, runs: usize) {
    let detector = HeuristicDetector::new();
    let texts = match case {
        "benign" | "benign_regex_set" => benign_texts(),
        "prose" => vec![prose(64 * 1024)],
        other => panic!("BENCH_CASE is benign, benign_regex_set or prose, not {other}"),
    };
    let bytes: usize = texts.iter().map(String::len).sum();
    if case == "benign_regex_set" {
        let set = baseline();
        for _ in 0..runs {
            for t in &texts {
                black_box(set.is_match(black_box(t)));
            }
        }
        eprintln!("{case}: {runs} runs of {bytes} bytes");
        return;
    }
    for _ in 0..runs {
        for t in &texts {
            black_box(detector.scan(black_box(t)));
        }
    }
    eprintln!("{case}: {runs} runs of {bytes} bytes");
}

criterion_group!(benches, bench);

fn main() {
    common::main(counted_runs, benches);
}
