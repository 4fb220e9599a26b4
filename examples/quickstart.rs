//! Placeholder until the quickstart lands.
fn main() {}
