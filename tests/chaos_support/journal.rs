//! aimock's request journal (`GET /__aimock/journal`), read back per run:
//! what each attempt that reached the mock got, and the usage it reported.

use std::collections::HashMap;

use serde_json::Value;
use tower_agent::types::Usage;

/// What the mock did with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// `dropRate`: a 500.
    Drop,
    /// `malformedRate`: a 200 whose body is not JSON.
    Malformed,
    /// `rateLimitRate`: a 429 with `Retry-After`.
    RateLimit,
    /// `disconnectRate`: the connection closed before an answer.
    Disconnect,
    /// The stream was cut after its first chunks (`truncateAfterChunks`).
    Cut,
    /// Any other status (a fixture miss would be a 503).
    Status(u16),
}

impl Fault {
    pub fn name(self) -> String {
        match self {
            Fault::Drop => "500".into(),
            Fault::Malformed => "malformed JSON".into(),
            Fault::RateLimit => "429 + Retry-After".into(),
            Fault::Disconnect => "disconnect".into(),
            Fault::Cut => "stream cut mid-way".into(),
            Fault::Status(status) => format!("status {status}"),
        }
    }
}

/// One request the mock journalled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The model asked for.
    pub model: String,
    /// The usage of an answer that went out whole, or the fault.
    pub outcome: Result<Usage, Fault>,
}

/// Every chat-completions request of the test ids starting with `prefix`,
/// by test id, in the order the mock received them.
pub async fn by_test_id(base_url: &str, prefix: &str) -> HashMap<String, Vec<Attempt>> {
    let root = base_url.trim_end_matches('/').trim_end_matches("/v1");
    let client = reqwest::Client::new();
    let mut runs: HashMap<String, Vec<Attempt>> = HashMap::new();
    let page = 5_000;
    let mut offset = 0;
    loop {
        let url =
            format!("{root}/__aimock/journal?path=/chat/completions&limit={page}&offset={offset}");
        let entries: Vec<Value> = client
            .get(&url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .unwrap_or_else(|e| panic!("GET {url}: {e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: not a journal: {e}"));
        let n = entries.len();
        for entry in entries {
            let Some(id) = entry["headers"]["x-test-id"].as_str() else {
                continue;
            };
            if id.starts_with(prefix) {
                runs.entry(id.to_owned()).or_default().push(attempt(&entry));
            }
        }
        if n < page {
            return runs;
        }
        offset += n;
    }
}

fn attempt(entry: &Value) -> Attempt {
    let response = &entry["response"];
    let status = response["status"].as_u64().unwrap_or(0) as u16;
    let outcome = match response["chaosAction"].as_str() {
        Some("drop") => Err(Fault::Drop),
        Some("malformed") => Err(Fault::Malformed),
        Some("rateLimit") => Err(Fault::RateLimit),
        Some("disconnect") => Err(Fault::Disconnect),
        Some(other) => panic!("an unknown chaos action {other:?}: {entry}"),
        None if response["interrupted"].as_bool() == Some(true) => Err(Fault::Cut),
        None if status == 200 => {
            let usage = &response["fixture"]["response"]["usage"];
            Ok(Usage::new(
                usage["prompt_tokens"]
                    .as_u64()
                    .expect("the fixture has usage"),
                usage["completion_tokens"]
                    .as_u64()
                    .expect("the fixture has usage"),
            ))
        }
        None => Err(Fault::Status(status)),
    };
    Attempt {
        model: entry["body"]["model"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        outcome,
    }
}
