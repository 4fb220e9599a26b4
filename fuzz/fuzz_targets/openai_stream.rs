//! Any bytes, cut into chunks anywhere, through the chat-completions stream
//! decoder: no panic, the same outcome whatever the chunking, and deltas that
//! add up to the answer.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tower_agent::service::openai::fuzz_openai_stream(data);
});
