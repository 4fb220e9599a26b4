//! Quickstart (placeholder until the crate's agent API lands).
fn main() {}
