//! Throughput of the PII engine.
//!
//! * `pii_mask_clean/{1KB,64KB,1MB}`: masking English-like prose with no PII
//!   (the common case; target ≥ 200 MB/s). The prose has the occasional
//!   number, time and colon, as real text does.
//! * `pii_mask_dense/{…}`: masking prose with one PII value per sentence.
//! * `pii_stream_restore/deltas`: pushing a masked answer through a
//!   `StreamRestorer` in LLM-sized deltas (2–12 bytes); reported per delta.
//!
//! For instruction counts, which hold still on a busy machine:
//! `BENCH_CASE=layer_pii BENCH_RUNS=1000 valgrind --tool=callgrind
//! target/release/deps/pii-…` calls the PII layer over a model that answers
//! at once, with the short clean message of `benches/layers.rs`, that many
//! times (`layer_bare`: the model alone; `mask_short`: the engine masking
//! that message); the difference between two run counts, divided by the
//! difference in runs, is the instructions per call.

use std::{hint::black_box, sync::Arc};

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use tower::{Layer, Service, ServiceExt};
use tower_agent::layers::pii::{MaskPiiLayer, PiiConfig, PiiSession};
use tower_agent::types::{Message, ModelRequest};
use tower_agent::{ModelCall, RunContext};

#[path = "common/mod.rs"]
mod common;

/// xorshift64*, so the texts are the same on every run without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
}

const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "a",
    "in",
    "is",
    "it",
    "you",
    "that",
    "he",
    "was",
    "for",
    "on",
    "are",
    "with",
    "as",
    "his",
    "they",
    "be",
    "at",
    "one",
    "have",
    "this",
    "from",
    "or",
    "had",
    "by",
    "word",
    "but",
    "what",
    "some",
    "we",
    "can",
    "out",
    "other",
    "were",
    "all",
    "there",
    "when",
    "up",
    "use",
    "your",
    "how",
    "said",
    "an",
    "each",
    "she",
    "which",
    "do",
    "their",
    "time",
    "if",
    "will",
    "way",
    "about",
    "many",
    "then",
    "them",
    "write",
    "would",
    "like",
    "so",
    "these",
    "her",
    "long",
    "make",
    "thing",
    "see",
    "him",
    "two",
    "has",
    "look",
    "more",
    "day",
    "could",
    "go",
    "come",
    "did",
    "number",
    "sound",
    "no",
    "most",
    "people",
    "my",
    "over",
    "know",
    "water",
    "than",
    "call",
    "first",
    "who",
    "may",
    "down",
    "side",
    "been",
    "now",
    "find",
    "report",
    "customer",
    "service",
    "please",
    "summarise",
    "meeting",
    "project",
    "deadline",
    "invoice",
    "attached",
    "schedule",
    "well-known",
    "re-run",
    "e.g.",
    "i.e.",
    "model",
    "agent",
    "request",
    "response",
    "quickly",
    "carefully",
    "although",
    "however",
];

const EXTRAS: &[&str] = &[
    "in 2019",
    "3 times",
    "at 10:30",
    "Note:",
    "(see page 12)",
    "about 40%",
    "version 2",
    "on 2024-03-05",
    "$19.99",
    "step 1:",
    "Q3",
    "24/7",
];

/// One sentence of clean prose.
fn sentence(rng: &mut Rng, out: &mut String) {
    let n = 6 + rng.below(14);
    for i in 0..n {
        let w = if rng.below(30) == 0 {
            rng.pick(EXTRAS)
        } else {
            rng.pick(WORDS)
        };
        if i == 0 {
            let mut c = w.chars();
            if let Some(f) = c.next() {
                out.extend(f.to_uppercase());
                out.push_str(c.as_str());
            }
        } else {
            out.push_str(w);
        }
        out.push(if i + 1 == n {
            '.'
        } else if rng.below(12) == 0 {
            ','
        } else {
            ' '
        });
        if i + 1 < n && out.ends_with(',') {
            out.push(' ');
        }
    }
    out.push(if rng.below(6) == 0 { '\n' } else { ' ' });
}

const PII: &[&str] = &[
    "jane.doe@example.com",
    "ops+alerts@mail.example.org",
    "+44 20 7946 0958",
    "(202) 555-0143",
    "06 12 34 56 78",
    "4111 1111 1111 1111",
    "5555555555554444",
    "GB82 WEST 1234 5698 7654 32",
    "DE89370400440532013000",
    "123-45-6789",
    "192.168.10.25",
    "2001:db8::8a2e:370:7334",
    "aa:bb:cc:dd:ee:ff",
    "AKIAIOSFODNN7EXAMPLE",
    "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
    "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
];

fn text(len: usize, dense: bool, seed: u64) -> String {
    let mut rng = Rng(seed);
    let mut out = String::with_capacity(len + 256);
    while out.len() < len {
        sentence(&mut rng, &mut out);
        if dense {
            out.push_str("Contact ");
            out.push_str(rng.pick(PII));
            out.push_str(" today. ");
        }
    }
    let mut cut = len;
    while !out.is_char_boundary(cut) {
        cut -= 1;
    }
    out.truncate(cut);
    out
}

const SIZES: &[(&str, usize)] = &[("1KB", 1 << 10), ("64KB", 64 << 10), ("1MB", 1 << 20)];

fn bench_mask(c: &mut Criterion) {
    let engine = PiiConfig::new().build();
    for (group_name, dense) in [("pii_mask_clean", false), ("pii_mask_dense", true)] {
        let mut group = c.benchmark_group(group_name);
        for &(name, size) in SIZES {
            let input = text(size, dense, 0x5EED_0000 + size as u64);
            let session = engine.session();
            // Warm the session so the steady state (known values) is measured.
            let masked = session.mask(&input).expect("nothing blocked");
            assert_eq!(dense, masked.len() != input.len() || masked != input);
            group.throughput(Throughput::Bytes(input.len() as u64));
            if size >= 1 << 20 {
                group.sample_size(20);
            }
            group.bench_with_input(BenchmarkId::from_parameter(name), &input, |b, input| {
                b.iter(|| black_box(session.mask(black_box(input)).expect("nothing blocked")))
            });
        }
        group.finish();
    }
}

fn bench_stream_restore(c: &mut Criterion) {
    let session = Arc::new(PiiSession::new(PiiConfig::new().build()));
    let masked = session
        .mask(&text(16 << 10, true, 42))
        .expect("nothing blocked")
        .into_owned();
    // Split like a model's token stream: 2–12 bytes per delta.
    let mut rng = Rng(7);
    let mut deltas = Vec::new();
    let mut i = 0;
    while i < masked.len() {
        let mut j = (i + 2 + rng.below(11)).min(masked.len());
        while !masked.is_char_boundary(j) {
            j += 1;
        }
        deltas.push(&masked[i..j]);
        i = j;
    }
    let mut group = c.benchmark_group("pii_stream_restore");
    group.throughput(Throughput::Elements(deltas.len() as u64));
    group.bench_function("deltas", |b| {
        b.iter(|| {
            let mut r = session.stream_restorer();
            let mut n = 0;
            for d in &deltas {
                n += r.push(black_box(d)).len();
            }
            n += r.finish().len();
            black_box(n)
        })
    });
    group.finish();
}

/// `BENCH_CASE` called `BENCH_RUNS` times, without criterion: for callgrind.
fn counted_runs(case: &str, runs: usize) {
    let model = common::noop_model();
    let call = ModelCall::new(
        ModelRequest::new("bench-model", vec![Message::user("Where is order A-1?")]),
        RunContext::new(),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    match case {
        "layer_pii" => {
            let svc = MaskPiiLayer::default().layer(model);
            rt.block_on(async {
                for _ in 0..runs {
                    let mut svc = svc.clone();
                    black_box(svc.ready().await.unwrap().call(call.clone()).await.unwrap());
                }
            });
        }
        "layer_bare" => rt.block_on(async {
            for _ in 0..runs {
                let mut svc = model.clone();
                black_box(svc.ready().await.unwrap().call(call.clone()).await.unwrap());
            }
        }),
        // The engine alone on that message, as a turn that adds it scans it.
        "mask_short" => {
            let session = PiiConfig::new().build().session();
            for _ in 0..runs {
                black_box(session.mask(black_box("Where is order A-1?")).unwrap());
            }
        }
        other => panic!("BENCH_CASE is layer_pii, layer_bare or mask_short, not {other}"),
    }
}

criterion_group!(benches, bench_mask, bench_stream_restore);

fn main() {
    common::main(counted_runs, benches);
}
