//! Token counting: MB/s of each counter on the same text, prose and one
//! long word (the cheap
//! estimate is the floor, `tiktoken-rs` the reference the BPE counter was
//! chosen against), and the cost of one turn's count at 1 and 10,000
//! messages through a `TokenTally` (target: a ratio of at most 1.2).
//!
//! Each turn continues one long-lived thread: two messages are appended, the
//! tally counts, and the thread is truncated back to its length (keeping its
//! digests), as a server keeping the thread in memory would.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tower_agent::tokens::{BpeCounter, EstimateCounter, TokenCounter, TokenTally};
use tower_agent::types::{History, Message};

/// About 64 KB of English prose and code, as a thread holds.
fn text() -> String {
    let para = "The order A-1 shipped on Monday from the warehouse in Leeds; the \
        customer asked twice where it was, and the agent looked it up with the \
        `order_status` tool, which answered {\"id\": \"A-1\", \"status\": \"shipped\"}. \
        fn main() { println!(\"{}\", 2 + 3); } // prints 5\n";
    para.repeat(65_536 / para.len() + 1)
}

fn throughput(c: &mut Criterion) {
    count_group(c, "tokens_count_64kb_prose", &text());
    // One 16 KB word: byte-pair merging within one piece is where a
    // tokenizer's worst case shows.
    count_group(c, "tokens_count_16kb_one_word", &"a".repeat(16_384));
}

fn count_group(c: &mut Criterion, name: &str, text: &str) {
    let text = black_box(text);
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Bytes(text.len() as u64));
    let estimate = EstimateCounter::new();
    group.bench_function("estimate", |b| b.iter(|| estimate.count(black_box(text))));
    let o200k = BpeCounter::o200k_base();
    group.bench_function("bpe_openai_o200k", |b| b.iter(|| o200k.count(text)));
    let cl100k = BpeCounter::cl100k_base();
    group.bench_function("bpe_openai_cl100k", |b| b.iter(|| cl100k.count(text)));
    let tiktoken = tiktoken_rs::o200k_base().unwrap();
    assert_eq!(tiktoken.encode_ordinary(text).len(), o200k.count(text));
    group.bench_function("tiktoken_rs_o200k", |b| {
        b.iter(|| tiktoken.encode_ordinary(text).len())
    });
    group.finish();
}

fn thread(len: usize) -> History {
    let messages: Vec<Message> = (0..len)
        .map(|i| match i {
            0 => Message::system("You answer briefly."),
            i if i % 2 == 1 => Message::user(format!("question {i} about the order")),
            i => Message::assistant(format!("answer {i}: it shipped")),
        })
        .collect();
    History::from(messages)
}

fn per_turn(c: &mut Criterion) {
    let mut group = c.benchmark_group("tokens_one_turn_by_history_length");
    for len in [1usize, 10_000] {
        let tally = TokenTally::new(Arc::new(BpeCounter::o200k_base()));
        let mut history = thread(len);
        tally.count(&history);
        group.bench_with_input(BenchmarkId::from_parameter(len), &len, |b, &len| {
            b.iter(|| {
                history.push(Message::user("and now, where is it?"));
                history.push(Message::assistant("It is on its way."));
                let tokens = tally.count(&history);
                history.truncate(len);
                tokens
            })
        });
    }
    group.finish();
}

criterion_group!(benches, throughput, per_turn);
criterion_main!(benches);
